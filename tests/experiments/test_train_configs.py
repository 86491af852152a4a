"""Config composition: every group option trains a few steps; the schema rejects typos and bad names."""
from __future__ import annotations

import dataclasses
import json

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import ConfigKeyError, ValidationError

from experiments.loop import RESULT_KEYS, train
from experiments.schema import SCHEMAS

import emunum

FORMATS = ["fp32", "bf16", "fp16", "fp8_152", "fp8", "e4m3", "fixed16"]
NEEDS_PATCH = pytest.mark.skipif(not hasattr(emunum, "patch"), reason="emunum.patch not in this checkout")


def _check_run(run_dir, results, fmt_name):
    data = json.loads((run_dir / "results.json").read_text())
    assert set(RESULT_KEYS) <= set(data)
    assert data["format"] == fmt_name
    assert data["status"] in ("reached", "not_reached", "diverged")
    assert data["iterations_run"] == results.iterations_run
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))


HAS_SCALING = "scaling" in {f.name for f in dataclasses.fields(emunum.Policy)}


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_option_trains_a_few_steps(compose, tmp_path, fmt):
    extra = []
    if fmt == "e4m3" and not HAS_SCALING:
        with pytest.raises(NotImplementedError, match="format.scaling=per_tensor needs per-tensor scaling"):
            train(compose("format=e4m3", "model=mlp"), tmp_path)
        extra = ["format.scaling=none"]  # what runs until emunum.Policy has per-tensor scaling
    cfg = compose(f"format={fmt}", "model=mlp", *extra)
    res = train(cfg, tmp_path)
    assert res.status in ("not_reached", "reached")
    assert res.iterations_run == 4
    _check_run(tmp_path, res, fmt)


@pytest.mark.parametrize("model", sorted(SCHEMAS["model"]))
@pytest.mark.parametrize("fmt", ["fp32", pytest.param("fp8", marks=NEEDS_PATCH)])
def test_every_model_option_trains_a_few_steps(compose, tmp_path, model, fmt):
    small = {"cnn1d": ["model.channels=8"], "resnet": ["model.channels=8", "model.blocks=1"],
             "transformer": ["model.d_model=16", "model.layers=1"], "mlp": ["model.hidden=[32]"]}[model]
    cfg = compose(f"model={model}", f"format={fmt}", "max_iters=2", "batch_size=16", *small)
    res = train(cfg, tmp_path)
    assert res.iterations_run == 2 and res.status == "not_reached"
    assert res.final_accuracy is not None and 0.0 <= res.final_accuracy <= 1.0
    _check_run(tmp_path, res, fmt)


@pytest.mark.parametrize("data", ["mnist1d", "digits", "regression13"])
@pytest.mark.parametrize("optim", sorted(SCHEMAS["optim"]))
def test_every_data_and_optim_option_trains_a_few_steps(compose, tmp_path, data, optim):
    cfg = compose(f"data={data}", f"optim={optim}", "model=mlp")
    res = train(cfg, tmp_path)
    assert res.iterations_run == 4
    if data == "regression13":
        assert res.target_accuracy is None and res.best_accuracy is None
        assert res.target_loss == 0.05 and res.final_loss is not None
    else:
        assert res.target_accuracy == 0.9 and res.final_accuracy is not None
    _check_run(tmp_path, res, "fp32")


def test_top_level_typo_fails_at_composition(compose):
    with pytest.raises(ConfigCompositionException, match="max_iter"):
        compose("max_iter=3")


def test_group_key_typo_fails_at_composition(compose):
    with pytest.raises(ConfigCompositionException, match="model.chanels"):
        compose("model.chanels=3")


def test_appended_unknown_key_is_rejected_by_train(compose, tmp_path):
    cfg = compose("+max_iter=3")
    with pytest.raises(ValueError, match="unknown config key 'max_iter'.*max_iters"):
        train(cfg, tmp_path)
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("group,bad", [("format", "fp9"), ("model", "vgg"), ("data", "cifar"), ("optim", "lamb")])
def test_unknown_group_option_lists_the_choices(compose, group, bad):
    with pytest.raises(MissingConfigException) as err:
        compose(f"{group}={bad}")
    msg = str(err.value)
    assert f"Available options in '{group}'" in msg
    for option in (SCHEMAS.get(group) or {"fp32": 1, "fp8": 1}):
        assert option in msg


@pytest.mark.parametrize("override", ["lr=fast", "log=loud", "max_iters=many", "format.loss_scale.mode=huge"])
def test_wrongly_typed_values_fail_naming_the_key(compose, override):
    with pytest.raises(ConfigCompositionException) as err:
        compose(override)
    cause = err.value.__cause__
    assert isinstance(cause, (ValidationError, ConfigKeyError, ValueError))
    assert override.split("=")[0].split(".")[-1] in str(err.value) + str(cause)


@pytest.mark.parametrize("override,field", [("max_iters=0", "max_iters"), ("eval_every=0", "eval_every"),
                                            ("lr=-1", "lr"), ("target_accuracy=1.5", "target_accuracy"),
                                            ("threads=0", "threads"), ("batch_size=100000", "batch_size")])
def test_out_of_range_values_raise_value_error_naming_the_field(compose, tmp_path, override, field):
    with pytest.raises(ValueError, match=field):
        train(compose(override), tmp_path)


def test_default_composition_is_the_documented_recipe(compose):
    cfg = compose(fast=False)
    assert (cfg.format.name, cfg.model.name, cfg.data.name) == ("fp32", "cnn1d", "mnist1d")
    assert cfg.target_accuracy == 0.9 and cfg.target_loss is None


def test_fp8_recipe_follows_wang_et_al(compose):
    f = compose("format=fp8").format
    assert f.fmt == "fp8_152"
    assert (f.optim.weight, f.optim.weight_rounding) == ("fp16_169", "stochastic")
    assert (f.optim.grad, f.optim.grad_rounding) == ("fp8_152", "stochastic")
