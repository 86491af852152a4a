"""Reading experiment results (not numerics): sweep reports (``report``), divide-and-conquer time-to-accuracy
(``tta``) and FLOP-count roofline estimates (``flops``). The ``emunum report`` / ``emunum tta`` commands use
them; nothing here is imported by ``import emunum``."""
