"""2-rank data-parallel training (torchrun, gloo, CPU) with fp32, e5m2 and e5m2-ring gradient
all-reduce, several seeds each, plus 1-rank runs for the time per step; then the report of each group.

    PYTHONPATH=. .venv/bin/python benchmarks/ddp_comm.py --out /work/runs/ddp --seeds 0 1 2

Every run: model=mlp (MNIST-1D, 100-100 MLP), target_accuracy 0.6 (the MLP plateaus near 0.65-0.7),
max_iters 2000, eval_every 20, one thread per rank, batch_size 100 per rank (2 ranks: a global batch of 200).
A run directory per (setting, seed); `emunum report <out>/two_ranks` compares the all-reduce settings (labels
from the differing dist.* keys) and `emunum report <out>/one_rank` gives the 1-rank reference.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["model=mlp", "target_accuracy=0.6", "max_iters=2000", "eval_every=20", "log=quiet", "checkpoint_every=0",
          "threads=1"]
SETTINGS = {
    "2rank_fp32": (2, []),
    "2rank_e5m2": (2, ["dist.comm=e5m2"]),
    "2rank_e5m2_ring": (2, ["dist.comm=e5m2", "dist.ring=true"]),
    "1rank_fp32": (1, []),
}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS))
    args = ap.parse_args(argv)
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, CI="1", OMP_NUM_THREADS="1")
    for name in args.settings:
        nproc, extra = SETTINGS[name]
        for seed in args.seeds:
            # 1- and 2-rank runs of one config differ in no config key: separate trees, separate reports
            run_dir = Path(args.out) / ("two_ranks" if nproc > 1 else "one_rank") / name / f"seed{seed}"
            if (run_dir / "results.json").exists():
                continue
            head = ([str(torchrun), f"--nproc-per-node={nproc}", "--standalone"] if nproc > 1 else [sys.executable])
            cmd = head + [str(ROOT / "experiments" / "train.py"), *COMMON, *extra, f"seed={seed}",
                          f"hydra.run.dir={run_dir}"]
            t0 = time.perf_counter()
            p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            print(f"{name} seed {seed}: exit {p.returncode}, {time.perf_counter() - t0:.1f} s wall", flush=True)
            if p.returncode != 0:
                print(p.stderr[-2000:], file=sys.stderr)


if __name__ == "__main__":
    main()
