"""Throughput of emunum.quantize beside the memory-copy ceiling and torch's own float8 cast.

    python benchmarks/quantize.py                      # CPU, 16M float32 elements
    python benchmarks/quantize.py --device cuda        # GPU (torch.cuda.synchronize around every timing)
    python benchmarks/quantize.py --crossover          # serial vs parallel CPU kernel, 2**10..2**20 elements
    python benchmarks/quantize.py --cold               # import + first call in a fresh process, empty numba cache
    python benchmarks/quantize.py --blocks-only        # copy_ and the MXFP8 / NVFP4 rows alone
    python benchmarks/quantize.py --new-formats        # P3109, MXINT4, NVINT4, HiFloat8 beside today's path for their element
    python benchmarks/quantize.py --scale-rules        # each power-of-two scale rule beside floor (OCP), per element
    python benchmarks/quantize.py --scale-rules --mode stochastic   # the same, rounded stochastically (seed 1)
    python benchmarks/quantize.py --nvfp4-family       # the NVFP4 family (docs/nvfp4.md) beside nvfp4, same run
    python benchmarks/quantize.py --nvfp4-family --mode stochastic   # the same, rounded stochastically (seed 1)
    python benchmarks/quantize.py --mxplus             # each MX+ preset (docs/mxplus.md) beside its plain MX preset

Every figure is the best of --repeats timings (after one untimed warm-up call, which also compiles), in
millions of elements per second; "% copy" is the share of out.copy_(x)'s rate (read 4 + write 4 bytes per
element, the same traffic as quantize with out=).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # run from a checkout without installing

import emunum  # noqa: E402


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def best_seconds(fn, device: str, repeats: int, inner: int = 1) -> float:
    """Best wall time of ``inner`` calls of fn (per call), over ``repeats`` timings, after one warm-up."""
    fn()
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(device)
        best = min(best, (time.perf_counter() - t) / inner)
    return best


def git_state() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return f"{head}{' + uncommitted changes' if dirty else ''}" if head else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def header(device: str) -> None:
    import numba

    # emunum's kernel modules pick numba's threading layer on import (kernels/block_cpu.py: workqueue beside torch's
    # OpenMP); asking numba for its thread count first would start its default layer instead, for the whole run
    from emunum.kernels import block_cpu  # noqa: F401

    print(f"# {datetime.datetime.now().isoformat(timespec='seconds')}  commit {git_state()}")
    print(f"# {platform.platform()}, {os.cpu_count()} CPUs; python {platform.python_version()}, torch {torch.__version__}, "
          f"numba {numba.__version__} ({numba.get_num_threads()} threads, layer {numba.config.THREADING_LAYER}), "
          f"torch threads {torch.get_num_threads()}")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    if load is not None:
        print(f"# load average before the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (other processes share the CPUs)")
    if device == "cuda":
        print(f"# GPU: {torch.cuda.get_device_name()}")


def throughput(n: int, device: str, repeats: int, fmt: str, blocks_only: bool = False) -> None:
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n, device=device, generator=g) * 100
    out = torch.empty_like(x)
    rows: list[tuple[str, float | None, str]] = []

    def add(name, fn, note=""):
        rows.append((name, best_seconds(fn, device, repeats), note))

    add("out.copy_(x)", lambda: out.copy_(x), "memory-copy ceiling")
    if not blocks_only:
        add("x.to(torch.float8_e5m2).float()", lambda: x.to(torch.float8_e5m2).float(), "torch cast, e5m2 only")
        add(f"quantize(x, {fmt!r})", lambda: emunum.quantize(x, fmt), "new output (huge-page backed)")
        add(f"quantize(x, {fmt!r}, out=torch.empty_like(x))",
            lambda: emunum.quantize(x, fmt, out=torch.empty_like(x)), "baseline: a plain new output")
        add(f"quantize(x, {fmt!r}, out=out)", lambda: emunum.quantize(x, fmt, out=out))
        add(f"quantize(x, {fmt!r}, 'stochastic')", lambda: emunum.quantize(x, fmt, "stochastic", seed=1))
        add(f"quantize(x, {fmt!r}, 'stochastic', out=out)",
            lambda: emunum.quantize(x, fmt, "stochastic", seed=1, out=out))
    for bf in ("mxfp8_e4m3", "nvfp4"):  # block formats: blocks along x's only axis
        add(f"quantize(x, {bf!r})", lambda bf=bf: emunum.quantize(x, bf), "block format, new output")
        add(f"quantize(x, {bf!r}, out=out)", lambda bf=bf: emunum.quantize(x, bf, out=out), "block format")
        # in place: y holds x's values rounded once; rounding them again is the same work (blocks and scales)
        y = emunum.quantize(x, bf)
        add(f"quantize(y, {bf!r}, out=y)", lambda bf=bf, y=y: emunum.quantize(y, bf, out=y),
            "block format, in place")
    if blocks_only:
        add("out.copy_(x) (again, after)", lambda: out.copy_(x), "the ceiling re-measured: load drift")
        return report(rows, n, device, repeats)
    try:
        from qtorch.quant import float_quantize  # QPyTorch
    except ImportError:
        rows.append(("qtorch float_quantize(x, 5, 2)", None, "not installed"))
    else:
        add("qtorch float_quantize(x, 5, 2)", lambda: float_quantize(x, 5, 2, rounding="nearest"))
    if device == "cpu" and emunum.buffers.retain_freed_memory():  # last: it cannot be undone in this process
        note = "new output, retain_freed_memory()"
        add(f"quantize(x, {fmt!r})", lambda: emunum.quantize(x, fmt), note)
        add(f"quantize(x, {fmt!r}, 'stochastic')", lambda: emunum.quantize(x, fmt, "stochastic", seed=1), note)
        add("quantize(x, 'nvfp4')", lambda: emunum.quantize(x, "nvfp4"), note)
        add("out.copy_(x) (again, after)", lambda: out.copy_(x), "the ceiling re-measured: load drift")
    report(rows, n, device, repeats)


SCALE_RULE_ELEMENTS = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1", "mxint8")


def scale_rules(n: int, device: str, repeats: int, mode: str = "nearest") -> None:
    """quantize(x, "<preset>_<rule>", mode, seed=1, out=out) for ceil, even and rceil beside the preset itself
    (floor: the OCP rule, today's path and the baseline), same x, same run. The four formats of an element type
    are timed in turn, round after round (``repeats`` rounds), each keeping its best: load drift on a shared
    machine then hits them alike. "% floor" is the rule's rate as a share of floor's."""
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n // 32, 32, device=device, generator=g) * torch.logspace(-8, 8, n // 32, device=device)[:, None]
    out = torch.empty_like(x)
    print(f"\nscale rules: n = {x.numel()} float32 elements on {device} (rows of one block, amax over 2**+-27), "
          f"{mode}, best of {repeats} interleaved rounds, out=out")
    print(f"{'format':<22} {'ms':>9} {'Melem/s':>10} {'% floor':>8}")
    for el in SCALE_RULE_ELEMENTS:
        names = [el] + [f"{el}_{rule}" for rule in ("ceil", "even", "rceil")]
        best = dict.fromkeys(names, float("inf"))
        for name in names:
            emunum.quantize(x, name, mode, seed=1, out=out)  # warm-up (and compilation)
        for _ in range(repeats):
            for name in names:
                best[name] = min(best[name], best_seconds(
                    lambda name=name: emunum.quantize(x, name, mode, seed=1, out=out), device, 1))
        b = best[el]
        for name in names:
            label = name + " (floor)" if name == el else name
            print(f"{label:<22} {best[name] * 1e3:>9.2f} {x.numel() / best[name] / 1e6:>10.1f} "
                  f"{100 * b / best[name]:>7.0f}%")


NVFP4_FAMILY = ("nvfp4_2d", "nvfp4_1l", "nvfp4_row", "nvfp4_b32", "nvfp4_ue5m3", "nvfp4_4over6",
                "nvfp4_4over6_mse", "nvfp4_4over6_2d")


def nvfp4_family(n: int, device: str, repeats: int, mode: str = "nearest") -> None:
    """Each NVFP4-family preset (out=, x of shape (n / 1024, 1024): rows for the per-row and 2-D variants) beside
    today's nvfp4 path on the same tensor, in rounding mode ``mode`` (seed 1). All formats are timed in turn,
    round after round (``repeats`` rounds, nvfp4 first and again last in each), each keeping its best: load drift
    on a shared machine then hits them alike. "% nvfp4" is the share of nvfp4's best rate in the same mode (the
    speed rule: each variant at >= 80%)."""
    g = torch.Generator(device=device).manual_seed(0)
    x = (torch.randn(n, device=device, generator=g) * 100).reshape(-1, 1024)
    out = torch.empty_like(x)
    names = ("nvfp4",) + NVFP4_FAMILY
    for name in names:
        emunum.quantize(x, name, mode, seed=1, out=out)  # warm-up (and compilation)
    best = dict.fromkeys(names, float("inf"))
    for _ in range(repeats):
        for name in names + ("nvfp4",):
            best[name] = min(best[name], best_seconds(lambda name=name: emunum.quantize(x, name, mode, seed=1, out=out),
                                                      device, 1))
    base = best["nvfp4"]
    print(f"\nNVFP4 family: quantize(x, name, {mode!r}, seed=1, out=out), x {tuple(x.shape)} float32 on {device}, "
          f"best of {repeats} interleaved rounds")
    print(f"{'format':<22} {'ms':>9} {'Melem/s':>10} {'% nvfp4':>8}")
    for name in names:
        print(f"{name:<22} {best[name] * 1e3:>9.3f} {x.numel() / best[name] / 1e6:>10.1f} "
              f"{100 * base / best[name]:>7.0f}%")


MXPLUS_ELEMENTS = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1")


def mxplus(n: int, device: str, repeats: int) -> None:
    """quantize(x, "<preset>_plus", mode, out=out) beside the plain MX preset of the same element type (today's
    path, the baseline), same x, timed alternately round after round (``repeats`` rounds), each keeping its
    best; "plus/plain speed" is the plain time over the MX+ time (the speed rule: >= 80%)."""
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n // 32, 32, device=device, generator=g) * torch.logspace(-8, 8, n // 32, device=device)[:, None]
    out = torch.empty_like(x)
    print(f"\nMX+: n = {x.numel()} float32 elements on {device} (rows of one block, amax over 2**+-27), best of "
          f"{repeats} interleaved rounds, out=out")
    print(f"{'format':<18} {'mode':<10} {'plus ms':>8} {'plain ms':>9} {'plus/plain speed':>17}")
    for el in MXPLUS_ELEMENTS:
        for mode in ("nearest", "stochastic"):
            names = (el, el + "_plus")
            best = dict.fromkeys(names, float("inf"))
            for name in names:
                emunum.quantize(x, name, mode, seed=1, out=out)  # warm-up (and compilation)
            for _ in range(repeats):
                for name in names:
                    best[name] = min(best[name], best_seconds(
                        lambda name=name: emunum.quantize(x, name, mode, seed=1, out=out), device, 1))
            print(f"{el + '_plus':<18} {mode:<10} {best[names[1]] * 1e3:>8.2f} {best[el] * 1e3:>9.2f} "
                  f"{100 * best[el] / best[names[1]]:>16.0f}%")
    if device == "cpu":
        mxplus_serial_kernels(x.numpy(), out.numpy(), repeats)


def mxplus_serial_kernels(x, out, repeats: int) -> None:
    """The serial float32 round-to-nearest kernels alone (one thread, no dispatch): MX+'s fast path
    (kernels/mxplus_fast.py) beside plain MX's (kernels/block_fast.py pow2), alternately, best of 6 * repeats."""
    from emunum.block_quantize import block_args
    from emunum.kernels import block_fast, mxplus_fast
    from emunum.mxplus_quantize import mxplus_args

    flat, dst = x.reshape(-1), out.reshape(-1)
    bits, dbits, sc = flat.view(np.uint32), dst.view(np.uint32), np.empty(flat.size // 32)
    print(f"\nserial kernels alone, {flat.size} float32 elements in blocks of 32, nearest, best of {6 * repeats}")
    print(f"{'format':<18} {'plus ms':>8} {'plain ms':>9} {'plus/plain speed':>17}")
    for el in MXPLUS_ELEMENTS:
        b = block_args(emunum.get_format(el), 1.0)
        kind, man, emin, sub, emax_e, max_e, negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min, _ = b
        runs = {"plain": lambda: block_fast.pow2_range(0, sc.size, flat, bits, dst, dbits, sc, 32, 32, man, emin, sub,
                                                       emax_e, max_e, negzero, lo, hi, s_man, s_emin, s_sub, s_max,
                                                       s_min, rule),
                "plus": lambda: mxplus_fast.fast_range(0, mxplus_fast.chunks(sc.size), flat, bits, dst, sc, 32, 32,
                                                       *mxplus_args(emunum.get_format(el + "_plus"))[:9])}
        best = dict.fromkeys(runs, float("inf"))
        for fn in runs.values():
            fn()
        for _ in range(6 * repeats):
            for k, fn in runs.items():
                t = time.perf_counter()
                fn()
                best[k] = min(best[k], time.perf_counter() - t)
        print(f"{el + '_plus':<18} {best['plus'] * 1e3:>8.2f} {best['plain'] * 1e3:>9.2f} "
              f"{100 * best['plain'] / best['plus']:>16.0f}%")


def report(rows, n: int, device: str, repeats: int) -> None:
    """The table: ms, Melem/s and the share of the first row's (copy_'s) rate."""

    copy_rate = n / rows[0][1] / 1e6
    print(f"\nn = {n} float32 elements on {device}, best of {repeats}")
    print(f"{'operation':<46} {'ms':>9} {'Melem/s':>10} {'% copy':>7}  note")
    for name, sec, note in rows:
        if sec is None:
            print(f"{name:<46} {'-':>9} {'-':>10} {'-':>7}  {note}")
            continue
        rate = n / sec / 1e6
        print(f"{name:<46} {sec * 1e3:>9.2f} {rate:>10.1f} {100 * rate / copy_rate:>6.0f}%  {note}")


def crossover(repeats: int, fmt_name: str) -> None:
    """Serial vs parallel CPU float kernel (nearest, float32) at 2**10..2**20 elements."""
    from emunum.kernels import cpu
    from emunum.rng import seed_key

    fmt = emunum.get_format(fmt_name)
    man, emin, sub, mx, ovf, negzero = fmt.to_kernel_args()
    print(f"\nserial vs parallel CPU kernel, {fmt.name}, nearest, float32, best of {repeats} "
          f"(kernels.cpu.PARALLEL_MIN = {cpu.PARALLEL_MIN})")
    print(f"{'n':>9} {'serial us':>10} {'parallel us':>12} {'serial Melem/s':>15} {'parallel Melem/s':>17}  faster")
    first_parallel = None
    for p in range(10, 21):
        n = 1 << p
        src = (np.random.default_rng(p).standard_normal(n) * 100).astype(np.float32)
        dst = np.empty_like(src)
        inner = max(1, (1 << 22) // n)
        times = {}
        for par in (False, True):
            times[par] = best_seconds(
                lambda: cpu.quantize_float(src, dst, man, emin, sub, mx, ovf, negzero, 0, seed_key(0), 32,
                                           parallel=par), "cpu", repeats, inner)
        faster = "parallel" if times[True] < times[False] else "serial"
        if faster == "parallel" and first_parallel is None:
            first_parallel = n
        elif faster == "serial":
            first_parallel = None  # the crossover is where parallel wins from then on
        print(f"{n:>9} {times[False] * 1e6:>10.1f} {times[True] * 1e6:>12.1f} {n / times[False] / 1e6:>15.1f} "
              f"{n / times[True] / 1e6:>17.1f}  {faster}")
    if first_parallel is None:
        print("crossover: none up to 2**20 (serial was faster at the largest size)")
    else:
        print(f"crossover: parallel is faster from n = {first_parallel} (2**{first_parallel.bit_length() - 1}) on")


COLD_PROBE = r"""
import json, time
t0 = time.perf_counter()
import torch, emunum
t1 = time.perf_counter()
x = torch.randn(1 << 20)
t2 = time.perf_counter(); emunum.quantize(x, FMT); t3 = time.perf_counter()
emunum.quantize(x, FMT, "stochastic", seed=0); t4 = time.perf_counter()
steady = []
for _ in range(5):
    t = time.perf_counter()
    emunum.quantize(x, FMT)
    steady.append(time.perf_counter() - t)
print(json.dumps({"import": t1 - t0, "first_nearest": t3 - t2, "first_stochastic": t4 - t3,
                  "steady_nearest": min(steady)}))
"""


def cold(fmt: str) -> None:
    """Fresh processes sharing one new, empty NUMBA_CACHE_DIR: the first compiles, the second loads."""
    print(f"\ncold start: python -c 'import emunum; quantize(2**20 float32, {fmt!r})' in fresh processes")
    print(f"{'run':<34} {'import s':>9} {'1st nearest s':>14} {'1st stochastic s':>17} {'steady ms':>10}")
    with tempfile.TemporaryDirectory(prefix="emunum-numba-cache-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        for label in ("empty numba cache (compiles)", "warm numba cache (loads)"):
            r = subprocess.run([sys.executable, "-c", COLD_PROBE.replace("FMT", repr(fmt))], env=env, cwd=ROOT,
                               capture_output=True, text=True, timeout=1200)
            if r.returncode != 0:
                print(f"{label:<34} failed:\n{r.stderr}")
                return
            d = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"{label:<34} {d['import']:>9.2f} {d['first_nearest']:>14.2f} {d['first_stochastic']:>17.2f} "
                  f"{d['steady_nearest'] * 1e3:>10.2f}")


# each 2026 format beside today's path for the same element type (the same kernel's format, or the block
# format of the nearest existing element): P3109 signed formats are the float kernel's FloatFormat twin
# (e5m2fnuz has p3109_k8p3f's values); unsigned ones add the x < 0 -> NaN pass to the float kernel of the
# same precision and exponent width; the integer block presets run the BlockFormat path of integer elements
# (mxint8's); nvint4 is also shown beside nvfp4, whose e2m1 elements have a fast path of their own. HiFloat8
# (its own kernel, kernels/hifloat8_cpu.py) is shown beside e4m3, the float kernel of its widest precision.
NEW_FORMAT_PAIRS = (("p3109_k8p3", "e5m2fnuz"), ("p3109_k8p3f", "e5m2fnuz"), ("p3109_k8p4", "e4m3fnuz"),
                    ("p3109_k8p4uf", "e5m3"), ("mxint4", "mxint8"), ("nvint4", "mxint8"), ("nvint4", "nvfp4"),
                    ("hifloat8", "e4m3"))


def new_formats(n: int, device: str, repeats: int, only: str | None = None) -> None:
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n, device=device, generator=g) * 100
    out = torch.empty_like(x)
    inner = max(1, (1 << 22) // n)  # calls per timing: small n times the serial loops, steadier on a loaded VM
    print(f"\nn = {n} float32 elements on {device}, quantize(x, fmt, mode, out=out), {inner} calls per timing, best of {repeats} "
          "timings taken alternately with the baseline's")
    print(f"{'format':<14} {'baseline':<10} {'mode':<10} {'new ms':>8} {'base ms':>8} {'new/base speed':>15}")
    for new, base in NEW_FORMAT_PAIRS:
        if only is not None and new != only:
            continue
        for mode in ("nearest", "stochastic"):
            tb = tn = float("inf")
            for _ in range(repeats):  # interleaved, so that load drift hits both alike
                tb = min(tb, best_seconds(lambda: emunum.quantize(x, base, mode, seed=1, out=out), device, 1, inner))
                tn = min(tn, best_seconds(lambda: emunum.quantize(x, new, mode, seed=1, out=out), device, 1, inner))
            print(f"{new:<14} {base:<10} {mode:<10} {tn * 1e3:>8.2f} {tb * 1e3:>8.2f} {100 * tb / tn:>14.0f}%")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1 << 24, help="elements (default 2**24 = 16M)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--format", default="fp8_152", help="emunum format (default fp8_152, to compare with torch's cast)")
    p.add_argument("--repeats", type=int, default=5, help="timings per figure; the best is reported")
    p.add_argument("--crossover", action="store_true", help="serial vs parallel CPU kernel at 2**10..2**20")
    p.add_argument("--cold", action="store_true", help="import + first call in fresh processes, empty numba cache")
    p.add_argument("--blocks-only", action="store_true", help="only copy_ and the block-format rows (MXFP8, NVFP4)")
    p.add_argument("--new-formats", action="store_true", help="only the 2026 formats beside their baselines")
    p.add_argument("--only", default=None, help="with --new-formats: only the rows of this new format (e.g. hifloat8)")
    p.add_argument("--scale-rules", action="store_true",
                   help="only the power-of-two scale rules (ceil, even, rceil) beside floor, per MX element type")
    p.add_argument("--nvfp4-family", action="store_true", help="only the NVFP4 family beside nvfp4 (docs/nvfp4.md)")
    p.add_argument("--mxplus", action="store_true", help="only the MX+ presets beside their plain MX presets")
    p.add_argument("--mode", choices=("nearest", "stochastic"), default="nearest",
                   help="with --nvfp4-family or --scale-rules: the rounding mode (default nearest)")
    args = p.parse_args(argv)
    if args.n < 1:
        p.error(f"--n={args.n} must be >= 1")
    if args.repeats < 1:
        p.error(f"--repeats={args.repeats} must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device")
    header(args.device)
    if args.new_formats:
        new_formats(args.n, args.device, args.repeats, args.only)
        return 0
    if args.scale_rules:
        scale_rules(args.n, args.device, args.repeats, args.mode)
        return 0
    if args.nvfp4_family:
        nvfp4_family(args.n, args.device, args.repeats, args.mode)
        return 0
    if args.mxplus:
        mxplus(args.n, args.device, args.repeats)
        return 0
    throughput(args.n, args.device, args.repeats, args.format, args.blocks_only)
    if args.crossover:
        crossover(args.repeats, args.format)
    if args.cold:
        cold(args.format)
    return 0


if __name__ == "__main__":
    sys.exit(main())
