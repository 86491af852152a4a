"""Cost of emunum.trace's counters on a patched training step (small CNN and MLP, CPU).

    python benchmarks/trace_overhead.py [--models cnn mlp] [--rounds 7] [--steps 20] [--every 10 20] [--fmt e5m2]
                                        [--threads N]

Each model is patched with ``emunum.patch(model, fmt=...)`` (every role in fmt, nearest forward, stochastic
backward). A step is forward + cross-entropy + backward + SGD. Configurations: tracing off, and tracing
with every=1 (every rounding observed) with and without SQNR, and every=K. The configurations are
interleaved round by round (so drifting machine load hits them alike). Per configuration: the median and
the minimum over rounds of a round's mean wall-clock step time, the median process CPU time per step
(all threads), the median CPU time of the calling thread per step (``time.thread_time``: the least disturbed by
other processes; the whole step with ``--threads 1``, which runs torch and numba on one thread) and its paired
overhead (the median over rounds of a round's thread time over that of the same round's "off"; with
``--steps 1`` configurations alternate step by step, which makes every traced step the first after a switch
of code path: see RESULTS.md, "trace counters", on the heap-trim page faults that this triggers), the overhead
of each against tracing off, and the time spent inside the counters per step
(timed around ``emunum.trace.accumulate`` and ``emunum.trace.round_observed``; the latter is the fused
round-and-count pass, so its time includes the rounding that the untraced step pays too) with its share of
the untraced step.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

import emunum
from emunum import trace


def small_cnn():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def mlp():
    return nn.Sequential(nn.Linear(784, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 10))


MODELS = {
    "cnn": (small_cnn, lambda g: torch.randn(32, 3, 32, 32, generator=g)),
    "mlp": (mlp, lambda g: torch.randn(128, 784, generator=g)),
}


def bench(name: str, fmt: str, rounds: int, steps: int, every_k) -> dict:
    make, data = MODELS[name]
    torch.manual_seed(0)
    model = emunum.patch(make(), fmt=fmt)
    g = torch.Generator().manual_seed(1)
    x, y = data(g), torch.randint(0, 10, (data(g).shape[0],), generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    configs = {"off": None, "every=1": dict(every=1, sqnr=True), "every=1 no-sqnr": dict(every=1, sqnr=False)}
    configs.update({f"every={k}": dict(every=k, sqnr=True) for k in every_k})
    for _ in range(3):  # warm-up: kernel compilation, allocator
        step()
    with trace.collect(model) as t:
        step()
    assert sum(d["values"] for roles in t.summary().values() for d in roles.values()) > 0
    times = {c: [] for c in configs}
    inside = {c: [] for c in configs}
    cpu = {c: [] for c in configs}
    thread = {c: [] for c in configs}
    real_accumulate, real_round = trace.accumulate, trace.round_observed
    spent, depth = [0.0], [0]

    def timed(fn):  # the outermost call only (round_observed may call accumulate)
        def call(*a, **k):
            depth[0] += 1
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    spent[0] += time.perf_counter() - t
        return call

    trace.accumulate, trace.round_observed = timed(real_accumulate), timed(real_round)
    try:
        for _ in range(rounds):
            for c, opts in configs.items():
                tracer = None if opts is None else trace.enable(model, **opts)
                spent[0] = 0.0
                t0, c0, h0 = time.perf_counter(), time.process_time(), time.thread_time()
                for _ in range(steps):
                    step()
                times[c].append((time.perf_counter() - t0) / steps)
                cpu[c].append((time.process_time() - c0) / steps)
                thread[c].append((time.thread_time() - h0) / steps)
                inside[c].append(spent[0] / steps)
                if tracer is not None:
                    tracer.close()
    finally:
        trace.accumulate, trace.round_observed = real_accumulate, real_round
    t0 = time.perf_counter()
    with trace.collect(model) as t:
        step()
    t1 = time.perf_counter()
    t.to_dict()
    export = time.perf_counter() - t1
    med = {c: statistics.median(v) for c, v in times.items()}
    low = {c: min(v) for c, v in times.items()}
    ins = {c: statistics.median(v) for c, v in inside.items()}
    cpus = {c: statistics.median(v) for c, v in cpu.items()}
    thr = {c: statistics.median(v) for c, v in thread.items()}
    return {"model": name, "median_s": med, "min_s": low, "inside_s": ins, "export_s": export, "cpu_s": cpus,
            "thread_s": thr, "overhead_thread": {c: thr[c] / thr["off"] - 1 for c in thr},
            "paired_thread": {c: statistics.median(a / b - 1 for a, b in zip(v, thread["off"]))
                              for c, v in thread.items()},
            "overhead_cpu": {c: cpus[c] / cpus["off"] - 1 for c in cpus},
            "overhead_median": {c: med[c] / med["off"] - 1 for c in med},
            "overhead_min": {c: low[c] / low["off"] - 1 for c in low},
            "inside_share": {c: ins[c] / med["off"] for c in ins}, "layers": len(t.layers)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--fmt", default="e5m2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20, help="steps per round (a multiple of each --every; 1: "
                    "configurations alternate step by step, for every=1 and off)")
    ap.add_argument("--every", type=int, nargs="*", default=[10, 20], help="K of the sampled configurations (none: "
                    "no sampled configuration)")
    ap.add_argument("--threads", type=int, default=None, help="torch and numba threads (default: as found)")
    ap.add_argument("--default-malloc", action="store_true", help="keep glibc's default (the training loop "
                    "calls emunum.buffers.retain_freed_memory(), and so does this benchmark unless this is given)")
    args = ap.parse_args(argv)
    retained = not args.default_malloc and emunum.buffers.retain_freed_memory()
    print(f"# malloc: {'retain_freed_memory()' if retained else 'glibc default'}")
    if args.threads is not None:
        from emunum import torch_cpu

        torch_cpu.set_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} torch threads, fmt={args.fmt}, "
          f"{args.rounds} rounds x {args.steps} steps")
    for name in args.models:
        r = bench(name, args.fmt, args.rounds, args.steps, args.every)
        print(f"\n{name} ({r['layers']} emulated layers); trace export (to_dict) {r['export_s'] * 1e3:.2f} ms")
        print(f"  {'config':<17}{'wall median':>12}{'overhead':>9}{'wall min':>9}{'overhead':>9}"
              f"{'cpu median':>11}{'overhead':>9}{'thread cpu':>11}{'overhead':>9}{'paired':>8}"
              f"{'counters':>9}{'share':>7}"
              "   (ms per step)")
        for c in r["median_s"]:
            print(f"  {c:<17}{r['median_s'][c] * 1e3:>12.2f}{r['overhead_median'][c] * 100:>8.1f}%"
                  f"{r['min_s'][c] * 1e3:>9.2f}{r['overhead_min'][c] * 100:>8.1f}%"
                  f"{r['cpu_s'][c] * 1e3:>11.2f}{r['overhead_cpu'][c] * 100:>8.1f}%"
                  f"{r['thread_s'][c] * 1e3:>11.2f}{r['overhead_thread'][c] * 100:>8.1f}%"
                  f"{r['paired_thread'][c] * 100:>7.1f}%"
                  f"{r['inside_s'][c] * 1e3:>9.3f}{r['inside_share'][c] * 100:>6.1f}%")


if __name__ == "__main__":
    main()
