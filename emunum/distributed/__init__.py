"""Scale-out: DDP communication hooks that emulate a low-precision gradient all-reduce, and their
single-process reference.

    hook = emunum.distributed.quantized_allreduce_hook("e5m2", "stochastic", seed=0, ring=True)
    ddp.register_comm_hook(None, hook)
"""
from .hook import QuantizedAllreduce, quantized_allreduce_hook
from .reference import reference_allreduce
from .spec import CommScaling, CommSpec, pow2_scale

__all__ = ["quantized_allreduce_hook", "QuantizedAllreduce", "reference_allreduce", "CommSpec", "CommScaling",
           "pow2_scale"]
