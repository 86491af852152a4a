"""`import emunum` beyond torch: time of `import emunum` in a fresh interpreter that has already imported torch,
for this checkout and (optionally) other checkouts, interleaved run by run so machine noise hits all alike.

    python benchmarks/import_time.py [--repeats 15] [--other PATH ...]

Each PATH is a source checkout (a git worktree of another commit, say); it is put first on PYTHONPATH.
Prints the median and the minimum per checkout, in milliseconds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

PROBE = ("import time, torch; t = time.perf_counter(); import emunum; "
         "print(time.perf_counter() - t); assert emunum.__file__.startswith(%r), emunum.__file__")


def once(checkout: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run([sys.executable, "-c", PROBE % str(checkout)], env=env, capture_output=True, text=True,
                         check=True, cwd=checkout)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--other", action="append", default=[], type=Path, help="another checkout to time")
    args = ap.parse_args()
    checkouts = [Path(__file__).resolve().parents[1], *[p.resolve() for p in args.other]]
    times = {c: [] for c in checkouts}
    for _ in range(args.repeats):
        for c in checkouts:
            times[c].append(once(c))
    print(f"{'checkout':60s} {'median ms':>10s} {'min ms':>8s}")
    for c, ts in times.items():
        print(f"{str(c):60s} {1e3 * statistics.median(ts):10.1f} {1e3 * min(ts):8.1f}")


if __name__ == "__main__":
    main()
