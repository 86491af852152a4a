"""The training loop: outcomes, results.json, TensorBoard, checkpoint/resume, the entry point."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import emunum
from experiments.loop import CHECKPOINT, RESULT_KEYS, Results, lr_at, objective, resolve_log_mode, train
from experiments.schema import LogMode

ROOT = Path(__file__).resolve().parents[2]

NEEDS_PATCH = pytest.mark.skipif(not hasattr(emunum, "patch"), reason="emunum.patch not in this checkout")


def _results(run_dir) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def _scalars(run_dir) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_results_json_has_the_contract_keys_and_types(compose, tmp_path):
    res = train(compose("max_iters=6", "eval_every=3"), tmp_path)
    data = _results(tmp_path)
    assert list(data)[: len(RESULT_KEYS)] == list(RESULT_KEYS)
    assert data["format"] == "fp32" and data["status"] == "not_reached"
    assert data["iterations_to_accuracy"] is None
    assert data["target_accuracy"] == 0.88
    assert data["iterations_run"] == 6
    assert isinstance(data["seconds_per_iteration"], float) and data["seconds_per_iteration"] > 0
    assert data["final_accuracy"] == res.final_accuracy and 0 <= data["final_accuracy"] <= data["best_accuracy"] <= 1
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temporary file


def test_tensorboard_has_curves_at_the_logged_iterations(compose, tmp_path):
    train(compose("max_iters=6", "eval_every=3"), tmp_path)
    s = _scalars(tmp_path)
    assert [step for step, _ in s["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert [step for step, _ in s["val/accuracy"]] == [3, 6]
    assert [step for step, _ in s["val/loss"]] == [3, 6]
    assert all(v == pytest.approx(0.01) for _, v in s["train/lr"])
    assert s["hparam/iterations_to_accuracy"][0][1] == 7.0  # not reached: max_iters + 1
    assert s["val/accuracy"][-1][1] == pytest.approx(_results(tmp_path)["final_accuracy"])


def test_reached_is_the_first_evaluation_at_or_above_target(compose, tmp_path):
    # a low target on MNIST-1D: the first evaluation that meets it is the answer, and training stops there
    res = train(compose("max_iters=200", "eval_every=5", "target_accuracy=0.3", "batch_size=100"), tmp_path)
    assert res.status == "reached"
    accs = [v for _, v in _scalars(tmp_path)["val/accuracy"]]
    first = next(i for i, a in enumerate(accs) if a >= 0.3 - 1e-7)
    assert first == len(accs) - 1
    assert res.iterations_to_accuracy == 5 * (first + 1) == res.iterations_run
    assert objective(res, 200) == res.iterations_to_accuracy


def test_not_reached_runs_to_max_iters(compose, tmp_path):
    res = train(compose("target_accuracy=1.0", "max_iters=5"), tmp_path)
    assert res.status == "not_reached" and res.iterations_run == 5 and res.iterations_to_accuracy is None
    assert objective(res, 5) == 6


@pytest.mark.parametrize("fmt", ["fp32", pytest.param("fp16", marks=NEEDS_PATCH)])
def test_huge_learning_rate_diverges_and_keeps_logs(compose, tmp_path, fmt):
    res = train(compose("optim=sgd", "lr=1e12", "max_iters=50", "model=mlp", f"format={fmt}"), tmp_path)
    assert res.status == "diverged" and res.reason
    assert res.iterations_run < 50
    data = _results(tmp_path)
    assert data["status"] == "diverged" and data["iterations_to_accuracy"] is None
    assert json.dumps(data)  # strict JSON: no NaN
    assert "train/loss" in _scalars(tmp_path)
    assert objective(res, 50) == 51


def _state(run_dir):
    return torch.load(run_dir / CHECKPOINT, map_location="cpu", weights_only=True)


@pytest.mark.parametrize("fmt,model", [("fp32", "cnn1d"), pytest.param("fp8", "mlp", marks=NEEDS_PATCH)])
def test_resume_after_kill_matches_the_uninterrupted_run(compose, tmp_path, fmt, model):
    # fp8: stochastic rounding in the layers (gradients), in OptimLP (weights) and dynamic loss scaling
    n = 60 if fmt == "fp32" else 12
    common = [f"format={fmt}", f"model={model}", f"max_iters={n}", f"eval_every={n // 6}",
              f"checkpoint_every={n // 3}", "target_accuracy=0.99", "batch_size=64", "seed=3"]
    if model == "mlp":
        common.append("model.hidden=[32]")
    full_dir, killed_dir = tmp_path / "full", tmp_path / "killed"
    full = train(compose(*common), full_dir)

    # "killed" after 5/6 of the run; the last checkpoint is at 2/3
    part = train(compose(*common, f"stop_after={5 * n // 6}"), killed_dir)
    assert part.status == "interrupted" and part.iterations_run == 5 * n // 6
    assert not (killed_dir / "results.json").exists()
    assert _state(killed_dir)["loop"]["iteration"] == 2 * n // 3

    resumed = train(compose(*common, "resume=true"), killed_dir)
    a, b = _results(full_dir), _results(killed_dir)
    for k in a:
        if k != "seconds_per_iteration":
            assert a[k] == b[k], k
    assert resumed.iterations_run == full.iterations_run == n
    sa, sb = _state(full_dir), _state(killed_dir)
    assert sa["loop"]["evals"] == sb["loop"]["evals"]
    for k in sa["model"]:
        assert torch.equal(sa["model"][k], sb["model"][k]), k
    # the killed run's events after the checkpoint were purged: one value per step
    steps = [s for s, _ in _scalars(killed_dir)["train/loss"]]
    assert steps == list(range(1, n + 1))


def test_resume_reaches_the_same_iterations_to_accuracy(compose, tmp_path):
    common = ["max_iters=400", "eval_every=20", "checkpoint_every=40", "target_accuracy=0.6", "batch_size=100"]
    full = train(compose(*common), tmp_path / "a")
    assert full.status == "reached"
    k = full.iterations_to_accuracy - 10  # killed shortly before reaching the target
    train(compose(*common, f"stop_after={k}"), tmp_path / "b")
    resumed = train(compose(*common, "resume=true"), tmp_path / "b")
    assert resumed.status == "reached"
    assert resumed.iterations_to_accuracy == full.iterations_to_accuracy
    assert resumed.best_accuracy == full.best_accuracy


def test_resume_without_checkpoint_or_with_other_config_fails_clearly(compose, tmp_path):
    with pytest.raises(ValueError, match="checkpoint.pt does not exist"):
        train(compose("resume=true"), tmp_path)
    train(compose("checkpoint_every=2", "stop_after=2"), tmp_path)
    with pytest.raises(ValueError, match=r"different config in \['lr'\]"):
        train(compose("resume=true", "lr=0.5"), tmp_path)


def test_learning_rate_schedules(compose):
    cfg = compose("optim.schedule=cosine", "optim.warmup_iters=4", "max_iters=12", "lr=0.8")
    got = [lr_at(cfg, i) for i in range(12)]
    assert got[:4] == pytest.approx([0.2, 0.4, 0.6, 0.8], rel=1e-15)
    assert got[4] == 0.8 and got[8] == pytest.approx(0.4) and got[-1] == pytest.approx(0.8 * 0.5 * (1 + math.cos(math.pi * 7 / 8)))
    assert [lr_at(compose(), i) for i in (0, 99)] == [0.01, 0.01]


def test_log_mode_is_quiet_under_ci_or_without_a_tty(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert resolve_log_mode("auto") == LogMode.quiet
    monkeypatch.delenv("CI")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert resolve_log_mode("auto") == LogMode.quiet
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert resolve_log_mode("auto") == LogMode.progress
    assert resolve_log_mode(LogMode.quiet) == LogMode.quiet


def test_results_to_json_has_no_nan():
    r = Results("fp32", "diverged", None, 0.9, float("nan"), float("inf"), 3, 0.1)
    d = r.to_json()
    assert d["best_accuracy"] is None and d["final_accuracy"] is None
    json.dumps(d, allow_nan=False)


@pytest.mark.parametrize("cwd", ["root", "experiments"])
def test_entry_point_runs_from_root_and_from_experiments(tmp_path, cwd, data_cache):
    script = "experiments/train.py" if cwd == "root" else "train.py"
    run_dir = tmp_path / "run"
    env = dict(os.environ, CI="1", EMUNUM_CACHE_DIR=str(data_cache))
    proc = subprocess.run(
        [sys.executable, script, "format=fp32", "model=mlp", "max_iters=3", "eval_every=3", "target_accuracy=1.0",
         f"hydra.run.dir={run_dir}"],
        cwd=ROOT if cwd == "root" else ROOT / "experiments", env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _results(run_dir)["status"] == "not_reached"
    assert (run_dir / "train.log").read_text().count("iter 3") == 1  # quiet: log lines, no bar
    assert "it/s" not in proc.stderr


@NEEDS_PATCH
def test_trace_logs_per_layer_numerics(compose, tmp_path):
    train(compose("format=fp8_152", "model=mlp", "trace=true", "model.hidden=[16]"), tmp_path)
    tags = _scalars(tmp_path)
    layer_tags = [t for t in tags if t.startswith("emunum/")]
    assert any(t.endswith("/input/sqnr_db") for t in layer_tags)
    assert any(t.endswith("/weight/overflow") for t in layer_tags)
    assert any("/grad_output/" in t for t in layer_tags)
    assert [s for s, _ in tags[layer_tags[0]]] == [2, 4]  # exported at each evaluation


def test_trace_needs_an_emulated_format(compose, tmp_path):
    with pytest.raises(ValueError, match="trace=true: format=fp32 has no emulated layer"):
        train(compose("trace=true"), tmp_path)


def test_plot_writes_a_png_of_the_curves(compose, tmp_path):
    from experiments.plot import ema, main as plot_main

    for seed in (0, 1):
        train(compose(f"seed={seed}", "max_iters=6", "eval_every=3"), tmp_path / f"run{seed}")
    out = tmp_path / "curves.png"
    plot_main([str(tmp_path / "run0"), str(tmp_path / "run1"), "-o", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ema([1.0, 3.0, 3.0], 0.5) == [1.0, 2.0, 2.5]
    with pytest.raises(ValueError, match="no tensorboard"):
        plot_main([str(tmp_path), "-o", str(out)])


def test_a_resumed_runs_event_file_sorts_after_the_files_it_continues(tmp_path):
    """TensorBoard applies a resumed writer's purge_step in file-name order; a name starts with the second the
    file was opened, then a per-process counter that does not sort by time. The resumed writer waits for a later
    second than every existing file's (here one stamped a second ahead)."""
    import time

    from torch.utils.tensorboard import SummaryWriter

    from experiments import loop

    old = tmp_path / f"events.out.tfevents.{int(time.time()) + 1}.host.99999.9"
    old.write_bytes(b"")
    loop._wait_past_event_files(tmp_path)
    SummaryWriter(str(tmp_path)).close()
    names = sorted(p.name for p in tmp_path.glob("events.out.tfevents.*"))
    assert len(names) == 2 and names[0] == old.name


def test_a_resume_does_not_wait_for_an_event_file_from_a_clock_far_ahead(tmp_path, monkeypatch):
    """A file stamped an hour ahead (copied from a machine whose clock is ahead) is not waited for; one a second
    ahead is."""
    import time

    from experiments import loop

    slept = []
    monkeypatch.setattr(loop.time, "sleep", slept.append)
    far = tmp_path / "far"
    far.mkdir()
    (far / f"events.out.tfevents.{int(time.time()) + 3600}.host.99999.1").write_bytes(b"")
    loop._wait_past_event_files(far)
    assert slept == []
    (tmp_path / f"events.out.tfevents.{int(time.time()) + 1}.host.99999.1").write_bytes(b"")
    loop._wait_past_event_files(tmp_path)
    assert len(slept) == 1 and 0 < slept[0] <= 2
