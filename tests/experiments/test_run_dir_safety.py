"""Run directories keep what they hold: a failed resume never overwrites a finished run's
results.json and names the checkpoint and the cause; a second run in a locked directory refuses."""
from __future__ import annotations

import json

import pytest

from experiments.loop import CHECKPOINT, RunDirBusy, run_dir_lock, train
from experiments.train import run

FAST = ["max_iters=40", "eval_every=20", "checkpoint_every=20", "target_accuracy=0.99"]


@pytest.mark.parametrize("damage", ["truncated", "garbled", "empty", "missing"])
def test_a_failed_resume_keeps_the_finished_results_and_names_the_checkpoint(compose, tmp_path, damage):
    run(compose(*FAST), tmp_path)
    before = (tmp_path / "results.json").read_text()
    assert json.loads(before)["status"] in ("reached", "not_reached")
    ckpt = tmp_path / CHECKPOINT
    data = ckpt.read_bytes()
    if damage == "truncated":
        ckpt.write_bytes(data[: len(data) // 2])
    elif damage == "garbled":
        ckpt.write_bytes(bytes(b ^ 0x5A for b in data))
    elif damage == "empty":
        ckpt.write_bytes(b"")
    else:
        ckpt.unlink()
    with pytest.raises(ValueError) as err:
        run(compose(*FAST, "resume=true"), tmp_path)
    assert str(ckpt) in str(err.value) and "weights_only" not in str(err.value)
    assert (tmp_path / "results.json").read_text() == before
    failed = json.loads((tmp_path / "results.failed.json").read_text())
    assert failed["status"] == "failed" and str(ckpt) in failed["reason"]


def test_a_second_run_in_a_locked_run_directory_refuses_naming_it(compose, tmp_path):
    with run_dir_lock(tmp_path):
        with pytest.raises(RunDirBusy, match=str(tmp_path)):
            run(compose(*FAST), tmp_path)
    assert not (tmp_path / "results.json").exists()  # the other run's directory is left alone
    train(compose(*FAST), tmp_path)  # free again once the holder is done
    assert (tmp_path / "results.json").exists()


def test_an_impossible_run_directory_is_named(compose, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="run directory .*file/run"):
        train(compose(*FAST), blocker / "run")


@pytest.mark.parametrize("overrides,label", [((), "fp32"), (("format.fmt=e5m2",), "fp32 [fmt=e5m2]"),
                                             (("format=fp8_152",), "fp8_152")])
def test_results_label_a_run_by_what_it_emulated(compose, tmp_path, overrides, label):
    res = train(compose(*FAST, *overrides), tmp_path)
    assert res.format == label
    assert json.loads((tmp_path / "results.json").read_text())["format"] == label


def test_a_write_that_fails_midway_leaves_no_tmp_file(tmp_path, monkeypatch):
    from experiments import run_files

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run_files.json, "dump", full_disk)
    with pytest.raises(OSError, match="No space"):
        run_files.write_json_atomic(tmp_path / "results.json", {"a": 1})
    assert list(tmp_path.iterdir()) == []


def test_an_exploding_finite_loss_ends_diverged_and_keeps_its_logs(compose, tmp_path):
    res = train(compose("model=mlp", "optim=adam", "lr=1e6", "max_iters=200", "eval_every=10",
                        "target_accuracy=0.99"), tmp_path)
    assert res.status == "diverged" and "evaluations in a row" in res.reason
    assert res.iterations_run < 200
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "diverged"
    assert any((tmp_path / "tensorboard").rglob("events.out.tfevents.*"))
