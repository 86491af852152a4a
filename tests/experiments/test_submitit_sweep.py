"""The cluster path end to end on this machine: a sweep through ``hydra/launcher=submitit_local`` (the same
submitit engine as ``hydra/launcher=slurm``, running each job as a local process instead of an sbatch task),
each job writing its results.json, and ``emunum report`` reading the sweep."""
from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from emunum import cli

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=mlp", "model.hidden=[16]", "max_iters=8", "eval_every=2", "target_accuracy=0.15", "batch_size=32",
        "checkpoint_every=0", "log=quiet", "threads=1", "data.num_samples=5000"]


@pytest.mark.slow
def test_submitit_local_sweep_writes_one_results_json_per_job_and_report_reads_it(tmp_path, data_cache, capsys):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from omegaconf import OmegaConf

    from experiments import data

    data.load(OmegaConf.create({"name": "mnist1d", "num_samples": 5000, "train_samples": 4000, "seed": 42,
                                "shuffle_seq": False, "cache_dir": str(data_cache)}))  # once here, not in both jobs
    sweep = tmp_path / "multirun"
    cmd = [sys.executable, str(ROOT / "experiments" / "train.py"), "-m", *TINY, "format=fp32,bf16",
           "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10", "hydra.launcher.cpus_per_task=1",
           f"hydra.sweep.dir={sweep}", f"data.cache_dir={data_cache}"]
    p = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "CI": "1"}, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    jobs = sorted(d for d in sweep.iterdir() if d.is_dir() and not d.name.startswith("."))
    assert [d.name for d in jobs] == ["0", "1"]
    results = [json.loads((d / "results.json").read_text()) for d in jobs]
    assert sorted(r["format"] for r in results) == ["bf16", "fp32"]
    assert all(r["status"] in ("reached", "not_reached") and r["iterations_run"] >= 2 for r in results)
    assert list((sweep / ".submitit").iterdir())  # the jobs ran through submitit (its pickles and logs)

    code = cli.main(["report", str(sweep), "--format", "csv", "--no-plot"])
    out = capsys.readouterr().out
    assert code == 0
    rows = {r["format"]: r for r in csv.DictReader(io.StringIO(out))}
    assert set(rows) == {"fp32", "bf16"} and all(r["runs"] == "1" for r in rows.values())
