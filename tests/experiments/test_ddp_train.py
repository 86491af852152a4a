"""Several processes: experiments/train.py under torchrun (one real ``torchrun`` subprocess through Hydra), and
``train(cfg)`` on two forked gloo ranks with torchrun's environment variables (fast: no new interpreter) for
resumption. Everything runs on CPU with gloo."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from experiments import ddp
from experiments.loop import train

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def _imported_before_forking():
    """What every rank imports (~20 s per process on a busy 2-core machine), imported once here instead."""
    import mnist1d.data  # noqa: F401
    import torch._dynamo  # noqa: F401  (torch.optim's first optimizer imports it)
    from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    # (no emunum.quantize here: numba's thread pool, once started, does not survive a fork)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank: int, world: int, port: int) -> dict:
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port)}


def _rank(rank: int, world: int, port: int, cfg, run_dir: str, out: str) -> None:
    os.environ.update(_env(rank, world, port))
    res = train(cfg, run_dir)
    Path(out, f"rank{rank}.json").write_text(json.dumps(res.to_json()))


def _two_ranks(cfg, run_dir: Path, out: Path) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_rank, args=(2, _free_port(), cfg, str(run_dir), str(out)), nprocs=2, join=True,
                       start_method="fork")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_torchrun_two_ranks_reach_the_target_and_rank0_alone_writes_one_results_json(tmp_path, data_cache):
    torchrun = Path(sys.executable).with_name("torchrun")
    run_dir = tmp_path / "run"
    cmd = [str(torchrun), "--nproc-per-node=2", "--standalone", str(ROOT / "experiments" / "train.py"), "model=mlp",
           "dist.comm=e5m2", "target_accuracy=0.4", "max_iters=200", "eval_every=25", "log=quiet",
           "checkpoint_every=0", f"data.cache_dir={data_cache}", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    found = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("results*.json"))
    assert found == [Path("run/results.json")]  # no file of rank 1, nowhere else
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # rank 1 made no Hydra directory or log in its cwd
    res = json.loads((run_dir / "results.json").read_text())
    assert res["world_size"] == 2 and res["status"] == "reached"
    assert res["iterations_to_accuracy"] <= 200 and res["best_accuracy"] >= 0.4
    assert (run_dir / ".hydra" / "config.yaml").read_text().count("comm: e5m2") == 1
    assert list((run_dir / "tensorboard").iterdir())


def test_two_rank_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_run_bit_for_bit(compose, tmp_path):
    args = ["model=mlp", "max_iters=6", "eval_every=2", "checkpoint_every=2", "target_accuracy=0.99",
            "dist.comm=e5m2", "dist.ring=true", "dist.error_feedback=true"]
    whole = _two_ranks(compose(*args), tmp_path / "whole", tmp_path / "o1")
    killed = tmp_path / "killed"
    first = _two_ranks(compose(*args, "stop_after=4"), killed, tmp_path / "o2")
    assert [r["status"] for r in first] == ["interrupted"] * 2 and not (killed / "results.json").exists()
    resumed = _two_ranks(compose(*args, "resume=true"), killed, tmp_path / "o3")
    for a, b in zip(whole, resumed):
        a.pop("seconds_per_iteration"), b.pop("seconds_per_iteration")
        assert a == b
    assert resumed[0]["world_size"] == 2 and resumed[0]["iterations_run"] == 6
    assert json.loads((killed / "results.json").read_text())["final_loss"] == whole[0]["final_loss"]

    # the same checkpoint in one process: refused, naming both world sizes
    single = tmp_path / "single"
    shutil.copytree(killed, single, ignore=shutil.ignore_patterns("results.json", ".lock"))
    with pytest.raises(ValueError, match=r"world size 2 and this run has world size 1.*nproc-per-node=2"):
        train(compose(*args[:-3], "resume=true"), single)


@pytest.mark.parametrize("override, words", [
    ("dist.comm=e9m9", "dist.comm"),
    ("dist.comm_rounding=sideways", "dist.comm_rounding='sideways'"),
    ("dist.result=nope", "dist.result"),
    ("dist.error_feedback=true", "dist.error_feedback"),
    ("dist.comm=mxfp8_e4m3", "block-scaled"),
    ("dist.scaling=per_tensor", "dist.scaling=per_tensor"),  # refused at composition (an enum field)
])
def test_a_bad_dist_value_fails_before_any_process_group_starts(compose, tmp_path, monkeypatch, override, words):
    import torch.distributed as dist

    def started(*a, **k):
        raise AssertionError("a process group was started")

    monkeypatch.setattr(os, "environ", {**os.environ, **_env(0, 2, 1)})  # as under torchrun
    monkeypatch.setattr(dist, "init_process_group", started)
    from hydra.errors import ConfigCompositionException

    with pytest.raises((ValueError, ConfigCompositionException), match=words):
        train(compose("model=mlp", override), tmp_path)


def test_dist_settings_need_torchrun(compose, tmp_path):
    with pytest.raises(ValueError, match="several processes: run torchrun"):
        train(compose("model=mlp", "dist.comm=e5m2"), tmp_path)


def test_rank_other_than_0_gets_no_hydra_output_directory():
    env = _env(1, 2, 1)
    argv = ddp.rank_argv(["model=mlp", "hydra.run.dir=/somewhere"], env)
    assert argv == ["model=mlp", "hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=stdout"]
    assert ddp.rank_argv(["model=mlp"], _env(0, 2, 1)) == ["model=mlp"]
    assert ddp.rank_argv(["model=mlp"], {}) == ["model=mlp"]
