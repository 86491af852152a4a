"""experiments/until_precise.py end to end on a tiny sweep: it runs the start seeds of every format, adds seeds
two at a time while the ratio is not precise, stops at the cap, says so, and exits 3; a rerun carries on."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=mlp", "model.hidden=[16]", "max_iters=8", "eval_every=2", "target_accuracy=0.15", "batch_size=32",
        "checkpoint_every=0", "log=quiet", "threads=1", "data.num_samples=5000"]


def _until(out: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    # --jobs 1: joblib runs each round's jobs in the sweep's own process, not in two workers that import torch
    # again (about half the CPU of this test); parallel joblib sweeps are test_sweep.py's
    cmd = [sys.executable, str(ROOT / "experiments" / "until_precise.py"), "--dir", str(out), "--jobs", "1", *args,
           "--", *TINY, f"data.cache_dir={cache}"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_adds_seeds_in_pairs_to_the_cap_and_says_not_precise(tmp_path, data_cache):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    out = tmp_path / "sweep"
    # naive fp8 reaches the tiny target at other iterations than fp32: no ratio is known to ±0.01%
    done = _until(out, data_cache, "--formats", "fp32,fp8_152", "--rel", "0.0001", "--start", "2", "--cap", "2")
    assert done.returncode == 3, done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("seeds_")) == ["seeds_0-1"]
    assert len(list(out.rglob("results.json"))) == 4  # 2 seeds x 2 formats
    assert "seeds: 2 per format (fp8_152); NOT YET PRECISE" in done.stdout and "the cap (2)" in done.stdout
    # a rerun with a larger cap carries on from seed 2 (seeds already run are not rerun), adding a pair of seeds
    # while the ratio is not precise, up to the cap
    again = _until(out, data_cache, "--formats", "fp32,fp8_152", "--rel", "0.0001", "--start", "2", "--cap", "4")
    assert again.returncode == 3, again.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("seeds_")) == ["seeds_0-1", "seeds_2-3"]
    assert len(list(out.rglob("results.json"))) == 8  # 4 seeds x 2 formats: seeds 0-1 not rerun
    assert "seeds: 4 per format (fp8_152); NOT YET PRECISE" in again.stdout and "the cap (4)" in again.stdout


@pytest.mark.parametrize("args,msg", [(["--formats", "fp8"], "must hold the baseline"),
                                      (["--rel", "2"], "rel=2.0 is out of range"),
                                      (["--cap", "3", "--start", "4"], "cap=3 is below start=4")])
def test_bad_arguments_name_the_field(tmp_path, data_cache, args, msg, capsys):
    # the script's main in this process (argparse exits before any sweep starts): its exit status and stderr
    from experiments import until_precise

    with pytest.raises(SystemExit) as exc:
        until_precise.main(["--dir", str(tmp_path / "s"), "--jobs", "2", *args, "--", *TINY,
                            f"data.cache_dir={data_cache}"])
    assert exc.value.code == 2 and msg in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
