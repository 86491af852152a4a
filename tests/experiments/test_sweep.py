"""Sweeps end to end: a real 2-format x 2-seed MNIST-1D sweep through Hydra's joblib launcher (tiny
max_iters), `emunum report` and `emunum tta` on it, a sweep with a failing job, and the SLURM launcher
configs composed (no cluster here)."""
from __future__ import annotations

import csv
import io
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from emunum import cli

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "experiments" / "conf"

# the smallest model on MNIST-1D, a few iterations, one thread per job; chance accuracy is 0.1
TINY = ["model=mlp", "model.hidden=[16]", "max_iters=8", "eval_every=2", "target_accuracy=0.15",
        "batch_size=32", "checkpoint_every=0", "log=quiet", "threads=1", "data.num_samples=5000"]


def multirun(sweep_dir: Path, cache: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "experiments" / "train.py"), "-m", *TINY, *overrides,
           f"hydra.sweep.dir={sweep_dir}", f"data.cache_dir={cache}"]
    env = {**os.environ, "CI": "1"}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, data_cache) -> Path:
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    from omegaconf import OmegaConf

    from experiments import data

    # generate MNIST-1D once here, rather than in both joblib workers at once
    data.load(OmegaConf.create({"name": "mnist1d", "num_samples": 5000, "train_samples": 4000, "seed": 42,
                                "shuffle_seq": False, "cache_dir": str(data_cache)}))
    d = tmp_path_factory.mktemp("sweep") / "multirun"
    p = multirun(d, data_cache, "format=fp32,bf16", "seed=0,1", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return d


def _results(sweep: Path) -> dict[str, dict]:
    return {d.name: json.loads((d / "results.json").read_text()) for d in sorted(sweep.iterdir()) if d.is_dir()}


def _csv(out: str) -> dict[str, dict]:
    return {r["format"]: r for r in csv.DictReader(io.StringIO(out))}


def _run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow
def test_joblib_sweep_writes_one_results_json_per_job(sweep):
    res = _results(sweep)
    assert sorted(res) == ["0", "1", "2", "3"]
    for job, r in res.items():
        over = yaml.safe_load((sweep / job / ".hydra" / "overrides.yaml").read_text())
        assert f"format={r['format']}" in over and f"seed={r['seed']}" in over
        # every run reaches 0.15 within 8 iterations (deterministic: fixed data, seeds and one thread)
        assert r["status"] == "reached" and r["iterations_run"] <= 8
        hydra_cfg = yaml.safe_load((sweep / job / ".hydra" / "hydra.yaml").read_text())["hydra"]
        assert hydra_cfg["launcher"]["_target_"].endswith("JoblibLauncher")
    assert sorted((r["format"], r["seed"]) for r in res.values()) == [("bf16", 0), ("bf16", 1), ("fp32", 0),
                                                                       ("fp32", 1)]


@pytest.mark.slow
def test_report_on_the_sweep_matches_the_results_files(sweep, tmp_path, capsys):
    code, out, err = _run(capsys, "report", sweep, "--format", "csv", "--plot", tmp_path / "convergence.png")
    assert code == 0
    rows = _csv(out)
    res = list(_results(sweep).values())
    assert list(rows) == ["fp32", "bf16"]
    for fmt, row in rows.items():
        mine = [r for r in res if r["format"] == fmt]
        reached = [r["iterations_to_accuracy"] for r in mine if r["status"] == "reached"]
        assert int(row["runs"]) == 2 and int(row["reached"]) == len(reached)
        assert len(reached) == 2 and float(row["iters_mean"]) == statistics.fmean(reached)
        assert float(row["best_acc_max"]) == max(r["best_accuracy"] for r in mine)
        assert float(row["emulation_seconds_per_iteration"]) == pytest.approx(
            statistics.fmean(r["seconds_per_iteration"] for r in mine), rel=1e-12)
    assert (tmp_path / "convergence.png").read_bytes()[:4] == b"\x89PNG"
    code, text, _ = _run(capsys, "report", sweep, "--no-plot")
    assert code == 0 and text.splitlines()[2].split()[0] == "fp32" and text.splitlines()[3].split()[0] == "bf16"


@pytest.mark.slow
def test_curves_of_the_sweep_are_the_evaluations_of_each_run(sweep):
    from emunum.analysis import curves

    for d in sorted(p for p in sweep.iterdir() if p.is_dir()):
        r = json.loads((d / "results.json").read_text())
        curve = curves.load_curve(d)
        assert [s for s, _ in curve] == list(range(2, r["iterations_run"] + 1, 2))
        assert max(v for _, v in curve) == pytest.approx(r["best_accuracy"], abs=1e-7)  # float32 in TensorBoard


@pytest.mark.slow
def test_tta_with_hardware_is_the_roofline_of_the_counted_iteration(sweep, capsys):
    import torch
    from omegaconf import OmegaConf

    from emunum.analysis.flops import Hardware, count_iteration
    from experiments import models

    code, out, err = _run(capsys, "tta", sweep, "--hardware", "h100_like", "--format", "csv")
    assert code == 0, err
    rows = _csv(out)
    hw = Hardware.load("h100_like")
    # MLP 40 -> 16 -> 10 on a batch of 32 (MNIST-1D: 1 channel x 40 points): forward, weight gradients of
    # both layers, input gradient of the second only (the first layer's input needs none)
    b, i, h, o = 32, 40, 16, 10
    flops = 2 * b * (i * h + h * o) * 2 + 2 * b * h * o
    params = i * h + h + h * o + o
    cfg = OmegaConf.create(yaml.safe_load((sweep / "0" / ".hydra" / "config.yaml").read_text()))
    cost = count_iteration(models.build(cfg.model, (1, i), o), torch.randn(b, 1, i), torch.randint(0, o, (b,)),
                           torch.nn.functional.cross_entropy)
    assert (cost.flops, cost.param_elements, cost.input_elements) == (flops, params, b * i)
    for fmt, width in (("fp32", 32), ("bf16", 16)):
        want = max(flops / dict(hw.peak_flops)[width], cost.bytes(width) / hw.memory_bandwidth)
        assert float(rows[fmt]["seconds_per_iteration"]) == want
        assert rows[fmt]["source"] == f"roofline h100_like: memory-bound, {width}-bit"
    assert float(rows["bf16"]["throughput_gain"]) == 2.0  # memory-bound: half the bytes at 16 bits
    code, text, _ = _run(capsys, "tta", sweep, "--hardware", "h100_like")
    assert f"per iteration: {flops:.4g} FLOPs (FlopCounterMode), {params} parameters" in text


@pytest.mark.slow
def test_tta_with_given_times_on_the_sweep(sweep, capsys):
    code, out, _ = _run(capsys, "tta", sweep, "--seconds-per-iteration", "fp32=0.004", "bf16=0.002", "--format", "csv")
    assert code == 0
    rows = _csv(out)
    res = list(_results(sweep).values())

    def mean_iters(fmt):
        it = [r["iterations_to_accuracy"] for r in res if r["format"] == fmt and r["status"] == "reached"]
        return statistics.fmean(it) if it else None

    for fmt, t in (("fp32", 0.004), ("bf16", 0.002)):
        assert float(rows[fmt]["tta_seconds"]) == mean_iters(fmt) * t
    assert float(rows["bf16"]["throughput_gain"]) == 2.0
    assert float(rows["bf16"]["stat_efficiency_loss"]) == mean_iters("bf16") / mean_iters("fp32")
    assert float(rows["bf16"]["speedup"]) == (mean_iters("fp32") * 0.004) / (mean_iters("bf16") * 0.002)


@pytest.mark.slow
def test_a_failing_job_keeps_the_other_jobs_results(tmp_path, data_cache, capsys):
    # job 0 fails in train() (batch_size=0 is rejected); job 1 runs after it and writes its results
    p = multirun(tmp_path / "multirun", data_cache, "format=fp32", "batch_size=0,32", "max_iters=2")
    assert p.returncode != 0 and "batch_size=0 is out of range" in p.stderr
    sweep = tmp_path / "multirun"
    assert (sweep / "0" / ".hydra" / "config.yaml").exists()
    assert json.loads((sweep / "1" / "results.json").read_text())["iterations_run"] == 2
    failed = sweep / "0" / "results.json"
    if failed.exists():  # train.py recorded the exception
        rec = json.loads(failed.read_text())
        assert rec["status"] == "failed" and "batch_size=0 is out of range" in (rec.get("reason") or rec["error"])
    code, out, _ = _run(capsys, "report", sweep, "--no-plot")
    assert code == 0
    rows = {ln.split("]")[0] + "]": ln.split("]")[1].split() for ln in out.splitlines()[2:4]}
    # not pooled: the two jobs differ in batch_size, so each is its own row (1 run each; job 0 failed)
    assert rows["fp32 [batch_size=0]"][:4] == ["1", "0/1", "0", "1"]
    assert rows["fp32 [batch_size=32]"][:2] == ["1", "0/1"]
    why = "batch_size=0 is out of range" if failed.exists() else "no results.json"
    assert f"note: failed run {sweep / '0'} (format fp32 [batch_size=0], seed 0): " in out and why in out


# ---------------------------------------------------------------------------------------------------------
# launchers: compose the configs (no cluster here)
# ---------------------------------------------------------------------------------------------------------
def _compose(*overrides):
    from hydra import compose, initialize_config_dir

    from experiments.schema import register

    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def _sbatch(launcher_cfg, folder: Path) -> str:
    """The sbatch script submitit would submit for this launcher config, built as the plugin builds its
    executor parameters (hydra_submitit_launcher.submitit_launcher.BaseSubmititLauncher.launch)."""
    from hydra.utils import instantiate
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf
    from submitit.slurm import slurm

    launcher = instantiate(launcher_cfg)
    params = {k: v for k, v in launcher.params.items() if k not in ("submitit_folder", "max_num_timeout")}
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    eq = slurm.SlurmExecutor._equivalence_dict()
    kwargs = {(eq[k] if k in eq else k) if k in base else k: v for k, v in params.items()}
    unknown = set(kwargs) - slurm.SlurmExecutor._valid_parameters() - {"job_name", "time", "mem", "nodes",
                                                                        "cpus_per_task", "gpus_per_node",
                                                                        "ntasks_per_node", "stderr_to_stdout"}
    assert not unknown, unknown
    if kwargs.get("mem") is not None:
        kwargs["mem"] = slurm._convert_mem(kwargs["mem"])
    return slurm._make_sbatch_string(command="python experiments/train.py", folder=folder, **kwargs)


def test_plugin_submitit_slurm_launcher_composes(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cfg = _compose("hydra/launcher=submitit_slurm", "format=bf16", "hydra.launcher.partition=gpu")
    assert cfg.hydra.launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    text = _sbatch(cfg.hydra.launcher, tmp_path)
    assert "#SBATCH --partition=gpu" in text and "#SBATCH --time=60" in text


def test_slurm_preset_composes_to_a_valid_sbatch_script(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cfg = _compose("hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.account=proj")
    assert cfg.hydra.launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (cfg.hydra.launcher.timeout_min, cfg.hydra.launcher.cpus_per_task, cfg.hydra.launcher.mem_gb) == (120, 4, 16)
    text = _sbatch(cfg.hydra.launcher, tmp_path)
    for line in ("--partition=gpu", "--account=proj", "--time=120", "--cpus-per-task=4", "--mem=16GB",
                 "--ntasks-per-node=1", "--nodes=1"):
        assert f"#SBATCH {line}" in text, text


def test_joblib_launcher_composes():
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    cfg = _compose("hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher") and cfg.hydra.launcher.n_jobs == 2
