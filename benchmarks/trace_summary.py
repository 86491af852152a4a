"""Summarise the ``trace=true`` counters of a training run: per layer and role, the mean over evaluation
windows (early: the first third of the run; late: the last third) of the overflow and underflow fractions and
the SQNR, read from the run's TensorBoard events (tags ``emunum/<layer>/<role>/...``).

    python experiments/train.py format=fp8 trace=true stop_at_target=false max_iters=1500 eval_every=100 \\
        hydra.run.dir=/work/runs/fp8_trace
    python benchmarks/trace_summary.py /work/runs/fp8_trace
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    args = ap.parse_args(argv)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(Path(args.run_dir) / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = [t for t in acc.Tags()["scalars"] if t.startswith("emunum/")]
    rows = {}
    for t in tags:
        _, layer, role, what = t.split("/", 3)
        ev = acc.Scalars(t)
        k = max(1, len(ev) // 3)
        rows.setdefault((layer, role), {})[what] = (statistics.fmean(e.value for e in ev[:k]),
                                                   statistics.fmean(e.value for e in ev[-k:]))
    print(f"{'layer':10s} {'role':12s} {'underflow early':>16s} {'late':>10s} {'overflow early':>15s} {'late':>10s} "
          f"{'SQNR dB early':>14s} {'late':>8s}")
    for (layer, role), d in sorted(rows.items()):
        u, o, q = d.get("underflow", (0, 0)), d.get("overflow", (0, 0)), d.get("sqnr_db", (float("nan"),) * 2)
        print(f"{layer:10s} {role:12s} {u[0]:16.3e} {u[1]:10.3e} {o[0]:15.3e} {o[1]:10.3e} {q[0]:14.1f} {q[1]:8.1f}")


if __name__ == "__main__":
    main()
