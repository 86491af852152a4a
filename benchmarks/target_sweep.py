"""Where to put the default target: iterations-to-accuracy per seed for several candidate targets, read back
from a fixed-budget sweep (``stop_at_target=false``) of the default benchmark, with the 95% CI of each
format's mean and of the ratio to the baseline (emunum.analysis.stats), and each format's accuracy plateau.

    python experiments/train.py -m format=fp32,fp8 seed=0,1,2,3,4 stop_at_target=false max_iters=2500 \\
        eval_every=25 checkpoint_every=0 log=quiet hydra/launcher=joblib hydra.launcher.n_jobs=2 \\
        hydra.sweep.dir=/work/runs/var
    python benchmarks/target_sweep.py /work/runs/var --targets 0.85 0.87 0.88 0.89 0.9
"""
from __future__ import annotations

import argparse
import statistics

from emunum.analysis import curves, report, stats


def first_crossing(curve, target):
    return next((s for s, v in curve if v >= target), None)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep")
    ap.add_argument("--targets", type=float, nargs="+", default=[0.85, 0.87, 0.88, 0.89, 0.9])
    ap.add_argument("--baseline", default="fp32")
    args = ap.parse_args(argv)
    import dataclasses

    # pooled by format name: a fixed-budget sweep's runs differ only in the target keys this script varies
    runs = [dataclasses.replace(r, format=r.format.split(" [")[0]) for r in report.load_sweep(args.sweep)]
    cur = {r.path: curves.load_curve(r.path) for r in runs}
    fmts = report.formats_in_order(runs, args.baseline)
    print("plateau: mean validation accuracy over the last 20% of each run's evaluations")
    for f in fmts:
        tails = []
        for r in runs:
            c = cur[r.path]
            if r.format == f and c:
                tail = [v for _, v in c[int(0.8 * len(c)):]]
                tails.append(statistics.fmean(tail))
        print(f"  {f}: " + " ".join(f"{t:.4f}" for t in tails) + f"  (mean {statistics.fmean(tails):.4f})")
    for t in args.targets:
        print(f"target {t}:")
        per = {}
        for f in fmts:
            rs = [r for r in runs if r.format == f]
            vals, cens, seeds = [], [], []
            for r in rs:
                x = first_crossing(cur[r.path], t)
                vals.append(x if x is not None else r.iterations_run)
                cens.append(x is None)
                seeds.append(r.seed)
            per[f] = (vals, cens, seeds)
            iv = stats.mean_interval(vals, cens)
            ci = "n/a" if iv.low is None else f"[{iv.low:.0f}, {iv.high:.0f}]"
            print(f"  {f:6s} iters {vals}  mean {iv.estimate:.0f} {ci}"
                  f"  cv {statistics.stdev(vals) / statistics.fmean(vals):.3f}  not reached {sum(cens)}")
        b = per.get(args.baseline)
        for f in fmts:
            if f == args.baseline or b is None:
                continue
            v, c, s = per[f]
            r = stats.ratio_interval(v, b[0], num_censored=c, den_censored=b[1], num_keys=s, den_keys=b[2])
            ci = "n/a" if r.low is None else f"[{r.low:.3f}, {r.high:.3f}]"
            print(f"  ratio {f}/{args.baseline}: {r.estimate:.3f} {ci}  "
                  f"{stats.verdict(r).value}")


if __name__ == "__main__":
    main()
