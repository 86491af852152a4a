"""The GPU run in one command: real-GPU bit-exactness tests, and the GPU figures that no one has measured yet.

    bash benchmarks/gpu_check.sh [--smoke] [OUTDIR]       # or: python benchmarks/gpu_check.py [--smoke] [OUTDIR]

Sections, each in its own process (a CUDA fault in one cannot take the others down) with its own time limit,
all within --budget seconds (default 470 on a GPU: under 8 minutes):

- ``quantize``: emunum.quantize(out=) throughput on 2**26 float32 elements beside ``out.copy_(x)`` (goal: >= 70%
  of copy's rate), and the launch shape of the element-wise kernels (kernels/cuda.py THREADS_PER_BLOCK x
  BLOCKS_PER_SM), the fastest shape reported;
- ``crossover``: ``CUDA_TORCH_PATH_MAX_NUMEL`` (emunum/quantize.py), the size up to which the pure-torch path
  beats one numba-cuda launch: both paths timed at 4**k elements;
- ``gemm``: emunum.matmul GMAC/s on 2048^3 for the fp8 recipe's MAD unit (goal: >= 300 GMAC/s), a stochastic
  unit and the h100_fp8_e4m3 tensor-core preset, each beside torch.matmul float32 on the same operands;
- ``recipe``: one training step of the default CNN under the fp8 recipe against fp32, on the device;
- ``tests``: the CUDA test files (CPU == CUDA bit for bit: every number system's kernels and every MAD unit's
  GEMM) with ``NUMBA_ENABLE_CUDASIM=0``, given the time the other sections left; each test's outcome is logged as
  it is known (``gpu_test_log.py``), so a run stopped by its limit still names its failures.

Without a CUDA device, or with --smoke, it runs the same sections on the CPU at toy sizes (the simulator-level
check of this script itself: ``tests`` then only collects the ``gpu``-marked tests, which skip, and
``crossover`` is skipped) and says that the GPU checks were skipped. It writes ONE file, OUTDIR/gpu_check.json
(OUTDIR: the argument, else $OUT, else benchmarks/gpu_results), and prints each measured constant with how
to set it. The exit status is 0 when every section ran (a missed goal or a failed test is a finding recorded
in the file, not a crash of the check), 1 when a section crashed or timed out.
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
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOAL_COPY_SHARE = 0.70
GOAL_GMACS = 300.0

# The CUDA test files: every number system's elementwise kernels (float, fixed, posit, table, log, custom,
# block formats, the NVFP4 family, MX+, P3109, HiFloat8), the RNG, every MAD unit's CUDA GEMM (general,
# multi-term, approximate multipliers), the matrix instructions, and every kernel's lowering for the CUDA target.
CUDA_TESTS = [
    "tests/kernels/test_cuda.py", "tests/kernels/test_cuda_lowering.py", "tests/kernels/test_block_cuda.py",
    "tests/kernels/test_posit_kernels.py",
    "tests/kernels/test_table_log_kernels.py", "tests/kernels/test_gemm_cuda.py",
    "tests/kernels/test_gemm_multiterm_cuda.py", "tests/formats/test_custom.py", "tests/test_mad_multiplier.py",
    "tests/test_fasi_vectors.py", "tests/test_rng.py", "tests/kernels/test_nvfp4_cuda.py",
    "tests/kernels/test_mxplus_cuda.py", "tests/kernels/test_new_formats_cuda.py", "tests/kernels/test_mma_cuda.py",
]
SECTIONS = ("quantize", "crossover", "gemm", "recipe", "tests")
LIMITS = {"quantize": 60, "crossover": 60, "gemm": 90, "recipe": 90}  # seconds on a GPU; tests get the rest
SMOKE_LIMIT = 300  # seconds per section in smoke mode: CPU kernels may compile cold on a busy machine


# ---- timing ------------------------------------------------------------------------------------------------

def best_seconds(fn, device: str, repeats: int) -> float:
    """Best wall time of one call of fn over ``repeats`` timings, after one untimed warm-up (which compiles)."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best


def crossover_max_numel(sizes, kernel_s, torch_s) -> int:
    """The largest size s such that the torch path was no slower than the kernel at every measured size <= s
    (0 when the kernel won at the smallest size). ``sizes`` ascending; the other two: seconds per size."""
    best = 0
    for n, k, t in zip(sizes, kernel_s, torch_s):
        if t > k:
            break
        best = n
    return best


# ---- sections (each runs in a child process) ---------------------------------------------------------------

def sec_quantize(device: str, smoke: bool, put) -> dict:
    import torch

    import emunum

    n = 2**16 if smoke else 2**26
    reps = 2 if smoke else 10
    x = torch.randn(n, device=device) * 100
    out = torch.empty_like(x)
    t_copy = best_seconds(lambda: out.copy_(x), device, reps)
    rows = []
    for fmt, mode in (("e4m3fn", "nearest"), ("e5m2", "stochastic"), ("int8", "nearest")):
        t = best_seconds(lambda: emunum.quantize(x, fmt, mode, seed=1, out=out), device, reps)
        rows.append({"fmt": fmt, "mode": mode, "melem_s": n / t / 1e6, "share_of_copy": t_copy / t})
        put({"numel": n, "rows": rows})
    res = {"numel": n, "dtype": "float32", "copy_melem_s": n / t_copy / 1e6,
           "copy_GB_s": 8 * n / t_copy / 1e9, "rows": rows, "goal_share_of_copy": GOAL_COPY_SHARE,
           "goal_met": all(r["share_of_copy"] >= GOAL_COPY_SHARE for r in rows)}
    if device == "cuda":
        from emunum.kernels import cuda as kc

        shapes = []
        saved = (kc.THREADS_PER_BLOCK, kc.BLOCKS_PER_SM)
        try:
            for tpb in (128, 256, 512, 1024):
                for bps in (4, 8, 16, 32):
                    kc.THREADS_PER_BLOCK, kc.BLOCKS_PER_SM = tpb, bps
                    t = best_seconds(lambda: emunum.quantize(x, "e4m3fn", out=out), device, 5)
                    shapes.append({"THREADS_PER_BLOCK": tpb, "BLOCKS_PER_SM": bps, "share_of_copy": t_copy / t})
                    put({**res, "launch_shapes": shapes})
        finally:
            kc.THREADS_PER_BLOCK, kc.BLOCKS_PER_SM = saved
        best = max(shapes, key=lambda r: r["share_of_copy"])
        res["launch_shapes"] = shapes
        res["measured"] = {"kernels.cuda.THREADS_PER_BLOCK": best["THREADS_PER_BLOCK"],
                           "kernels.cuda.BLOCKS_PER_SM": best["BLOCKS_PER_SM"]}
    return res


def sec_crossover(device: str, smoke: bool, put) -> dict:
    if device != "cuda":
        return {"skipped": "needs a CUDA device: the torch path is taken by CUDA tensors only"}
    import importlib

    import torch

    import emunum

    qmod = importlib.import_module("emunum.quantize")
    sizes = [4**k for k in range(0, 10)]  # 1 .. 262144
    saved = qmod.CUDA_TORCH_PATH_MAX_NUMEL
    rows = []
    try:
        for fmt, mode in (("e4m3fn", "nearest"), ("e5m2", "stochastic")):
            tk, tt = [], []
            for n in sizes:
                x = torch.randn(n, device=device)
                qmod.CUDA_TORCH_PATH_MAX_NUMEL = 0  # always the kernel
                tk.append(best_seconds(lambda: emunum.quantize(x, fmt, mode, seed=1), device, 20))
                qmod.CUDA_TORCH_PATH_MAX_NUMEL = 2**62  # always the torch path
                tt.append(best_seconds(lambda: emunum.quantize(x, fmt, mode, seed=1), device, 20))
            rows.append({"fmt": fmt, "mode": mode, "sizes": sizes, "kernel_us": [t * 1e6 for t in tk],
                         "torch_path_us": [t * 1e6 for t in tt], "max_numel": crossover_max_numel(sizes, tk, tt)})
            put({"rows": rows})
    finally:
        qmod.CUDA_TORCH_PATH_MAX_NUMEL = saved
    # one threshold serves every mode: the smallest crossover keeps the torch path from losing anywhere
    return {"rows": rows, "estimate_in_code": saved,
            "measured": {"CUDA_TORCH_PATH_MAX_NUMEL": min(r["max_numel"] for r in rows)}}


def sec_gemm(device: str, smoke: bool, put) -> dict:
    import torch

    import emunum
    from emunum import MADUnit

    m = 32 if smoke else 2048
    reps = 1 if smoke else 3
    g = torch.Generator().manual_seed(0)
    A = emunum.quantize(torch.randn(m, m, generator=g), "fp8_152").to(device)
    B = emunum.quantize(torch.randn(m, m, generator=g), "fp8_152").to(device)
    macs = m**3
    t_ref = best_seconds(lambda: torch.matmul(A, B), device, reps)
    units = {"fp8 recipe (1-5-2 products, 1-6-9 chunk-64 accumulator)": MADUnit("fp8_152", "fp16_169", chunk=64),
             "stochastic accumulator": MADUnit("fp8_152", "fp16_169", acc_rounding="stochastic", chunk=64),
             "preset h100_fp8_e5m2": MADUnit.preset("h100_fp8_e5m2")}
    rows = []
    for name, unit in units.items():
        t = best_seconds(lambda: emunum.matmul(A, B, unit, seed=0), device, reps)
        rows.append({"unit": name, "repr": str(unit), "gmac_s": macs / t / 1e9, "torch_matmul_gmac_s": macs / t_ref / 1e9})
        put({"size": m, "rows": rows})
    return {"size": m, "operands": "e5m2 values in float32", "rows": rows, "goal_gmac_s": GOAL_GMACS,
            "goal_met": rows[0]["gmac_s"] >= GOAL_GMACS}


def sec_recipe(device: str, smoke: bool, put) -> dict:
    import torch
    from hydra import compose, initialize_config_dir

    sys.path.insert(0, ROOT)
    from emunum.optim import derive_seed
    from experiments import data as data_mod
    from experiments import models
    from experiments.loop import loss_fn, seed_step
    from experiments.recipe import apply_format, make_optimizer, make_scaler
    from experiments.schema import register

    register()
    dev = torch.device(device)
    steps = 2 if smoke else 20
    out = {}
    for name, overrides in (("fp32", ["format=fp32"]), ("fp8", ["format=fp8"])):
        with initialize_config_dir(config_dir=os.path.join(ROOT, "experiments", "conf"), version_base="1.3"):
            cfg = compose("train", overrides=overrides + [f"device={device}"])
        ds = data_mod.load(cfg.data)
        xtr, ytr = ds.x_train.to(dev), ds.y_train.to(dev)
        torch.manual_seed(derive_seed(int(cfg.seed), 0))
        model = apply_format(models.build(cfg.model, ds.input_shape, ds.num_outputs).to(dev), cfg.format,
                             mad=cfg.get("mad"))
        opt, scaler = make_optimizer(model, cfg), make_scaler(cfg.format.loss_scale)
        sampler = data_mod.BatchSampler(len(xtr), int(cfg.batch_size), int(cfg.seed))
        crit = loss_fn(ds.task)

        def step(it):
            seed_step(derive_seed(int(cfg.seed), 3, it), dev)
            idx = sampler.indices(it).to(dev)
            opt.zero_grad(set_to_none=True)
            loss = crit(model(xtr[idx]).float(), ytr[idx])
            if scaler is not None:
                scaler.scale_loss(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            return loss.detach().item()  # .item() synchronises

        step(0)  # compiles
        t = time.perf_counter()
        for it in range(1, steps + 1):
            step(it)
        out[name] = (time.perf_counter() - t) / steps
        put({"steps": steps, **{f"{k}_ms": v * 1e3 for k, v in out.items()}})
    return {"steps": steps, "fp32_ms": out["fp32"] * 1e3, "fp8_ms": out["fp8"] * 1e3, "ratio": out["fp8"] / out["fp32"]}


def sec_tests(device: str, smoke: bool, limit: float, workdir: str) -> dict:
    """pytest on CUDA_TESTS in a child (the simulator off on a GPU, both test tiers; in smoke the simulator on and
    only the ``gpu`` marker)."""
    xml, log = os.path.join(workdir, "junit.xml"), os.path.join(workdir, "tests.log")
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1" if smoke else "0", "PYTHONUNBUFFERED": "1",
           "EMUNUM_TEST_LOG": log, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    files = [f for f in CUDA_TESTS if os.path.exists(os.path.join(ROOT, f))]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "gpu_test_log", f"--junitxml={xml}",
           *files]
    if smoke:
        cmd += ["-m", "gpu"]
    else:  # both tiers: on a GPU the grids that the CPU suite samples (tests/tiers.py) are cheap
        cmd += ["-m", "exhaustive or not exhaustive"]
    if not smoke and _has_xdist():
        cmd += ["-n", str(min(8, os.cpu_count() or 1))]  # the GPU machine has 16 cores; kernels compile per worker
    t = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
        rc, tail = r.returncode, (r.stdout + r.stderr)[-4000:]
    except subprocess.TimeoutExpired as e:
        rc, tail = "timeout", ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""))[-4000:]
    res = {"files": files, "command": " ".join(cmd[1:]), "exit": rc, "seconds": time.perf_counter() - t,
           "output_tail": tail}
    counts = _junit_counts(xml)
    res.update(counts if "junit" not in counts else {**counts, **log_counts(log)})
    return res


def log_counts(path: str) -> dict:
    """``_junit_counts``' figures from the outcome log that ``gpu_test_log`` wrote as the tests ran (the run was
    stopped before pytest wrote its junit file): the tests that finished, and each failure and error by name."""
    if not os.path.exists(path):
        return {"log": "missing"}
    counts = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    failed = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            outcome, nodeid, msg = (line.rstrip("\n").split("\t") + ["", ""])[:3]
            if outcome not in counts:
                continue
            counts[outcome] += 1
            if outcome in ("failed", "error") and len(failed) < 100:
                failed.append({"test": nodeid, "message": msg})
    return {"log": "partial: the tests that finished before pytest was stopped", "tests": sum(counts.values()),
            "passed": counts["passed"], "failures": counts["failed"], "errors": counts["error"],
            "skipped": counts["skipped"], "failed": failed}


def _has_xdist() -> bool:
    import importlib.util

    return importlib.util.find_spec("xdist") is not None


def _junit_counts(path: str) -> dict:
    if not os.path.exists(path):
        return {"junit": "missing (pytest did not finish)"}
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failed = []
    for case in root.iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None and len(failed) < 100:
            failed.append({"test": f"{case.get('classname')}::{case.get('name')}",
                           "message": (bad.get("message") or "")[:500]})
    return {**counts, "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "failed": failed}


# ---- driver ------------------------------------------------------------------------------------------------

def _child(args) -> None:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0" if args.device == "cuda" else "1"  # read when numba.cuda is imported
    fn = {"quantize": sec_quantize, "crossover": sec_crossover, "gemm": sec_gemm, "recipe": sec_recipe}[args.section]

    def put(res: dict) -> None:
        """Write the section's result so far (a section that times out keeps what it measured)."""
        tmp = args.result + ".tmp"
        with open(tmp, "w") as f:
            json.dump(res, f)
        os.replace(tmp, args.result)

    put(fn(args.device, args.smoke, put))


def _cuda_device() -> str | None:
    """The CUDA device's name, or None (no torch CUDA, or numba-cuda missing)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        import importlib.util

        if importlib.util.find_spec("numba_cuda") is None:
            return None
        return torch.cuda.get_device_name(0)
    except Exception:
        return None


def _versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for p in ("torch", "numba", "numba-cuda", "numpy"):
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            out[p] = None
    return out


def _git() -> str:
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_all(out_dir: str, smoke: bool, budget: float | None, sections=SECTIONS) -> dict:
    start = time.perf_counter()
    asked_smoke = smoke
    gpu = None if smoke else _cuda_device()
    smoke = smoke or gpu is None
    budget = budget or (1800.0 if smoke else 470.0)
    device = "cuda" if gpu else "cpu"
    report = {"when": datetime.datetime.now().isoformat(timespec="seconds"), "git": _git(), "host": platform.node(),
              "gpu": gpu, "mode": "smoke" if smoke else "gpu", "versions": _versions(), "budget_s": budget,
              "sections": {}, "measured": {}}
    if smoke:
        why = "--smoke" if asked_smoke else "no CUDA device (torch.cuda.is_available() is False or numba-cuda is missing)"
        report["note"] = f"GPU checks skipped ({why}): toy sizes on the CPU; the gpu-marked tests only collected"
        print(f"gpu_check: {report['note']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as work:
        for name in sections:
            left = budget - (time.perf_counter() - start)
            limit = left - 5 if name == "tests" else min(SMOKE_LIMIT if smoke else LIMITS[name], left - 60)
            t = time.perf_counter()
            if limit <= 5:
                rec = {"status": "not run", "why": "out of time budget"}
            elif name == "tests":
                res = sec_tests(device, smoke, limit, work)
                ok = res["exit"] in (0, 1)  # 1: some tests failed, which the file records
                rec = {"status": "ok" if ok else ("timeout" if res["exit"] == "timeout" else "crashed"), "result": res}
            else:
                rec = _run_child(name, device, smoke, limit, work)
            rec["seconds"] = round(time.perf_counter() - t, 2)
            report["sections"][name] = rec
            report["measured"].update((rec.get("result") or {}).get("measured", {}))
            print(f"gpu_check: {name}: {rec['status']} ({rec['seconds']} s)", flush=True)
    report["seconds"] = round(time.perf_counter() - start, 2)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "gpu_check.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    _print_summary(report, path)
    return report


def _run_child(name, device, smoke, limit, work) -> dict:
    res_path = os.path.join(work, f"{name}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--section", name, "--device", device, "--result", res_path]
    if smoke:
        cmd.append("--smoke")
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        rec = {"status": "timeout", "limit_s": limit}
        if os.path.exists(res_path):  # what the section measured before its limit
            with open(res_path) as f:
                rec["partial"] = json.load(f)
        return rec
    if r.returncode != 0 or not os.path.exists(res_path):
        return {"status": "crashed", "exit": r.returncode, "output_tail": (r.stdout + r.stderr)[-4000:]}
    with open(res_path) as f:
        res = json.load(f)
    return {"status": "skipped" if "skipped" in res else "ok", "result": res}


def _print_summary(report: dict, path: str) -> None:
    s = report["sections"]
    q = s.get("quantize", {}).get("result")
    if q:
        worst = min(r["share_of_copy"] for r in q["rows"])
        print(f"quantize: worst {worst:.0%} of copy_ ({q['copy_GB_s']:.0f} GB/s copy); goal {GOAL_COPY_SHARE:.0%}: "
              f"{'met' if q['goal_met'] else 'NOT met'}")
    g = s.get("gemm", {}).get("result")
    if g:
        for r in g["rows"]:
            print(f"gemm {g['size']}^3 {r['unit']}: {r['gmac_s']:.1f} GMAC/s (torch.matmul {r['torch_matmul_gmac_s']:.0f})")
        print(f"gemm goal {GOAL_GMACS:.0f} GMAC/s for the fp8 recipe unit: {'met' if g['goal_met'] else 'NOT met'}")
    rc = s.get("recipe", {}).get("result")
    if rc:
        print(f"recipe step: fp8 {rc['fp8_ms']:.2f} ms, fp32 {rc['fp32_ms']:.2f} ms, ratio {rc['ratio']:.2f}")
    t = s.get("tests", {}).get("result")
    if t and "tests" in t:
        print(f"tests: {t['passed']} passed, {t['failures']} failed, {t['errors']} errors, {t['skipped']} skipped")
    for k, v in report["measured"].items():
        how = {"CUDA_TORCH_PATH_MAX_NUMEL": f"export EMUNUM_CUDA_TORCH_PATH_MAX_NUMEL={v}"}.get(
            k, f"set {k} = {v} (module attribute)")
        print(f"measured {k} = {v}: {how}")
    print(f"gpu_check: wrote {path}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", nargs="?", default=None,
                   help="where gpu_check.json goes (default: $OUT if set, else benchmarks/gpu_results)")
    p.add_argument("--smoke", action="store_true", help="toy sizes on the CPU; GPU checks skipped")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole check (default 470 on a GPU, 1800 in smoke mode)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    p.add_argument("--section", choices=[s for s in SECTIONS if s != "tests"], help=argparse.SUPPRESS)
    p.add_argument("--device", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.section:
        _child(args)
        return 0
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        p.error(f"--sections: unknown {bad}; allowed: {', '.join(SECTIONS)}")
    out_dir = args.out_dir or os.environ.get("OUT") or os.path.join(ROOT, "benchmarks", "gpu_results")
    report = run_all(out_dir, args.smoke, args.budget, sections)
    return 0 if all(r["status"] in ("ok", "skipped") for r in report["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
