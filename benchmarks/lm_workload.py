"""The language-model workload over seeds: iterations to ``target_loss`` and bits per byte, per format,
with 95% confidence intervals; fp32 is the baseline measured in the same sweep.

    python benchmarks/lm_workload.py --out /tmp/lmbench --seeds 5 --formats fp32,bf16,fp8 --jobs 2
    python benchmarks/lm_workload.py --summarize /tmp/lmbench      # only read existing runs

Each run is ``python experiments/train.py experiment=lm format=F seed=S log=quiet checkpoint_every=0
hydra.run.dir=<out>/F_sS`` (``--jobs`` of them at a time). Statistics:
- mean and a Student-t 95% CI over the seeds that reached the target. Runs that did not reach it are
  censored: they are counted in the "reached" column, and a format with any censored run gets no CI
  (a CI over the survivors alone would understate its iterations);
- the ratio of a format's mean iterations to fp32's, with a 95% percentile-bootstrap CI (10,000
  resamples of the seeds, paired by seed where both formats have the seed, fixed generator seed 0);
- final/best validation bits per byte and seconds per training iteration: mean and t CI over all runs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def run_one(out: Path, fmt: str, seed: int, extra: list[str]) -> Path:
    d = out / f"{fmt}_s{seed}"
    cmd = [sys.executable, str(ROOT / "experiments" / "train.py"), "experiment=lm", f"format={fmt}", f"seed={seed}",
           "log=quiet", "checkpoint_every=0", f"hydra.run.dir={d}", *extra]
    with open(out / f"{fmt}_s{seed}.log", "w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False, env=dict(os.environ))
    return d


def t_ci(xs: list[float]) -> tuple[float, float, float]:
    from scipy.stats import t

    m = float(np.mean(xs))
    if len(xs) < 2:
        return m, math.nan, math.nan
    h = float(t.ppf(0.975, len(xs) - 1) * np.std(xs, ddof=1) / math.sqrt(len(xs)))
    return m, m - h, m + h


def ratio_ci(a: dict[int, float], b: dict[int, float], resamples: int = 10_000) -> tuple[float, float, float]:
    """mean(a)/mean(b) and its percentile-bootstrap 95% CI, resampling the shared seeds in pairs."""
    seeds = sorted(set(a) & set(b))
    x, y = np.array([a[s] for s in seeds]), np.array([b[s] for s in seeds])
    g = np.random.default_rng(0)
    idx = g.integers(0, len(seeds), size=(resamples, len(seeds)))
    r = x[idx].mean(axis=1) / y[idx].mean(axis=1)
    return float(x.mean() / y.mean()), float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))


def fmt_ci(m, lo, hi, spec=".4g") -> str:
    if math.isnan(lo):
        return f"{m:{spec}}"
    return f"{m:{spec}} [{lo:{spec}}, {hi:{spec}}]"


def summarize(out: Path, baseline: str = "fp32") -> str:
    runs: dict[str, dict[int, dict]] = {}
    for p in sorted(out.glob("*/results.json")):
        r = json.loads(p.read_text())
        runs.setdefault(r["format"], {})[int(r["seed"])] = r
    if baseline not in runs:
        raise SystemExit(f"no {baseline} runs under {out}")
    digests = {r["data_sha256"] for rs in runs.values() for r in rs.values()}
    lines = [f"runs under {out}; corpus sha256 {', '.join(sorted(map(str, digests)))}; "
             f"target_loss {next(iter(runs[baseline].values()))['target_loss']} nats/byte", "",
             "| format | reached | iterations to target (mean [95% t CI]) | ratio to fp32 [95% bootstrap CI] | "
             "final bits/byte | best bits/byte | ms/iteration |", "|---|---|---|---|---|---|---|"]
    base = {s: r["iterations_to_accuracy"] for s, r in runs[baseline].items() if r["status"] == "reached"}
    order = [baseline] + sorted(f for f in runs if f != baseline)
    for f in order:
        rs = runs[f]
        reached = {s: r["iterations_to_accuracy"] for s, r in rs.items() if r["status"] == "reached"}
        censored = len(rs) - len(reached)
        if reached:
            m, lo, hi = t_ci(list(reached.values()))
            its = (fmt_ci(m, lo, hi, ".0f") if not censored
                   else f"{m:.0f} over reached only (no CI: {censored} censored)")
        else:
            its = "none reached"
        if reached and not censored and len(base) == len(runs[baseline]) and len(set(reached) & set(base)) >= 2:
            rat = fmt_ci(*ratio_ci(reached, base), ".3f")
        else:
            rat = "n/a"
        fin = fmt_ci(*t_ci([r["final_bits_per_byte"] for r in rs.values()]), ".4f")
        best = fmt_ci(*t_ci([r["best_bits_per_byte"] for r in rs.values()]), ".4f")
        ms = fmt_ci(*t_ci([1e3 * r["seconds_per_iteration"] for r in rs.values()]), ".1f")
        lines.append(f"| {f} | {len(reached)}/{len(rs)} | {its} | {rat} | {fin} | {best} | {ms} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="directory for the run directories")
    ap.add_argument("--summarize", type=Path, help="only summarise the runs under this directory")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--formats", default="fp32,bf16,fp8")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("extra", nargs="*", help="more train.py overrides, e.g. max_iters=2000")
    a = ap.parse_args(argv)
    if a.summarize is not None:
        print(summarize(a.summarize))
        return
    if a.out is None:
        ap.error("give --out DIR (or --summarize DIR)")
    a.out.mkdir(parents=True, exist_ok=True)
    jobs = [(f, s) for f in a.formats.split(",") for s in range(a.seeds)]
    with ThreadPoolExecutor(a.jobs) as ex:
        list(ex.map(lambda j: run_one(a.out, j[0], j[1], a.extra), jobs))
    print(summarize(a.out))


if __name__ == "__main__":
    main()
