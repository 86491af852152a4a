"""First-order roofline estimate of the time of one training iteration (not a simulator).

``count_iteration(model, inputs, targets, loss_fn)`` runs one forward and backward pass on a copy of the
model and returns an ``IterationCost``:

- ``flops``: what ``torch.utils.flop_counter.FlopCounterMode`` counts for forward + backward: matmul,
  convolution and attention ops at 2 FLOPs per multiply-add. Elementwise ops, normalisation and the
  optimizer step are not counted (they are memory-bound, and enter through the bytes term).
- ``param_elements`` (P): parameter elements; ``activation_elements`` (A): elements of every tensor that a
  non-view aten op writes during the forward pass (loss included); ``input_elements`` (I): the batch.

Bytes moved by one iteration, at a storage width of ``w`` bits (``IterationCost.bytes``), count every tensor
once per write and once per read, with no cache reuse and no fusion:
``(5*P + 5*A + I) * w / 8``, where 5*P = weights read in forward and in backward, weight gradients written
and read by the optimizer, weights written back; 5*A = activations written and read in forward, activation
gradients written and read in backward, saved activations read again in backward. Optimizer state is not
counted.

``Hardware`` is a small description (peak FLOP/s per operand width in bits, memory bandwidth in bytes/s),
read from YAML (``experiments/conf/hardware/*.yaml``). A format of ``b`` bits runs in the hardware's width
class: the smallest listed width >= b (fp6 and fp4 run at the fp8 rate on a machine that lists 32/16/8).
The width class sets both the peak rate and the bytes per element. The roofline time of one iteration is
``max(flops / peak(width), bytes(width) / bandwidth)`` (``Hardware.roofline``): the whole iteration is
treated as one kernel, so compute and memory time overlap perfectly and per-op bounds are ignored. It is a
first-order, optimistic estimate; use a simulator's per-iteration times (``emunum tta --sim``) when you
have them.
"""
from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

#: element traffic of one iteration per parameter, activation and input element (see the module docstring)
PARAM_TRAFFIC = 5
ACTIVATION_TRAFFIC = 5
INPUT_TRAFFIC = 1


@dataclass(frozen=True)
class IterationCost:
    """Work of one training iteration: FLOPs (FlopCounterMode) and element counts (see module docstring)."""

    flops: int
    param_elements: int
    activation_elements: int
    input_elements: int

    @property
    def traffic_elements(self) -> int:
        """Elements moved to or from memory in one iteration: 5*P + 5*A + I."""
        return (PARAM_TRAFFIC * self.param_elements + ACTIVATION_TRAFFIC * self.activation_elements
                + INPUT_TRAFFIC * self.input_elements)

    def bytes(self, width_bits: int) -> float:
        """Bytes moved in one iteration when every element is stored in ``width_bits`` bits."""
        return self.traffic_elements * width_bits / 8


class _WrittenElements(TorchDispatchMode):
    """Sums the elements of the tensors written by non-view aten ops."""

    def __init__(self):
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.elements += t.numel()
        return out


def count_iteration(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor | None = None,
                    loss_fn=None) -> IterationCost:
    """FLOPs and element counts of one training iteration (forward, loss, backward) of ``model`` on the batch
    ``inputs``. ``loss_fn(output, targets)`` defaults to cross-entropy (``targets`` None: the sum of the
    output). Runs on a deep copy in training mode, so the caller's model (weights, gradients, batch-norm
    statistics) is untouched."""
    from torch.utils.flop_counter import FlopCounterMode

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(inputs, torch.Tensor):
        raise TypeError(f"inputs must be a torch.Tensor, got {type(inputs).__name__}")
    m = copy.deepcopy(model).train()
    for p in m.parameters():
        p.grad = None
    if loss_fn is None:
        loss_fn = torch.nn.functional.cross_entropy if targets is not None else (lambda out, _t: out.sum())
    written = _WrittenElements()
    with torch.enable_grad(), FlopCounterMode(display=False) as counter:
        with written:
            loss = loss_fn(m(inputs), targets)
        loss.backward()
    params = sum(p.numel() for p in m.parameters() if p.requires_grad)
    return IterationCost(int(counter.get_total_flops()), int(params), int(written.elements), int(inputs.numel()))


@dataclass(frozen=True)
class Roofline:
    """Roofline time of one iteration: ``seconds = max(compute_seconds, memory_seconds)``."""

    width: int  # the hardware width class the format runs in (bits)
    compute_seconds: float
    memory_seconds: float

    @property
    def seconds(self) -> float:
        return max(self.compute_seconds, self.memory_seconds)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_seconds >= self.memory_seconds else "memory"


def _positive(field: str, value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{where}: {field}={value!r} must be a positive finite number")
    return float(value)


@dataclass(frozen=True)
class Hardware:
    """Peak FLOP/s per operand width (bits), and memory bandwidth (bytes/s). First-order: see module doc."""

    name: str
    peak_flops: tuple[tuple[int, float], ...]  # ((width bits, FLOP/s), ...), widths ascending
    memory_bandwidth: float
    source: str = ""

    def __post_init__(self):
        if not self.peak_flops:
            raise ValueError(f"hardware {self.name!r}: peak_flops is empty; allowed: a mapping width_bits -> FLOP/s")
        widths = [w for w, _ in self.peak_flops]
        if widths != sorted(set(widths)):
            raise ValueError(f"hardware {self.name!r}: peak_flops widths {widths} must be distinct and ascending")

    @classmethod
    def from_dict(cls, d: dict, where: str = "hardware") -> "Hardware":
        """From a mapping with keys ``name``, ``peak_flops`` ({width_bits: FLOP/s}), ``memory_bandwidth``
        (bytes/s) and optionally ``source``; unknown keys raise ValueError."""
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected a mapping with name, peak_flops, memory_bandwidth; got {d!r}")
        allowed = {"name", "peak_flops", "memory_bandwidth", "source"}
        extra = sorted(set(d) - allowed)
        if extra:
            raise ValueError(f"{where}: unknown key(s) {extra}; allowed: {sorted(allowed)}")
        for k in ("peak_flops", "memory_bandwidth"):
            if k not in d:
                raise ValueError(f"{where}: missing key {k!r}")
        peaks = d["peak_flops"]
        if not isinstance(peaks, dict) or not peaks:
            raise ValueError(f"{where}: peak_flops={peaks!r} must be a non-empty mapping width_bits -> FLOP/s")
        table = []
        for w, v in peaks.items():
            if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= 64:
                raise ValueError(f"{where}: peak_flops width {w!r} must be an int number of bits in 1..64")
            table.append((w, _positive(f"peak_flops[{w}]", v, where)))
        return cls(name=str(d.get("name", where)), peak_flops=tuple(sorted(table)),
                   memory_bandwidth=_positive("memory_bandwidth", d["memory_bandwidth"], where),
                   source=str(d.get("source", "")))

    @classmethod
    def load(cls, name_or_path: str, search: list[Path] | None = None) -> "Hardware":
        """A YAML file: a path, or a name looked up as ``<name>.yaml`` in ``search`` (default:
        ``./experiments/conf/hardware`` and the ``experiments/conf/hardware`` of this checkout)."""
        import yaml

        p = Path(name_or_path)
        dirs = search if search is not None else hardware_dirs()
        if p.suffix in (".yaml", ".yml") or p.exists():
            path = p
        else:
            cands = [d / f"{name_or_path}.yaml" for d in dirs]
            path = next((c for c in cands if c.is_file()), None)
            if path is None:
                known = sorted({f.stem for d in dirs if d.is_dir() for f in d.glob("*.yaml")})
                raise ValueError(f"hardware={name_or_path!r} is not a file nor a known description; known: "
                                 f"{', '.join(known) or '(none)'} (searched {', '.join(str(d) for d in dirs)})")
        if not os.path.lexists(path):
            raise ValueError(f"hardware={str(name_or_path)!r}: no such file {path}")
        from . import files

        try:
            d = yaml.safe_load(files.read_text(path))
            return cls.from_dict(d, where=str(path))
        except (ValueError, RecursionError, OverflowError, MemoryError, OSError, yaml.YAMLError) as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            if str(path) in msg:
                raise ValueError(msg) from None
            raise ValueError(f"hardware {str(path)!r}: {type(e).__name__}: {msg[:200]}") from None

    def width_class(self, bits: int) -> int:
        """The smallest listed width >= ``bits``; ValueError if ``bits`` exceeds every listed width."""
        for w, _ in self.peak_flops:
            if w >= bits:
                return w
        raise ValueError(f"a {bits}-bit format is wider than every width of hardware {self.name!r} "
                         f"({', '.join(str(w) for w, _ in self.peak_flops)} bits)")

    def peak(self, bits: int) -> float:
        """Peak FLOP/s of the width class of a ``bits``-bit format."""
        return dict(self.peak_flops)[self.width_class(bits)]

    def roofline(self, cost: IterationCost, bits: int) -> Roofline:
        """max(flops / peak(width), bytes(width) / bandwidth) for a ``bits``-bit format (module doc)."""
        w = self.width_class(bits)
        return Roofline(w, cost.flops / dict(self.peak_flops)[w], cost.bytes(w) / self.memory_bandwidth)


def hardware_dirs() -> list[Path]:
    """Where ``Hardware.load`` looks for ``<name>.yaml``: ./experiments/conf/hardware, then this checkout's."""
    here = Path(__file__).resolve().parents[2] / "experiments" / "conf" / "hardware"
    cwd = Path.cwd() / "experiments" / "conf" / "hardware"
    return [cwd] if cwd.resolve() == here else [cwd, here]
