"""The module factories of a policy: ``Factories`` (``approx``: activations replaced by approximate
operators) and ``ApproxSpec``, the factory of ``emunum.approx`` modules."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch import nn


ActivationFactory = Callable[[nn.Module, Any], nn.Module]  # factory(module, policy)

_APPROX_TYPES = {"tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "softmax": nn.Softmax}


@dataclass(frozen=True)
class ApproxSpec:
    """A factory of ``emunum.approx`` modules (compared by value): ``kind`` is tanh, sigmoid or softmax;
    ``options`` the module's keyword arguments as sorted (name, value) pairs. The approximation computes in
    ``options['fmt']`` if given, else in the policy's output format (fp32 if none), with the output
    role's rounding unless ``options['rounding']`` says otherwise. The output role's scaling does not apply
    (an approximate operator computes in its format's range)."""

    kind: str
    options: tuple = ()

    def __call__(self, module: nn.Module, policy) -> nn.Module:
        from . import approx  # noqa: PLC0415  (approx sits above policy's imports; loaded when used)

        opts = dict(self.options)
        out = policy.output
        opts.setdefault("fmt", out.fmt if out is not None else "fp32")
        if out is not None:
            opts.setdefault("rounding", out.rounding)
        if self.kind == "softmax":
            if module.dim is None:
                raise ValueError("approx softmax: nn.Softmax(dim=None) has no explicit dim; give the model "
                                 "nn.Softmax(dim=...) or exclude it")
            return approx.Softmax(dim=module.dim, **opts)
        return {"tanh": approx.Tanh, "sigmoid": approx.Sigmoid}[self.kind](**opts)

    def validate(self, field: str) -> None:
        """Build the operator once (in its own format, fp32 if none) so that an unknown method or option is
        an error of ``Policy.make``/``patch``, naming ``field``, whether or not the model has such a layer."""
        from . import approx  # noqa: PLC0415

        opts = dict(self.options)
        opts.setdefault("fmt", "fp32")
        try:
            if self.kind == "softmax":
                approx.Softmax(dim=-1, **opts)
            else:
                {"tanh": approx.Tanh, "sigmoid": approx.Sigmoid}[self.kind](**opts)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{field}: {e}") from None


def _approx_entry(key, value):
    """One approx item -> (module type, factory)."""
    if isinstance(key, str):
        k = key.strip().lower()
        if k not in _APPROX_TYPES:
            raise ValueError(f"approx key {key!r} is not a known activation; allowed names: "
                             f"{', '.join(_APPROX_TYPES)}, or an nn.Module subclass")
        key = _APPROX_TYPES[k]
    if not (isinstance(key, type) and issubclass(key, nn.Module)):
        raise TypeError(f"approx key {key!r} must be an activation name or an nn.Module subclass (e.g. nn.Tanh)")
    if isinstance(value, (str, dict)):
        kinds = {t: n for n, t in _APPROX_TYPES.items()}
        if key not in kinds:
            raise ValueError(f"approx[{key.__name__}]={value!r}: a method name or options need an "
                             f"emunum.approx operator, which exists for {', '.join(t.__name__ for t in kinds)}; "
                             "give a factory(module, policy) instead")
        kind = kinds[key]
        if isinstance(value, str):
            value = {"exp2" if kind == "softmax" else "method": value}
        if not all(isinstance(n, str) for n in value):
            raise TypeError(f"approx[{key.__name__}] options must have str keys, got {list(value)!r}")
        spec = ApproxSpec(kind, tuple(sorted(value.items())))
        spec.validate(f"approx[{key.__name__}]={value!r}")
        return key, spec
    if not callable(value):
        raise TypeError(f"approx[{key.__name__}]={value!r} must be a method name, a dict of options, or a "
                        "factory(module, policy) -> nn.Module")
    return key, value


def approx_table(value) -> tuple:
    """{activation type or name: method name | options dict | factory} -> ((type, factory), ...)."""
    if value is None or value == ():
        return ()
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, tuple) and all(isinstance(i, tuple) and len(i) == 2 for i in value):
        items = list(value)
    else:
        raise TypeError(f"approx must be a dict {{activation: method | options | factory}}, got {value!r}")
    table = dict(_approx_entry(k, v) for k, v in items)
    return tuple(table.items())


@dataclass(frozen=True)
class Factories:
    """Modules a policy builds instead of rounding them: ``approx``, ``{activation: spec}`` as a table of
    (module type, factory) pairs (see ``Policy``)."""

    approx: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "approx", approx_table(self.approx))
