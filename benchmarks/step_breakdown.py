"""Where an element-wise emulated training step spends its time beyond fp32, by ablation, in one process.

    python benchmarks/step_breakdown.py                       # bert,llama
    python benchmarks/step_breakdown.py --models cnn2d,resnet18,bert,llama --rounds 9

Each model of ``benchmarks/real_models.py`` (same configs, same policy: ``fmt="e4m3fn", grad="e5m2"``) is timed,
interleaved round by round, one torch and numba thread, thread CPU time (``time.thread_time``), as:
- ``fp32``: the unpatched model;
- ``layers, no rounding``: ``patch(functional=False)`` with every rounding of every emulated layer replaced by
  the identity (``EmuLayer._emu_round``): the swapped layers' own Python;
- ``layers+functional, no rounding``: the same with the functional-GEMM mode on (``gemm_mode``): adds the mode's
  per-call cost and the emulated attention math (``GemmEmulator.sdpa``) against torch's fused SDPA kernel;
- ``kernels -> memmove``: the patched model with each CPU rounding kernel (every one the element-wise paths
  reach, ``Kernels``) replaced by a copy (seed draws, fresh result tensors, nodes and Python kept): the
  difference to ``patched`` is the kernels' arithmetic, and the row itself what the step costs with kernels
  as fast as a copy;
- ``kernels -> nothing``: the same, with the kernel replaced by nothing (the fresh result left unwritten);
- ``kernels write into their source``: the real kernels, each writing into its source tensor instead of the fresh
  result (left unwritten);
- ``patched``: the patched model as it runs.
These ablated steps compute other numbers than the emulation (their bits are not the point: only the time; the
unwritten results of the last two are whatever the allocator hands back, which slows later ops, 6.7x fp32 on cnn2d:
those rows bound nothing). Per step it also prints the roundings that reach a CPU kernel (count, elements, per
format and mode), the roundings skipped by elision, and the autograd nodes of the patched graph beside fp32's.
``--node`` first times one rounding node alone (``emunum.elide.round_eliding`` of ``x * 1`` with e4m3fn forward and
stochastic e5m2 backward, forward and backward) beside ``x * 1`` without it, at three sizes. ``--cold`` times the
pieces of one rounding (16 elements; median of 300 calls, thread CPU) warm, i.e. called again at once, and right
after a 4 MiB copy (about one core's L2 cache, what the torch ops between two roundings of a step stream through).
``--calls`` counts minor page faults per step of fp32 and patched steps (``getrusage``) and times, inside
``--steps`` patched steps (thread CPU around each call), the forward rounding sites (``round_eliding`` as the layers
call it), the backward roundings (``backward_eliding``), the grid-tag walks (``_hook_history``), the kernel calls
(``Kernels``, the huge-tensor path included) and the functional-GEMM mode's ``__torch_function__`` calls (inclusive:
an emulated GEMM's roundings, and the passed-on op's own work), per step and per call.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import importlib
import os
import resource
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import real_models as rm  # noqa: E402

POLICY = dict(fmt="e4m3fn", grad="e5m2")


def _nodes(loss) -> int:
    seen, stack = set(), [loss.grad_fn]
    while stack:
        n = stack.pop()
        if n is not None and n not in seen:
            seen.add(n)
            stack.extend(m for m, _ in n.next_functions)
    return len(seen)


class _Swap:
    """Set attributes for the duration of a block: ``_Swap((obj, name, value), ...)``."""

    def __init__(self, *swaps):
        self.swaps = swaps

    def __enter__(self):
        self.old = [(o, k, getattr(o, k)) for o, k, _ in self.swaps]
        for o, k, v in self.swaps:
            setattr(o, k, v)

    def __exit__(self, *exc):
        for o, k, v in self.old:
            setattr(o, k, v)


class Kernels:
    """Replace every CPU rounding kernel of the patched layers' element-wise paths by ``make(real_runner,
    element_bytes)`` for the duration of a block (not the batched roundings of ``emunum.optim``). Those paths reach
    the kernels through ``quantize._cpu_runner`` (``quantize_checked``, the huge-tensor path included) and through
    runner caches filled from it (``autograd._runners``/``_mode_runners``, which ``_round_cpu`` and the elision
    paths read), keyed on ``backends.GENERATION``: it is bumped on entry and on exit, so that the caches are filled
    again from the swapped, then the real, runners. (Swapping ``autograd._mode_runner``, as this script did before,
    changed nothing once the caches were warm: its "kernels -> ..." rows timed the real kernels.) A runner is
    ``run(src, dst, n, mode, key, nbits, parallel=None)`` on addresses."""

    def __init__(self, make):
        self.make = make

    def __enter__(self):
        from emunum import autograd, backends

        q = importlib.import_module("emunum.quantize")
        self.mods, real = (q, autograd), q._cpu_runner
        self.real = real

        def runner(fmt, dtype):
            return self.make(real(fmt, dtype), torch.empty(0, dtype=dtype).element_size())

        for m in self.mods:
            m._cpu_runner = runner
        self.generation = backends.GENERATION
        self.generation[0] += 1
        return self

    def __exit__(self, *exc):
        for m in self.mods:
            m._cpu_runner = self.real
        self.generation[0] += 1


def memmove_kernel(run, size):
    """``Kernels``: copy src to dst."""
    return lambda src, dst, n, mode, key, nbits, parallel=None: ctypes.memmove(dst, src, n * size)


def no_kernel(run, size):
    """``Kernels``: leave dst unwritten."""
    return lambda src, dst, n, mode, key, nbits, parallel=None: None


def in_source_kernel(run, size):
    """``Kernels``: the real kernel, writing into src (dst left unwritten)."""
    return lambda src, dst, n, mode, key, nbits, parallel=None: run(src, src, n, mode, key, nbits, parallel)


def _node_cost(rounds: int) -> None:
    from emunum.autograd import _Plan
    from emunum.elide import round_eliding

    plan = _Plan("e4m3fn", "e5m2", "nearest", "stochastic", "identity", None, None)

    def best(n, rounded):
        x, g = torch.randn(n, requires_grad=True), torch.randn(n)
        reps, ts = max(20, 20000 // (1 + n // 1024)), []
        for r in range(rounds + 1):
            t0 = time.thread_time()
            for _ in range(reps):
                y = x * 1.0
                (round_eliding(plan, y) if rounded else y).backward(g)
            ts.append((time.thread_time() - t0) / reps)
        return min(ts[1:]) * 1e6

    for n in (16, 16384, 131072):
        b, r = best(n, False), best(n, True)
        print(f"   one rounding node, {n:6d} elements: x * 1 forward + backward {b:7.1f} us, with the node "
              f"{r:7.1f} us: {r - b:6.1f} us per rounding (forward nearest + backward stochastic)")


class _Triv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g


def _cold_cost() -> None:
    from emunum import autograd, elide, ops
    from emunum.autograd import _Plan, _round_cpu
    from emunum.formats import RoundMode

    q = importlib.import_module("emunum.quantize")
    plan = _Plan("e4m3fn", "e5m2", "nearest", "stochastic", "identity", None, None)
    g, out, x = torch.randn(16), torch.empty(16), torch.randn(16, requires_grad=True) * 1.0
    call = autograd._mode_runner(plan.forward, torch.float32, RoundMode.NEAREST)
    big, big2 = torch.randn(1 << 20), torch.empty(1 << 20)
    pieces = {
        "nothing (the timer)": lambda: None,
        "ops.eager_ok": lambda: ops.eager_ok(x),
        "torch.empty_like": lambda: torch.empty_like(g),
        "seed draw (resolve_seed)": lambda: q.resolve_seed(None),
        "kernel call, nearest": lambda: call(g.data_ptr(), out.data_ptr(), 16, 0, 32),
        "_round_cpu, nearest": lambda: _round_cpu(g, plan.forward, RoundMode.NEAREST, None, 32),
        "_round_cpu, stochastic": lambda: _round_cpu(g, plan.backward, RoundMode.STOCHASTIC, None, 32),
        "a trivial autograd.Function's forward": lambda: _Triv.apply(x),
        "round_eliding (forward, with its node)": lambda: elide.round_eliding(plan, x),
        "backward_eliding (stochastic)": lambda: elide.backward_eliding(plan, g),
    }
    for label, f in pieces.items():
        res = []
        for flush in (False, True):
            ts = []
            for _ in range(300):
                if flush:
                    big2.copy_(big)
                t0 = time.thread_time_ns()
                f()
                ts.append(time.thread_time_ns() - t0)
            res.append(statistics.median(ts) / 1e3)
        print(f"   {label:40s} warm {res[0]:6.2f} us, after a 4 MiB copy {res[1]:6.2f} us")


def _calls(built, steps: int) -> None:
    """Minor page faults per step, and thread CPU inside the rounding calls of ``steps`` patched steps."""
    from emunum import elide
    from emunum.nn import base

    for key in ("fp32", "patched"):
        r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(steps):
            built[key][0]()
        print(f"   minor page faults per step, {key}: "
              f"{(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / steps:.1f}")
    spent, calls, tt = collections.Counter(), collections.Counter(), time.thread_time_ns

    def timed(label, fn):
        def call(*args):
            t0 = tt()
            try:
                return fn(*args)
            finally:
                spent[label] += tt() - t0
                calls[label] += 1
        return call

    from emunum.nn import gemm_mode

    def timed_kernel(run, size):  # keeps the runner's per-mode callers (``for_mode``), as the eager path calls them
        label = "kernel calls (every CPU rounding)"
        call = timed(label, run)
        if hasattr(run, "for_mode"):
            call.for_mode = lambda mode: timed(label, run.for_mode(mode))
        return call

    mode_fn = gemm_mode.GemmMode.__torch_function__
    handled = timed("functional-GEMM mode: emulated GEMMs (inclusive)", mode_fn)
    passed = timed("functional-GEMM mode: other torch calls (incl.)", mode_fn)

    def mode_call(self, func, *rest):
        return (handled if func in gemm_mode.HANDLERS else passed)(self, func, *rest)

    with _Swap((gemm_mode.GemmMode, "__torch_function__", mode_call),
               (base, "round_eliding", timed("forward rounding sites (round_eliding)", base.round_eliding)),
               (elide, "backward_eliding", timed("backward roundings (backward_eliding)", elide.backward_eliding)),
               (elide, "_hook_history", timed("  of which grid-tag walks (_hook_history)", elide._hook_history))), \
            Kernels(timed_kernel):
        for _ in range(steps):
            built["patched"][0]()
    for label in ("forward rounding sites (round_eliding)", "  of which grid-tag walks (_hook_history)",
                  "backward roundings (backward_eliding)", "kernel calls (every CPU rounding)",
                  "functional-GEMM mode: emulated GEMMs (inclusive)",
                  "functional-GEMM mode: other torch calls (incl.)"):
        if calls[label]:
            print(f"   {label:50s} {spent[label] / steps / 1e6:6.2f} ms/step {calls[label] / steps:5.0f} calls "
                  f"{spent[label] / calls[label] / 1e3:7.1f} us/call")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="bert,llama")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--node", action="store_true", help="also time one rounding node alone (module doc)")
    p.add_argument("--cold", action="store_true", help="also time a rounding's pieces warm and cold (module doc)")
    p.add_argument("--calls", action="store_true", help="also time the rounding calls inside a step (module doc)")
    a = p.parse_args(argv)
    for k in ("steps", "rounds"):
        if getattr(a, k) < 1:
            p.error(f"--{k}={getattr(a, k)} must be >= 1")
    names = [n.strip() for n in a.models.split(",") if n.strip()]
    bad = [n for n in names if n not in rm.MODELS]
    if bad or not names:
        p.error(f"--models: unknown {bad}; allowed: {', '.join(rm.MODELS)}")

    import emunum
    from emunum import autograd, buffers, grid, torch_cpu
    from emunum.nn import base

    torch_cpu.set_threads(1)
    buffers.retain_freed_memory()
    print("# load average " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    if a.node:
        _node_cost(a.rounds)
    if a.cold:
        _cold_cost()

    no_round = _Swap((base.EmuLayer, "_emu_round", lambda self, x, role: x))
    memmove, no_kernels, in_source = Kernels(memmove_kernel), Kernels(no_kernel), Kernels(in_source_kernel)
    nothing = _Swap()

    for name in names:
        built = {}
        for key, kw in (("fp32", None), ("layers", dict(functional=False)), ("patched", {})):
            m, loss, desc = rm.build(name, 2, 64, 32)
            if kw is not None:
                emunum.patch(m, **POLICY, **kw)
            built[key] = (rm.TrainStep(m, loss), m, loss)
        configs = {"fp32": ("fp32", nothing), "layers, no rounding": ("layers", no_round),
                   "layers+functional, no rounding": ("patched", no_round),
                   "kernels -> nothing": ("patched", no_kernels), "kernels -> memmove": ("patched", memmove),
                   "kernels write into their source": ("patched", in_source), "patched": ("patched", nothing)}
        for _ in range(3):
            for step, _, _ in built.values():
                step.reset()
                step()
        # what one patched step rounds
        calls, elems = collections.Counter(), collections.Counter()
        orig = autograd._round_cpu

        def counting(x, fmt, mode, seed, nbits):
            calls[(fmt.name, mode.name.lower())] += 1
            elems[(fmt.name, mode.name.lower())] += x.numel()
            return orig(x, fmt, mode, seed, nbits)

        from emunum import elide

        with _Swap((autograd, "_round_cpu", counting), (elide, "_round_cpu", counting)):
            grid.elided.clear()
            built["patched"][0]()
        skipped = dict(grid.elided)
        n32 = _nodes(built["fp32"][2](built["fp32"][1]))
        ne = _nodes(built["patched"][2](built["patched"][1]))
        print(f"== {name} ({desc}): autograd nodes fp32 {n32}, patched {ne}; elided per step {skipped}")
        for k in calls:
            print(f"   kernel roundings per step, {k[0]} {k[1]}: {calls[k]} calls, {elems[k]} elements")
        times = {k: [] for k in configs}
        for _ in range(a.rounds):
            for k, (which, swap) in configs.items():
                step = built[which][0]
                with swap:  # the swaps that skip or garble roundings may give non-finite losses: not checked
                    times[k].append(rm.time_steps(step, a.steps, time.thread_time, check=swap is nothing))
        b = statistics.median(times["fp32"])
        for k, v in times.items():
            med = statistics.median(v)
            print(f"   {k:32s} {1e3 * med:8.2f} ms  {med / b:5.2f}x fp32")
        if a.calls:
            _calls(built, a.steps)
    print("# load average at the end " + " ".join(f"{v:.2f}" for v in os.getloadavg()))


if __name__ == "__main__":
    main()
