"""Coverage of the seeds-until-precise rule's interval with the stopping rule included (emunum.analysis.sequential).

Synthetic paired iteration counts (lognormal, means 520 and 520 x 1.6, coefficient of variation ``cv`` each,
correlation ``rho`` of their logs) are run through the rule as ``make train`` runs it; per rule level and
scenario: how often the interval it stops on holds the true ratio, the mean seeds it took, and how often it
stopped precise (not at the cap).

    python benchmarks/sequential_coverage.py --trials 800 --levels 0.95 0.97 0.98
"""
from __future__ import annotations

import argparse
import math

import numpy as np

from emunum.analysis import sequential


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=800)
    ap.add_argument("--levels", type=float, nargs="+", default=[0.95, sequential.LEVEL])
    ap.add_argument("--start", type=int, default=sequential.Rule.start)
    ap.add_argument("--resamples", type=int, default=2000)
    args = ap.parse_args(argv)
    print(f"{'level':>5} {'start':>5} {'cv':>5} {'rho':>4} {'coverage':>8} {'mean seeds':>10} {'precise':>7}")
    for level in args.levels:
        rule = sequential.Rule(start=args.start, level=level)
        for cv, rho in ((0.08, 0.3), (0.10, 0.3), (0.15, 0.3), (0.20, 0.3), (0.10, 0.0)):
            rng = np.random.default_rng(99)
            s = math.sqrt(math.log1p(cv * cv))
            hits, seeds, precise = 0, [], 0
            for t in range(args.trials):
                z1, z2 = rng.standard_normal(rule.cap), rng.standard_normal(rule.cap)
                x = 520 * np.exp(s * z1 - s * s / 2)
                y = 520 * 1.6 * np.exp(s * (rho * z1 + math.sqrt(1 - rho * rho) * z2) - s * s / 2)
                n = rule.start
                while True:
                    iv = sequential.paired_ratio(y[:n], x[:n], range(n), range(n), rule, resamples=args.resamples,
                                                 seed=t)
                    d = sequential.decide(iv, n, rule)
                    if d.stop:
                        break
                    n = d.next_seeds
                hits += iv.low <= 1.6 <= iv.high
                seeds.append(n)
                precise += d.precise
            print(f"{level:>5} {rule.start:>5} {cv:>5} {rho:>4} {hits / args.trials:>8.4f} {np.mean(seeds):>10.2f} "
                  f"{precise / args.trials:>7.3f}", flush=True)


if __name__ == "__main__":
    main()
