"""``emunum.patch(model, fmt=..., **policy)``: emulate a model without editing it, by swapping its layers.

``patch`` walks the module tree in ``named_modules`` order and replaces every layer whose type has an
emulation (a registry keyed on module type, extensible with ``register``) by its emulated twin, in the
parent's ``_modules``; nothing outside the model changes (no torch function is rewritten). The twin shares
the original's Parameters, buffers, submodules and hooks, so optimizers built before the patch keep working
and ``state_dict`` keys are unchanged. ``unpatch`` puts the original module objects back (copying back
attributes changed meanwhile, such as ``training``), after which the model computes bit for bit what it did
before. ``with emunum.patched(model, ...):`` does both.

Rules:
- A layer's children are left to its emulation (``MultiheadAttention`` emulates its ``out_proj``).
- A subclass of a registered type is emulated by that type's entry only if it keeps that type's ``forward``;
  one that overrides ``forward`` (or a module whose instance has a ``forward`` attribute) is skipped with a
  warning (``register`` its type to emulate it).
- Patching a patched model with an equal policy patches only what is not patched yet (usually nothing);
  with another policy it raises ValueError.
- If the model itself is a registered layer it cannot be swapped in a parent: ``patch`` returns the twin
  (use the returned value), and ``unpatch(twin)`` returns the original.
- Block formats (MX, NVFP4) are GEMM-operand formats: Linear, Conv*d, ConvTranspose*d and MultiheadAttention take
  them (``emunum.nn.block_gemm``); Embedding (a lookup, no GEMM) is patched but left unrounded, and
  ``print(model)`` says so; norms and activations, which have no GEMM, are left unpatched unless the policy
  rounds something else there.
- Functional GEMMs (``emunum.nn.gemm_mode``): while the model's forward runs, ``torch.matmul``/``@``, ``mm``,
  ``bmm``, ``mv``, ``addmm``, ``baddbmm``, ``F.linear``, ``einsum``, ``F.conv*d`` and
  ``F.scaled_dot_product_attention`` called by modules that were not swapped (attention products, foreign
  layers such as transformers' ``Conv1D``) are emulated with the same policy (``emunum.nn.functional``), through
  forward hooks on the model (removed by ``unpatch``). The filter and ``keep_first_last`` apply to them too: a
  module they exclude runs its functional GEMMs unemulated. ``functional=False`` turns this off.
- The first forward of a patched model counts its GEMM FLOPs (``emunum.coverage``) and warns once, naming each
  GEMM that ran off the format and its module; ``strict=True`` raises ``ValueError`` instead, there and for
  every unemulable functional GEMM later.
- ``TransformerEncoderLayer`` and ``TransformerEncoder`` have fused inference fast paths that would bypass
  the emulated layers; while a layer inside them is patched those fast paths are switched off (their
  ``activation_relu_or_gelu`` / ``use_nested_tensor`` attributes, restored by ``unpatch``).
"""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from torch import nn

from . import nn as emu_nn
from .functional_patch import FunctionalPatch
from .nn import gemm_context
from .policy import Policy, make_policy

EmuFactory = Callable[[nn.Module, Policy], nn.Module]

_REGISTRY: dict = {}  # module type -> (factory, weight_layer)
_HOOK_ATTRS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
               "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks", "_is_full_backward_hook")
# fused fast paths that call torch kernels with the layers' weights instead of calling the layers
_FAST_PATH_OFF = {nn.TransformerEncoderLayer: {"activation_relu_or_gelu": 0},
                  nn.TransformerEncoder: {"use_nested_tensor": False}}


def register(module_type: type, emu_factory: EmuFactory, *, weight_layer: bool = False,
             replace: bool = False) -> None:
    """Emulate ``module_type`` with ``emu_factory(module, policy) -> nn.Module``.

    The replacement must reuse the module's Parameters and keep its state_dict keys (checked at patch time).
    weight_layer: counts as a weight layer for ``Policy.keep_first_last``. replace: overwrite an entry."""
    if not (isinstance(module_type, type) and issubclass(module_type, nn.Module)):
        raise TypeError(f"module_type must be an nn.Module subclass, got {module_type!r}")
    if not callable(emu_factory):
        raise TypeError(f"emu_factory must be callable as emu_factory(module, policy), got {emu_factory!r}")
    if module_type in _REGISTRY and not replace:
        raise ValueError(f"{module_type.__name__} is already registered; pass replace=True to overwrite it")
    _REGISTRY[module_type] = (emu_factory, bool(weight_layer))


def unregister(module_type: type) -> None:
    if module_type not in _REGISTRY:
        raise ValueError(f"{getattr(module_type, '__name__', module_type)!r} is not registered")
    del _REGISTRY[module_type]


def registered_types() -> tuple:
    return tuple(_REGISTRY)


def _builtin(module: nn.Module, policy: Policy) -> nn.Module:
    return emu_nn.from_float(module, policy)


def _applies(site, policy: Policy) -> bool:
    """False for a built-in layer with nothing to do under the policy (``EmuLayer.emunum_applies``: a norm or
    activation under a policy whose only formats are block formats, which apply to GEMM operands)."""
    if site.factory is not _builtin:
        return True
    mixin, _ = emu_nn.mixin_for(type(site.module))
    return mixin is None or mixin.emunum_applies(policy)


for _t, _mixin in emu_nn.MIXINS.items():
    register(_t, _builtin, weight_layer=_mixin.HAS_WEIGHT)
del _t, _mixin


def _lookup(table, module_type: type):
    """(entry, None) for a type or an ancestor whose forward it keeps; (None, ancestor) if it overrides it."""
    if module_type in table:
        return table[module_type], None
    for base in module_type.__mro__[1:]:
        if base in table:
            return (table[base], None) if module_type.forward is base.forward else (None, base)
    return None, None


@dataclass
class _Site:
    name: str
    module: nn.Module
    factory: Optional[EmuFactory]
    weight_layer: bool
    ancestors: tuple
    done: bool = False  # already patched (the module is a replacement)


def is_patched(module: nn.Module) -> bool:
    """True for a module that ``patch`` put in place of another."""
    return "_emunum_original" in module.__dict__


def _walk(model: nn.Module, policy: Policy):
    """Sites (first occurrence of each module, pre-order; patched ones marked done) and skipped subclasses.

    The registry is consulted only if the policy rounds something or names a MAD unit (an approx-only
    policy replaces activations and nothing else)."""
    approx = {k: (f, False) for k, f in policy.approx}
    use_registry = policy.rounds_anything or policy.mad is not None
    sites, skipped, seen = [], [], set()

    def visit(module: nn.Module, name: str, ancestors: tuple):
        if id(module) in seen:
            return
        seen.add(id(module))
        if is_patched(module):
            orig = module.__dict__["_emunum_original"]
            entry, _ = _lookup(_REGISTRY, type(orig))
            sites.append(_Site(name, module, None, bool(entry and entry[1]), ancestors, done=True))
            return
        entry, blocked = _lookup(approx, type(module))
        if entry is None and use_registry:
            entry, blocked = _lookup(_REGISTRY, type(module))
        if entry is not None and "forward" in module.__dict__:  # an instance-level forward would win
            entry, blocked = None, type(module)
        if entry is not None:
            sites.append(_Site(name, module, entry[0], entry[1], ancestors))
            return
        if blocked is not None:
            skipped.append((name, type(module), blocked))
        for key, child in module._modules.items():
            if child is not None:
                visit(child, f"{name}.{key}" if name else key, ancestors + (module,))

    visit(model, "", ())
    return sites, skipped


def _parents(model: nn.Module) -> Iterator[nn.Module]:
    """Every module of the tree once, including those registered under several names."""
    stack, seen = [model], set()
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        yield m
        stack.extend(c for c in m._modules.values() if c is not None)


def _build(site: _Site, policy: Policy) -> nn.Module:
    module = site.module
    rep = site.factory(module, policy)
    what = f"the emulation of {site.name or 'the model'} ({type(module).__name__})"
    if not isinstance(rep, nn.Module) or rep is module:
        raise TypeError(f"{what} returned {type(rep).__name__ if rep is not module else 'the module itself'}; "
                        "expected a new nn.Module")
    params = {id(p) for p in rep.parameters()}
    if any(id(p) not in params for p in module.parameters()):
        raise RuntimeError(f"{what} does not reuse the original Parameters (optimizers and state_dict keys "
                           "depend on them)")
    if set(rep.state_dict()) != set(module.state_dict()):
        raise RuntimeError(f"{what} changes the state_dict keys: {sorted(set(rep.state_dict()))} instead of "
                           f"{sorted(set(module.state_dict()))}")
    d = rep.__dict__
    if not isinstance(rep, emu_nn.EmuLayer):  # a foreign replacement: give it the original's hooks and mode
        for a in _HOOK_ATTRS:
            d[a] = module.__dict__[a]
        rep.train(module.training)
    d["_emunum_original"] = module
    d["_emunum_policy"] = policy
    return rep


def _restore(rep: nn.Module) -> nn.Module:
    orig = rep.__dict__["_emunum_original"]
    if isinstance(rep, emu_nn.EmuLayer):  # shares the original's state: copy back what changed meanwhile
        for k, v in rep.__dict__.items():
            if not k.startswith(emu_nn.STATE_PREFIX):
                orig.__dict__[k] = v
    else:
        for a in _HOOK_ATTRS:
            orig.__dict__[a] = rep.__dict__[a]
        orig.train(rep.training)
    return orig


def _fast_paths_off(module: nn.Module) -> None:
    for cls, attrs in _FAST_PATH_OFF.items():
        if isinstance(module, cls) and "_emunum_saved" not in module.__dict__:
            module.__dict__["_emunum_saved"] = {a: module.__dict__[a] for a in attrs if a in module.__dict__}
            for a, v in attrs.items():
                setattr(module, a, v)


DEFAULT_FMT = "fp8_152"


def patch(model: nn.Module, fmt=None, *, policy: Optional[Policy] = None, strict: bool = False,
          functional: bool = True, elide: bool = True, **kwargs) -> nn.Module:
    """Emulate ``model``'s layers in place and return the model (see the module doc).

    fmt / kwargs: the keyword form of ``emunum.Policy`` (``Policy.make``): ``fmt`` for every tensor role,
    nearest rounding forward, stochastic backward; ``grad=``, ``weight=``, ``input=``, ``output=``,
    ``grad_weight=``, ``grad_input=``, ``grad_output=``, ``rounding=``, ``grad_rounding=``, ``ste=``,
    ``sr_bits=``, ``mad=``, ``mad_backward=``, ``approx=``, ``filter=``, ``keep_first_last=``.
    Or a ``Policy`` as ``fmt`` or ``policy=``. With no format, policy or option at all, ``fmt`` is
    ``DEFAULT_FMT`` ("fp8_152", the documented default). Raises ValueError if the filter and
    ``keep_first_last`` leave no layer to swap and no module whose functional GEMMs could run emulated (with
    ``functional``: one outside the layers, that the filter accepts with its ancestors, other than a plain
    container; e.g. GPT-2's ``Conv1D`` when a recipe leaves out its embeddings and first and last layers; if its
    first forward then emulates no GEMM, it warns, or raises with ``strict``), or if the model is already
    patched with another policy; warns if the model has no layer to emulate.
    strict: raise instead of warning when a GEMM runs off the format (see the module doc). functional: emulate
    the functional GEMMs of modules that are not swapped (default True). elide: skip the roundings that cannot
    change a bit (tensors already on the format's grid; ``docs/elision.md``), while the process-wide switch
    (``EMUNUM_ELIDE``, ``emunum.grid.set_elision``) is on too (default True).
    """
    for name, v in (("strict", strict), ("functional", functional), ("elide", elide)):
        if not isinstance(v, bool):
            raise TypeError(f"{name}={v!r}: allowed: True or False")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if fmt is None and policy is None and not kwargs:
        fmt = DEFAULT_FMT
    pol = make_policy(fmt, policy, **kwargs)
    if not (pol.rounds_anything or pol.approx or pol.mad is not None):
        raise ValueError("the policy emulates nothing: give fmt=, a role format (weight=, input=, output=, "
                         "grad=, ...), mad= or approx=")
    sites, skipped = _walk(model, pol)
    other = [s for s in sites if s.done and s.module.__dict__.get("_emunum_policy") != pol]
    if other:
        name, m = other[0].name, other[0].module
        raise ValueError(f"the model is already patched ({name or 'the model'!r} is {type(m).__name__}) with "
                         "another policy; call emunum.unpatch(model) first")
    for name, t, base in skipped:
        where = "its instance's forward attribute" if t is base else f"{base.__name__}.forward"
        also = " (the functional GEMMs of its forward are)" if functional else ""
        warnings.warn(f"emunum.patch: {name!r} ({t.__name__}) overrides {where} and is not emulated as a layer{also}; "
                      f"emunum.register({t.__name__}, factory) to emulate it", RuntimeWarning, stacklevel=2)
    if "_emunum_gemm" in model.__dict__:
        if model.__dict__["_emunum_gemm"].policy != pol:
            raise ValueError("the model is already patched with another policy; call emunum.unpatch(model) first")
        if not any(not s.done for s in sites):
            return model
    if not sites:
        if functional and (pol.rounds_anything or pol.mad is not None):
            _attach_functional(model, pol, strict, [], ())  # its first forward says what ran off the format
            model.__dict__["_emunum_gemm"].mode.emu.__dict__["_emunum_elide"] = elide
            return model
        warnings.warn(f"emunum.patch: {type(model).__name__} has no layer to emulate; registered types: "
                      f"{', '.join(sorted(t.__name__ for t in _REGISTRY))}", RuntimeWarning, stacklevel=2)
        return model

    keep = set()
    weights = [s for s in sites if s.weight_layer]
    if pol.keep_first_last and weights:
        keep = {id(weights[0].module), id(weights[-1].module)}
    chosen = [s for s in sites if not s.done and id(s.module) not in keep and _applies(s, pol)
              and (pol.filter is None or pol.filter(s.module, s.name))]
    hosts_only = not chosen and functional and not any(s.done for s in sites) and _functional_host(model, pol, sites)
    if not chosen and not hosts_only:
        if any(s.done for s in sites):
            return model  # patched before with this policy: nothing left to do
        if not any(_applies(s, pol) for s in sites):
            raise ValueError("emunum.patch: the policy's block formats apply to GEMM operands, and the model has "
                             f"no Linear, Conv, ConvTranspose or MultiheadAttention layer; emulable layers: "
                             f"{', '.join(repr(s.name) for s in sites[:20])}")
        why = "filter" if pol.filter is not None else "keep_first_last"
        raise ValueError(f"emunum.patch: the {why} left none of the {len(sites)} emulable layers: "
                         f"{', '.join(repr(s.name) for s in sites[:20])}{' ...' if len(sites) > 20 else ''}")

    reps = {id(s.module): _build(s, pol) for s in chosen}
    for rep in reps.values():
        if isinstance(rep, emu_nn.EmuLayer):
            rep.__dict__["_emunum_elide"] = elide
    for s in chosen:
        for anc in s.ancestors:
            _fast_paths_off(anc)
    if id(model) in reps:
        return reps[id(model)]
    for parent in _parents(model):
        for key, child in parent._modules.items():
            if child is not None and id(child) in reps:
                parent._modules[key] = reps[id(child)]
    if functional and "_emunum_gemm" not in model.__dict__:
        excluded = [(s.module, gemm_context.KEPT if id(s.module) in keep else gemm_context.FILTERED)
                    for s in sites if not s.done and id(s.module) not in reps and _applies(s, pol)]
        _attach_functional(model, pol, strict, excluded, {id(s.module) for s in sites}, expects_emulated=hosts_only)
    if "_emunum_gemm" in model.__dict__:
        model.__dict__["_emunum_gemm"].mode.emu.__dict__["_emunum_elide"] = elide
    return model


_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def _functional_host(model: nn.Module, pol: Policy, sites) -> bool:
    """Whether a module that is not a site, and that the filter accepts with all its ancestors, has a forward of
    its own (not a plain container): where the functional path would emulate GEMMs (e.g. GPT-2's ``Conv1D``)."""
    site_ids = {id(s.module) for s in sites}

    def visit(m: nn.Module, name: str) -> bool:
        if id(m) in site_ids or (pol.filter is not None and not pol.filter(m, name)):
            return False
        if type(m) not in _CONTAINERS:
            return True
        return any(visit(c, f"{name}.{k}" if name else k) for k, c in m._modules.items() if c is not None)

    return visit(model, "")


def _attach_functional(model: nn.Module, pol: Policy, strict: bool, excluded: list, sites,
                       expects_emulated: bool = False) -> None:
    """Forward hooks that emulate the functional GEMMs of the model's unswapped modules (``gemm_mode``)."""
    hooks = FunctionalPatch(pol, strict, expects_emulated)
    hooks.attach_root(model)
    for module, reason in excluded:
        hooks.attach_excluded(module, reason)
    if pol.filter is not None:  # a module the filter rejects runs its functional GEMMs unemulated
        def visit(m: nn.Module, name: str, on: bool):
            if id(m) in sites:
                return
            here = bool(pol.filter(m, name))
            if on and not here:
                hooks.attach_excluded(m, gemm_context.FILTERED)
            for key, child in m._modules.items():
                if child is not None:
                    visit(child, f"{name}.{key}" if name else key, on and here)
        visit(model, "", True)
    model.__dict__["_emunum_gemm"] = hooks


def unpatch(model: nn.Module) -> nn.Module:
    """Put every original module back; returns the model (the original if ``model`` is itself a twin)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    hooks = model.__dict__.pop("_emunum_gemm", None)
    if hooks is not None:
        hooks.remove()
    restored = {}
    for parent in list(_parents(model)):
        for key, child in parent._modules.items():
            if child is not None and is_patched(child):
                if id(child) not in restored:
                    restored[id(child)] = _restore(child)
                parent._modules[key] = restored[id(child)]
        saved = parent.__dict__.pop("_emunum_saved", None)
        if saved is not None:
            parent.__dict__.update(saved)
    if is_patched(model):
        return _restore(model)
    return model


@contextlib.contextmanager
def patched(model: nn.Module, fmt=None, **kwargs):
    """``with emunum.patched(model, fmt=...) as m:`` patch, then unpatch on exit (also on error)."""
    m = patch(model, fmt, **kwargs)
    try:
        yield m
    finally:
        unpatch(m)


def emulated_modules(model: nn.Module) -> list:
    """(qualified name, module) of every emulated layer (``emunum.nn.EmuLayer``) in the model."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, emu_nn.EmuLayer)]


FUNCTIONAL_SITE = "functional GEMMs"


def emulation_sites(model: nn.Module) -> list:
    """``emulated_modules``, then ``(FUNCTIONAL_SITE, emulator)`` for the rounding state of the model's functional
    GEMMs (``emunum.nn.functional.GemmEmulator``; one for the whole model) if it has one: what a tracer counts."""
    sites = emulated_modules(model)
    hooks = model.__dict__.get("_emunum_gemm")
    return sites + [(FUNCTIONAL_SITE, hooks.mode.emu)] if hooks is not None else sites
