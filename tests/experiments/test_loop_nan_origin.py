"""A run that diverges because e4m3fn overflowed (no infinity: NaN beyond 448) names the first rounding that
did it, in results.json (``nan_origin``) and in the log; checked against a replay of the step from the last
checkpoint with forward hooks on every emulated layer."""
from __future__ import annotations

import json
import logging

import pytest
import torch

from experiments import data as data_mod
from experiments import models
from experiments.loop import seed_step, train
from experiments.recipe import STREAM_STEP, apply_format
from experiments.run_files import CHECKPOINT
from emunum.optim import derive_seed
from emunum.patch import emulated_modules

E4M3_OVERFLOW = ["format=e4m3", "format.scaling=none", "format.loss_scale.mode=none", "optim=sgd", "lr=100",
                 "model=mlp", "max_iters=20", "checkpoint_every=1"]


def test_an_e4m3_overflow_run_names_the_first_overflowing_layer_and_role(compose, tmp_path, caplog):
    cfg = compose(*E4M3_OVERFLOW)
    with caplog.at_level(logging.WARNING, logger="experiments.train"):
        res = train(cfg, tmp_path)
    assert res.status == "diverged"
    origin = json.loads((tmp_path / "results.json").read_text())["nan_origin"]
    assert origin == res.nan_origin and origin["kind"] == "rounding" and origin["phase"] == "forward"
    assert f"{origin['name']} ({origin['role']})" in res.reason
    assert any(f"{origin['name']} ({origin['role']})" in r.getMessage() for r in caplog.records)

    # replay the failing step (iteration res.iterations_run, 0-based) from the checkpoint of the one before
    ckpt = torch.load(tmp_path / CHECKPOINT, map_location="cpu", weights_only=False)
    assert ckpt["loop"]["iteration"] == res.iterations_run
    ds = data_mod.load(cfg.data)
    model = apply_format(models.build(cfg.model, ds.input_shape, ds.num_outputs), cfg.format)
    model.load_state_dict(ckpt["model"])
    it = res.iterations_run
    seed_step(derive_seed(int(cfg.seed), STREAM_STEP, it), torch.device("cpu"))
    xb = ds.x_train[data_mod.BatchSampler(len(ds.x_train), int(cfg.batch_size), int(cfg.seed)).indices(it)]
    seen = []
    names = {m: n for n, m in emulated_modules(model)}
    for m in names:
        m.register_forward_hook(lambda m, a, out: seen.append((names[m], a[0], out)))
    model(xb)
    first = next(i for i, (_, _, out) in enumerate(seen) if not torch.isfinite(out).all())
    name, x, out = seen[first]
    assert name == origin["name"]  # the first emulated layer whose result is not finite
    assert torch.isfinite(x).all()  # from finite inputs
    if origin["role"] == "output":  # its inputs and weights stayed within e4m3fn's range: the output overflowed
        layer = dict(model.named_modules())[name]
        assert (x.abs() <= 448).all()
        for p in layer.parameters(recurse=False):
            assert (p.abs() <= 448).all()
        assert origin["values"] == int((~torch.isfinite(out)).sum())


def test_a_finite_run_has_no_nan_origin(compose, tmp_path):
    res = train(compose("format=e4m3", "model=mlp"), tmp_path)
    assert res.status != "diverged"
    assert json.loads((tmp_path / "results.json").read_text())["nan_origin"] is None
