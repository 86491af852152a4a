"""Seeds until precise: run every format on the same seeds, adding seeds until each format's ratio to the
baseline is known to within ±``--rel`` (``emunum.analysis.sequential``), or ``--cap`` seeds; then the report.

    python experiments/until_precise.py --dir outputs/precise --formats fp32,fp8 --rel 0.1 --cap 24 -- log=quiet

Each round is one Hydra sweep (``experiments/train.py -m format=... seed=...``, joblib, ``--jobs`` at a time)
into ``<dir>/seeds_<first>-<last>``; everything after ``--`` is passed to it. The rule looks at every run under
``<dir>``, so a rerun with the same ``--dir`` carries on where it stopped (seeds already run are not rerun).
It prints how many seeds it took and whether the answer is precise; at the cap it says it is not and exits 3.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from emunum import cli  # noqa: E402
from emunum.analysis import report, sequential  # noqa: E402

NOT_PRECISE = 3  # exit status when the cap is reached before the precision


def _sweep(out: Path, formats: list[str], seeds: list[int], jobs: int, overrides: list[str]) -> None:
    cmd = [sys.executable, str(ROOT / "experiments" / "train.py"), "-m", f"format={','.join(formats)}",
           "seed=" + ",".join(map(str, seeds)), *overrides, "hydra/launcher=joblib",
           f"hydra.launcher.n_jobs={jobs}", f"hydra.sweep.dir={out}"]
    print(f"until_precise: seeds {seeds[0]}-{seeds[-1]} of {', '.join(formats)}", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"until_precise: the sweep into {out} failed (exit {done.returncode})")


def seeds_run(sweep_dir: Path, formats: list[str]) -> int:
    """How many seeds, counted from 0 without a gap, every format has a run of under ``sweep_dir``."""
    if not any(sweep_dir.rglob("results.json")):
        return 0
    runs = report.load_sweep(sweep_dir)
    have = [{r.seed for r in runs if r.format.split(" [")[0] == f} for f in formats]
    n = 0
    while all(n in h for h in have):
        n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="the sweep directory (created; reused to carry on)")
    ap.add_argument("--formats", default="fp32,fp8", help="comma-separated format names (default fp32,fp8)")
    ap.add_argument("--baseline", default="fp32", help="the format the ratios refer to (default fp32)")
    ap.add_argument("--rel", type=float, default=0.1, help="wanted half-width / ratio (default 0.1: ±10%%)")
    ap.add_argument("--start", type=int, default=sequential.Rule.start, help="seeds before the first look")
    ap.add_argument("--step", type=int, default=sequential.Rule.step, help="seeds added per round")
    ap.add_argument("--cap", type=int, default=sequential.Rule.cap, help="the most seeds per format")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    ap.add_argument("overrides", nargs="*", help="after --: Hydra overrides for every run")
    args = ap.parse_args(argv)
    try:
        rule = sequential.Rule(rel=args.rel, start=args.start, step=args.step, cap=args.cap)
    except ValueError as e:
        ap.error(str(e))
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if args.baseline not in formats or len(formats) < 2:
        ap.error(f"--formats={args.formats!r} must hold the baseline {args.baseline!r} and at least one other")
    if args.jobs < 1:
        ap.error(f"--jobs={args.jobs} is out of range; allowed: >= 1")
    sweep_dir = Path(args.dir)
    n = seeds_run(sweep_dir, formats)
    want = rule.start if n < rule.start else n
    while True:
        if want > n:
            _sweep(sweep_dir / f"seeds_{n}-{want - 1}", formats, list(range(n, want)), args.jobs, args.overrides)
            n = want
        decisions = sequential.check_sweep(report.load_sweep(sweep_dir), args.baseline, rule)
        for name, d in decisions:
            print(f"until_precise: {name}: {d.message}", file=sys.stderr, flush=True)
        if all(d.stop for _, d in decisions):
            break
        want = max(d.next_seeds for _, d in decisions)
    code = cli.main(["report", str(sweep_dir), "--baseline", args.baseline, "--until-ci", str(args.rel),
                     "--seed-cap", str(args.cap)])
    if code:
        return code
    return 0 if all(d.precise for _, d in decisions) else NOT_PRECISE


if __name__ == "__main__":
    sys.exit(main())
