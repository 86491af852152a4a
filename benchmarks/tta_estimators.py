"""Which iterations-to-accuracy estimator to use: every candidate scored on the same fixed-budget runs.

Each run logs its validation accuracy and loss at every evaluation (TensorBoard), so one set of runs serves
every candidate. Per candidate: per format the mean, standard deviation and coefficient of variation over
seeds; the paired ratio to the baseline with its 95% CI (emunum.analysis.stats) and that CI's half-width as a
fraction of the ratio; the seeds a ±10% half-width would need (normal approximation, from the per-seed
spread); rho, the correlation of a seed's log iterations in the two formats; and the bias against the plain
first crossing: the candidate's ratio minus first's, with a paired
bootstrap 95% interval over seeds.

    python experiments/train.py -m format=fp32 seed=0,1,2,3 stop_at_target=false max_iters=1000 eval_every=20 \\
        checkpoint_every=0 log=quiet hydra/launcher=joblib hydra.launcher.n_jobs=2 hydra.sweep.dir=RUNS/fp32_0
    (the same with format=fp8 max_iters=1500, and further seeds, into other folders below RUNS)
    python benchmarks/tta_estimators.py RUNS --target 0.88
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import statistics

import numpy as np

from emunum.analysis import crossing, curves, report, stats


def candidates(target: float, loss_target: float | None):
    """name -> function(accuracy points, loss points) -> iterations or None."""
    out = {
        "first": lambda a, l: crossing.first_crossing(a, target),
        "first@40": lambda a, l: crossing.first_crossing([p for p in a if p[0] % 40 == 0], target),
        "interpolated": lambda a, l: crossing.interpolated_crossing(a, target),
    }
    for k in (1, 2, 3, 5):
        out[f"smoothed k={k}"] = (lambda k: lambda a, l: crossing.smoothed_crossing(a, target, half_window=k))(k)
    if loss_target is not None:
        out[f"loss<={loss_target:.4f} interp"] = lambda a, l: crossing.interpolated_crossing(l, loss_target,
                                                                                             above=False)
    return out


def _pairs(per_seed: dict, base: str, fmt: str):
    seeds = sorted(set(per_seed[base]) & set(per_seed[fmt]))
    return seeds, np.array([per_seed[fmt][s] for s in seeds]), np.array([per_seed[base][s] for s in seeds])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs")
    ap.add_argument("--target", type=float, default=0.88)
    ap.add_argument("--baseline", default="fp32")
    args = ap.parse_args(argv)
    runs = [dataclasses.replace(r, format=r.format.split(" [")[0]) for r in report.load_sweep(args.runs)
            if r.status != report.Status.FAILED]  # a run still in progress has no results.json yet
    acc = {r.path: curves.load_curve(r.path, curves.ACCURACY_TAG) for r in runs}
    loss = {r.path: curves.load_curve(r.path, curves.VAL_LOSS_TAG) for r in runs}
    fmts = report.formats_in_order(runs, args.baseline)
    other = [f for f in fmts if f != args.baseline]

    # the loss target: the baseline's mean validation loss where its accuracy crosses the target (interpolated)
    at = []
    for r in runs:
        if r.format == args.baseline:
            x = crossing.interpolated_crossing(acc[r.path], args.target)
            if x is not None:
                at.append(float(np.interp(x, [s for s, _ in loss[r.path]], [v for _, v in loss[r.path]])))
    loss_target = statistics.fmean(at) if at else None

    # sampling noise against the evaluation-to-evaluation movement near the target
    resid, sampling = [], []
    for r in runs:
        pts = acc[r.path]
        sm = crossing.moving_average(pts, 2)
        for (s, v), (_, m, whole) in zip(pts, sm):
            if whole and abs(m - args.target) < 0.03:
                resid.append(v - m)
                sampling.append(m * (1 - m))
    if resid:
        n_val = 8000
        print(f"near the target (|5-point mean - target| < 0.03, {len(resid)} evaluations): sd of accuracy about "
              f"its 5-point moving average {statistics.stdev(resid):.4f}; binomial sampling sd at {n_val} "
              f"validation examples {math.sqrt(statistics.fmean(sampling) / n_val):.4f}")
    print(f"loss target (baseline's mean validation loss at its interpolated {args.target} crossing): "
          f"{loss_target}")
    print("runs: " + ", ".join(f"{f} {sum(r.format == f for r in runs)}" for f in fmts))

    cands = candidates(args.target, loss_target)
    table = {}
    for name, fn in cands.items():
        per_seed = {f: {} for f in fmts}
        for r in runs:
            x = fn(acc[r.path], loss[r.path])
            if x is not None and r.seed is not None:
                per_seed[r.format][r.seed] = x
        table[name] = per_seed
    rng = np.random.default_rng(stats.RNG_SEED)
    print()
    print(f"{'estimator':<24} {'format':<6} {'n':>3} {'mean':>7} {'sd':>6} {'cv':>6}   {'ratio [95% CI]':<24} "
          f"{'±%':>5} {'sd(r_i)':>7} {'rho':>5} {'seeds for ±10%':>14}   bias vs first [95% CI]")
    for name, per_seed in table.items():
        for f in fmts:
            vals = list(per_seed[f].values())
            missing = sum(r.format == f for r in runs) - len(vals)
            if len(vals) < 2 or missing:
                print(f"{name:<24} {f:<6} {len(vals):>3} runs cross; {missing} never do: not scored")
                continue
            line = (f"{name:<24} {f:<6} {len(vals):>3} {statistics.fmean(vals):>7.1f} {statistics.stdev(vals):>6.1f} "
                    f"{statistics.stdev(vals) / statistics.fmean(vals):>6.3f}")
            if f in other and len(_pairs(per_seed, args.baseline, f)[0]) >= 2:
                seeds, y, x = _pairs(per_seed, args.baseline, f)
                iv = stats.ratio_interval(y, x, num_keys=seeds, den_keys=seeds)
                half = max(iv.high - iv.estimate, iv.estimate - iv.low) / iv.estimate
                d = (y - iv.estimate * x) / (iv.estimate * x.mean())  # relative influence values of the ratio
                need = math.ceil((1.96 * d.std(ddof=1) / 0.1) ** 2)
                ri = y / x
                common = sorted(set(seeds) & set(_pairs(table["first"], args.baseline, f)[0]))
                cy, cx = (np.array([per_seed[g][s] for s in common]) for g in (f, args.baseline))
                py, px = (np.array([table["first"][g][s] for s in common]) for g in (f, args.baseline))
                diff = cy.mean() / cx.mean() - py.mean() / px.mean()
                idx = rng.integers(0, len(common), size=(stats.RESAMPLES, len(common)))
                bs = cy[idx].mean(1) / cx[idx].mean(1) - py[idx].mean(1) / px[idx].mean(1)
                lo, hi = np.quantile(bs, [0.025, 0.975])
                rho = float(np.corrcoef(np.log(x), np.log(y))[0, 1])  # of the pair's logs, over seeds
                line += (f"   {iv.estimate:.3f} [{iv.low:.3f}, {iv.high:.3f}] n={len(seeds):<3} {100 * half:>5.1f} "
                         f"{ri.std(ddof=1):>7.3f} {rho:>5.2f} {need:>14}   {diff:+.4f} [{lo:+.4f}, {hi:+.4f}]")
            print(line)


if __name__ == "__main__":
    main()
