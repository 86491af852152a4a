"""Datasets and batch order: IDX files written here, the MNIST-1D cache, deterministic sampling."""
from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import torch

from experiments import data as data_mod
from experiments.data import BatchSampler, read_idx
from experiments.loop import train


def write_idx(path, array: np.ndarray, gz: bool = False) -> None:
    codes = {np.dtype(np.uint8): 0x08, np.dtype(">i4"): 0x0C, np.dtype(">f4"): 0x0D}
    a = np.ascontiguousarray(array)
    header = bytes([0, 0, codes[a.dtype], a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape)
    payload = header + a.tobytes()
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)


def make_idx_dir(root, n=120, test=True, gz=False):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, n).astype(np.uint8)
    x = (rng.integers(0, 40, (n, 8, 8)) + 20 * y[:, None, None]).astype(np.uint8)  # label-dependent images
    root.mkdir(parents=True, exist_ok=True)
    sfx = ".gz" if gz else ""
    write_idx(root / f"train-images-idx3-ubyte{sfx}", x, gz)
    write_idx(root / f"train-labels-idx1-ubyte{sfx}", y, gz)
    if test:
        write_idx(root / f"t10k-images-idx3-ubyte{sfx}", x[:40], gz)
        write_idx(root / f"t10k-labels-idx1-ubyte{sfx}", y[:40], gz)
    return x, y


@pytest.mark.parametrize("dtype", [np.uint8, ">i4", ">f4"])
@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_round_trips(tmp_path, dtype, gz):
    a = (np.arange(2 * 3 * 5).reshape(2, 3, 5) * 7 % 251).astype(dtype)
    p = tmp_path / ("a.idx.gz" if gz else "a.idx")
    write_idx(p, a, gz)
    b = read_idx(p)
    assert b.shape == a.shape and b.dtype == np.dtype(dtype) and np.array_equal(a, b)


def test_read_idx_rejects_other_files(tmp_path):
    p = tmp_path / "x.idx"
    p.write_bytes(b"\x89PNG....")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(p)


@pytest.mark.parametrize("test_split,gz", [(True, False), (False, True)])
def test_idx_dataset_trains(compose, tmp_path, test_split, gz):
    x, y = make_idx_dir(tmp_path / "mnist", test=test_split, gz=gz)
    cfg = compose("data=idx", f"data.path={tmp_path / 'mnist'}", "model=mlp")
    ds = data_mod.load(cfg.data)
    assert ds.input_shape == (1, 64) and ds.num_outputs == 10
    assert len(ds.x_val) == (40 if test_split else 12) and len(ds.x_train) == (120 if test_split else 108)
    res = train(cfg, tmp_path / "run")
    assert res.iterations_run == 4 and res.data == "idx"


def test_idx_missing_path_fails_clearly(compose, tmp_path):
    cfg = compose("data=idx", f"data.path={tmp_path / 'nowhere'}")
    with pytest.raises(ValueError, match="data.path=.*nowhere.*does not exist.*train-images-idx3-ubyte"):
        train(cfg, tmp_path / "run")
    with pytest.raises(ValueError, match="data.path is not set"):
        train(compose("data=idx"), tmp_path / "run")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no train-images-idx3-ubyte"):
        train(compose("data=idx", f"data.path={tmp_path / 'empty'}"), tmp_path / "run")


def test_mnist1d_cache_holds_the_generated_dataset(compose, tmp_path):
    from mnist1d.data import get_dataset_args, make_dataset

    cfg = compose(f"data.cache_dir={tmp_path}")
    state = np.random.get_state()
    first = data_mod.load(cfg.data)
    assert np.array_equal(np.random.get_state()[1], state[1]), "numpy's global generator was left reseeded"
    assert len(list(tmp_path.glob("mnist1d_*.npz"))) == 1
    again = data_mod.load(cfg.data)  # from the cache
    ref = make_dataset(get_dataset_args())  # the published dataset: 5000 examples, 4000 train / 1000 test
    for got in (first, again):
        assert torch.equal(got.x_train[:, 0], torch.as_tensor(ref["x"], dtype=torch.float32))
        assert torch.equal(got.y_val, torch.as_tensor(ref["y_test"]))
    assert first.input_shape == (1, 40) and len(first.x_train) == 4000 and len(first.x_val) == 1000


def test_default_mnist1d_validates_on_8000_examples_of_one_generated_draw(compose, tmp_path):
    """The default (num_samples=12000, train_samples=4000) is the published recipe at 12000 examples: the
    first 4000 train and the other 8000 validate, normalised together as mnist1d does."""
    from mnist1d.data import get_dataset_args, make_dataset
    from mnist1d.utils import ObjectView

    cfg = compose(f"data.cache_dir={tmp_path}", "data.num_samples=12000")
    assert (cfg.data.num_samples, cfg.data.train_samples) == (12000, 4000)
    got = data_mod.load(cfg.data)
    args = get_dataset_args(as_dict=True)
    args.update(num_samples=12000, train_split=4000 / 12000)
    ref = make_dataset(ObjectView(args))
    assert torch.equal(got.x_train[:, 0], torch.as_tensor(ref["x"], dtype=torch.float32))
    assert torch.equal(got.x_val[:, 0], torch.as_tensor(ref["x_test"], dtype=torch.float32))
    assert torch.equal(got.y_val, torch.as_tensor(ref["y_test"])) and len(got.x_val) == 8000


@pytest.mark.parametrize("key, value, message", [
    ("num_samples", 12005, "data.num_samples=12005 must be a multiple of 10"),
    ("train_samples", 5000, "data.train_samples=5000 is out of range; allowed: 1..4999"),
    ("train_samples", 0, "data.train_samples=0 is out of range"),
])
def test_bad_mnist1d_sizes_are_named(compose, key, value, message):
    cfg = compose(f"data.{key}={value}")
    with pytest.raises(ValueError, match=message):
        data_mod.load(cfg.data)


def test_batch_order_is_a_function_of_seed_and_iteration():
    a, b = BatchSampler(103, 10, seed=5), BatchSampler(103, 10, seed=5)
    seq = [a.indices(i) for i in range(25)]
    assert all(torch.equal(b.indices(i), seq[i]) for i in reversed(range(25)))  # any order of calls
    epoch0 = torch.cat(seq[:10])
    assert len(set(epoch0.tolist())) == 100  # each epoch: distinct examples, the last partial batch dropped
    assert not torch.equal(torch.cat(seq[10:20]), epoch0)
    assert not torch.equal(BatchSampler(103, 10, seed=6).indices(0), seq[0])
    with pytest.raises(ValueError, match="batch_size"):
        BatchSampler(5, 6, seed=0)


def test_regression13_is_deterministic_and_learnable_by_its_definition(compose):
    cfg = compose("data=regression13")
    d1, d2 = data_mod.load(cfg.data), data_mod.load(cfg.data)
    assert torch.equal(d1.x_train, d2.x_train) and torch.equal(d1.y_val, d2.y_val)
    assert d1.input_shape == (1, 13) and d1.y_train.shape == (4000, 1) and d1.task == "regression"
    # the noise floor: a perfect model's MSE is noise**2 = 0.01, below the default target 0.05
    assert cfg.target_loss == 0.05 and cfg.data.noise**2 < cfg.target_loss


def test_digits_split_is_disjoint_and_standardised(compose):
    d = data_mod.load(compose("data=digits").data)
    assert len(d.x_train) + len(d.x_val) == 1797 and d.input_shape == (1, 64)
    assert abs(float(d.x_train.mean())) < 1e-5 and abs(float(d.x_train.std()) - 1) < 1e-3


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_corrupt_mnist1d_cache_is_regenerated(compose, tmp_path, damage):
    # a small draw (generating MNIST-1D takes ~0.3 ms an example): the cache logic does not depend on the size
    cfg = compose(f"data.cache_dir={tmp_path}", "data.num_samples=600", "data.train_samples=400")
    first = data_mod.load(cfg.data)
    (path,) = tmp_path.glob("mnist1d_*.npz")
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 3], "garbage": b"PK\x03\x04 not a zip", "empty": b""}[damage])
    again = data_mod.load(cfg.data)
    assert torch.equal(again.x_train, first.x_train) and torch.equal(again.y_val, first.y_val)
    with np.load(path) as z:  # the cache was rewritten whole
        assert np.array_equal(z["y"][400:], first.y_val.numpy()) and len(z["y"]) == 600


def test_a_run_that_finds_its_draw_cached_does_not_import_mnist1d(compose, tmp_path):
    """mnist1d's default arguments (which name the cache file) are kept beside the draws: a sweep job whose draw
    is cached skips importing mnist1d (~0.9 CPU-s) and loads the same arrays."""
    import hashlib
    import json
    import subprocess
    import sys
    from pathlib import Path

    from mnist1d.data import get_dataset_args

    cfg = compose(f"data.cache_dir={tmp_path}", "data.num_samples=600", "data.train_samples=400")
    first = data_mod.load(cfg.data)
    (defaults,) = tmp_path.glob("mnist1d_defaults_*.json")
    assert json.loads(defaults.read_text()) == get_dataset_args(as_dict=True)
    code = ("import sys, hashlib; from omegaconf import OmegaConf; from experiments import data\n"
            f"d = data.load(OmegaConf.create({dict(cfg.data)!r}))\n"
            "print('mnist1d' in sys.modules, hashlib.sha256(d.x_train.numpy().tobytes()).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", hashlib.sha256(first.x_train.numpy().tobytes()).hexdigest()]


@pytest.mark.parametrize("damage", ["garbage", "a wrong default"])
def test_a_damaged_defaults_file_still_gives_the_draw_of_mnist1ds_defaults(compose, tmp_path, damage):
    """The file of defaults only names the cache file: with a damaged one the draw is generated from mnist1d's
    own defaults, cached under their name, and the file is written again."""
    import json

    from mnist1d.data import get_dataset_args

    cfg = compose(f"data.cache_dir={tmp_path}", "data.num_samples=600", "data.train_samples=400")
    first = data_mod.load(cfg.data)
    (defaults,) = tmp_path.glob("mnist1d_defaults_*.json")
    (draw,) = tmp_path.glob("mnist1d_*.npz")
    defaults.write_text("{not json" if damage == "garbage" else
                        json.dumps({**get_dataset_args(as_dict=True), "template_len": 13}))
    draw.unlink()
    again = data_mod.load(cfg.data)
    assert torch.equal(again.x_train, first.x_train) and torch.equal(again.y_val, first.y_val)
    assert [p.name for p in tmp_path.glob("mnist1d_*.npz")] == [draw.name]
    assert json.loads(defaults.read_text()) == get_dataset_args(as_dict=True)
