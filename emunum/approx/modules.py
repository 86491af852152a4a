"""``nn.Module`` wrappers, built once (method, format and constants parsed in ``__init__``) so that
``emunum.patch()`` can drop them into a model and ``torch.compile`` sees only tensor code in ``forward``."""
from __future__ import annotations

from torch import Tensor, nn

from ..quantize import check_seed, check_sr_bits
from ..formats import RoundMode
from .base import apply, check_grad, method_class
from .softmax_method import SoftmaxDatapath


class _ApproxModule(nn.Module):
    FUNCTION = ""

    def __init__(self, method, fmt, rounding, grad, seed, sr_bits, params):
        super().__init__()
        self.method = method_class(self.FUNCTION, method)(fmt, **params)
        self.rounding = RoundMode.parse(rounding)
        self.grad = check_grad(self.method, grad)
        self.seed = check_seed(seed)
        self.sr_bits = check_sr_bits(sr_bits)

    def forward(self, x: Tensor) -> Tensor:
        return apply(self.method, x, self.rounding, self.grad, self.seed, self.sr_bits, self.FUNCTION)

    def extra_repr(self) -> str:
        ps = "".join(f", {k}={v!r}" for k, v in self.method.params.items())
        seed = "" if self.seed is None else f", seed={self.seed}"
        return (f"method={self.method.NAME}, fmt={self.method.fmt.name}, rounding={self.rounding.name.lower()}, "
                f"grad={self.grad.value}{seed}{ps}")


class Tanh(_ApproxModule):
    """Approximate tanh: ``Tanh(method="pwl", fmt="fp32", rounding="nearest", grad="approx", **params)``.

    Methods: hard, pwl, lut, rational, poly, sigmoid (see ``emunum.approx.tanh_methods`` and ``piecewise``)."""

    FUNCTION = "tanh"

    def __init__(self, method="pwl", fmt="fp32", rounding="nearest", grad="approx", *, seed=None, sr_bits=None,
                 **params):
        super().__init__(method, fmt, rounding, grad, seed, sr_bits, params)


class Sigmoid(_ApproxModule):
    """Approximate sigmoid: ``Sigmoid(method="plan", fmt="fp32", rounding="nearest", grad="approx", **params)``.

    Methods: plan, hard, pwl, lut, exp2 (see ``emunum.approx.sigmoid_methods`` and ``piecewise``)."""

    FUNCTION = "sigmoid"

    def __init__(self, method="plan", fmt="fp32", rounding="nearest", grad="approx", *, seed=None, sr_bits=None,
                 **params):
        super().__init__(method, fmt, rounding, grad, seed, sr_bits, params)


class Softmax(nn.Module):
    """exp2-based softmax along ``dim``: ``Softmax(dim=-1, exp2="poly", fmt="fp32", rounding="nearest",
    grad="approx", **exp2_params)`` (see ``emunum.approx.softmax_method``)."""

    def __init__(self, dim: int = -1, exp2="poly", fmt="fp32", rounding="nearest", grad="approx", *, seed=None,
                 sr_bits=None, **params):
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"dim must be an int, got {dim!r}")
        self.dim = dim
        self.method = SoftmaxDatapath(method_class("exp2", exp2)(fmt, **params))
        self.rounding = RoundMode.parse(rounding)
        self.grad = check_grad(self.method, grad)
        self.seed = check_seed(seed)
        self.sr_bits = check_sr_bits(sr_bits)

    def forward(self, x: Tensor) -> Tensor:
        return apply(self.method, x, self.rounding, self.grad, self.seed, self.sr_bits, "softmax", self.dim)

    def extra_repr(self) -> str:
        ps = "".join(f", {k}={v!r}" for k, v in self.method.exp2.params.items())
        return (f"dim={self.dim}, exp2={self.method.exp2.NAME}, fmt={self.method.fmt.name}, "
                f"rounding={self.rounding.name.lower()}, grad={self.grad.value}{ps}")
