"""Turn a ``format/`` recipe into objects: the emulated model (``emunum.patch``), the optimizer (wrapped in
``emunum.OptimLP`` when the recipe rounds weights, gradients or optimizer state) and the loss scaler."""
from __future__ import annotations

import torch
from omegaconf import OmegaConf

import emunum
from emunum.optim import LossScaler, OptimLP, derive_seed

from .schema import LossScaleMode, Scaling

# derive_seed streams of one run (the first counter after cfg.seed)
STREAM_INIT, STREAM_DATA, STREAM_OPTIM, STREAM_STEP = 0, 1, 2, 3


ROLE_KEYS = ("weight", "input", "output", "grad_weight", "grad_input", "grad_output")


def multiplier(m, operand_fmt):
    """``format.mad.multiplier`` (+ ``multiplier_bits``) as an ``emunum.mad.Multiplier`` (None: exact)."""
    from emunum.mad import Multiplier

    name = getattr(m, "multiplier", None)
    bits = getattr(m, "multiplier_bits", None)
    if name is None or str(name).lower() in ("exact", "mitchell"):
        if bits is not None:
            raise ValueError(f"format.mad.multiplier_bits={bits} applies to truncated and drum only, not {name}")
        return Multiplier.parse(name, "format.mad.multiplier")
    kind = str(name).lower()
    if kind not in ("truncated", "drum"):
        raise ValueError(f"format.mad.multiplier={name!r} is not a multiplier; allowed: exact, mitchell, truncated, drum")
    if bits is None:
        raise ValueError(f"format.mad.multiplier={name} needs format.mad.multiplier_bits (truncated: t fraction bits "
                         "kept; drum: k bits)")
    return Multiplier.truncated(int(bits)) if kind == "truncated" else Multiplier.drum(int(bits), operand_fmt)


def policy_kwargs(fcfg, mad: str | None = None) -> dict:
    """The keyword arguments of ``emunum.patch`` besides ``fmt``: ``format.policy`` plus the MAD unit and
    ``format.scaling`` (as ``scaling=``: per-tensor power-of-two scaling of every rounded tensor, forward and
    gradient, unless ``format.policy.grad_scaling`` says otherwise; see ``emunum.policy.Scaling``)."""
    policy = OmegaConf.to_container(fcfg.policy, resolve=True) if OmegaConf.is_config(fcfg.policy) else dict(fcfg.policy)
    for k in ROLE_KEYS:
        if isinstance(policy.get(k), list):
            policy[k] = tuple(policy[k])
    if "exclude" in policy:
        policy["filter"] = _exclude_filter(policy.pop("exclude"))
    if mad is not None:  # a preset name (top-level ``mad=``) replaces format.mad; Policy resolves it
        policy.pop("mad", None)
        policy["mad"] = mad
    elif fcfg.mad is not None:
        if "mad" in policy:
            raise ValueError("give the MAD unit once: format.mad or format.policy.mad, not both")
        from emunum.mad import MADUnit

        m = fcfg.mad
        fields = {k: m[k] for k in m if k not in ("multiplier", "multiplier_bits")}
        policy["mad"] = MADUnit(**fields, multiplier=multiplier(m, fcfg.fmt))
    scaling = Scaling(fcfg.scaling)
    if scaling != Scaling.none:
        if "scaling" in policy:
            raise ValueError("give the scaling once: format.scaling or format.policy.scaling, not both")
        policy["scaling"] = scaling.value  # every role (Policy.make: grad_scaling defaults to scaling)
    return policy


def _exclude_filter(names):
    """``format.policy.exclude: [Embedding, ...]``: torch.nn layer types left unemulated, as an emunum.patch
    filter (the YAML form of ``filter=``)."""
    if isinstance(names, str) or not isinstance(names, (list, tuple)):
        raise ValueError(f"format.policy.exclude={names!r}: allowed: a list of torch.nn layer names, e.g. [Embedding]")
    types = []
    for n in names:
        t = getattr(torch.nn, str(n), None)
        if not (isinstance(t, type) and issubclass(t, torch.nn.Module)):
            raise ValueError(f"format.policy.exclude: {n!r} is not a torch.nn layer; allowed: names such as "
                             "Embedding, MultiheadAttention, Conv2d")
        types.append(t)
    types = tuple(types)
    return lambda module, name: not isinstance(module, types)


def apply_format(model: torch.nn.Module, fcfg, mad: str | None = None) -> torch.nn.Module:
    """``emunum.patch(model, fmt=fcfg.fmt, **policy_kwargs(fcfg))``; fp32 (fmt null) returns the model as is."""
    if fcfg.fmt is None:
        if fcfg.policy or fcfg.mad is not None or Scaling(fcfg.scaling) != Scaling.none:
            raise ValueError("format.policy, format.mad and format.scaling need format.fmt; fmt=null means plain fp32")
        return model
    emunum.get_format(fcfg.fmt)  # a bad name fails here, naming the known formats
    return emunum.patch(model, fmt=fcfg.fmt, **policy_kwargs(fcfg, mad))


def make_optimizer(model: torch.nn.Module, cfg) -> torch.optim.Optimizer:
    o = cfg.optim
    params = [p for p in model.parameters() if p.requires_grad]
    if o.name == "sgd":
        base = torch.optim.SGD(params, lr=cfg.lr, momentum=o.momentum, nesterov=o.nesterov,
                               weight_decay=o.weight_decay)
    elif o.name == "adam":
        base = torch.optim.Adam(params, lr=cfg.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                                weight_decay=o.weight_decay)
    else:
        raise ValueError(f"optim.name={o.name!r} is not an optimizer; allowed: sgd, adam")
    lp = cfg.format.optim
    if all(getattr(lp, k) is None for k in ("weight", "grad", "momentum", "second_moment")):
        return base
    opt = OptimLP(base, weight=lp.weight, weight_rounding=lp.weight_rounding, grad=lp.grad,
                  grad_rounding=lp.grad_rounding, momentum=lp.momentum, momentum_rounding=lp.momentum_rounding,
                  second_moment=lp.second_moment, second_moment_rounding=lp.second_moment_rounding,
                  seed=derive_seed(int(cfg.seed), STREAM_OPTIM))
    opt.quantize_parameters_()
    return opt


def make_scaler(lcfg) -> LossScaler | None:
    mode = LossScaleMode(lcfg.mode) if not isinstance(lcfg.mode, LossScaleMode) else lcfg.mode
    if mode == LossScaleMode.none:
        return None
    return LossScaler(float(lcfg.init_scale), dynamic=mode == LossScaleMode.dynamic,
                      growth_factor=float(lcfg.growth_factor), backoff_factor=float(lcfg.backoff_factor),
                      growth_interval=int(lcfg.growth_interval))
