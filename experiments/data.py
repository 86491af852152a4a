"""Datasets for the training loop, all in memory as float32 tensors of shape (N, channels, length).

- mnist1d: MNIST-1D generated offline by ``mnist1d.data.make_dataset`` (no download), cached as .npz.
- digits: scikit-learn's bundled 8x8 digits, flattened to length 64, standardised with training statistics.
- regression13: synthetic 13-input, 1-output regression (see ``Regression13Config``).
- idx: MNIST-format IDX files from a local directory.
- stdlib, text: byte-level language-model corpora (``experiments/text_data.py``): x and y are int64 (N, context).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import zipfile
import struct
from pathlib import Path

import numpy as np
import torch

from . import text_data
from .dataset import Dataset

log = logging.getLogger(__name__)


def cache_dir(configured: str | None) -> Path:
    d = configured or os.environ.get("EMUNUM_CACHE_DIR") or os.path.join("~", ".cache", "emunum")
    return Path(os.path.expanduser(d))


def _as_dataset(name, xtr, ytr, xva, yva, task, num_outputs) -> Dataset:
    def x(a):
        t = torch.as_tensor(np.ascontiguousarray(a), dtype=torch.float32)
        return t.reshape(t.shape[0], 1, -1) if t.dim() != 3 else t

    def y(a):
        if task == "classification":
            return torch.as_tensor(np.asarray(a), dtype=torch.int64)
        return torch.as_tensor(np.asarray(a), dtype=torch.float32).reshape(-1, 1)

    return Dataset(name, x(xtr), y(ytr), x(xva), y(yva), task, num_outputs)


def _standardise(xtr: np.ndarray, xva: np.ndarray):
    mu, sd = xtr.mean(), xtr.std()
    return (xtr - mu) / sd, (xva - mu) / sd


def _split(n: int, val_fraction: float, seed: int, field: str):
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"{field}={val_fraction} is out of range; allowed: 0 < {field} < 1")
    perm = np.random.default_rng(seed).permutation(n)
    k = int(round(n * val_fraction))
    if k == 0 or k == n:
        raise ValueError(f"{field}={val_fraction} leaves an empty split of {n} examples")
    return perm[k:], perm[:k]


# ---- mnist1d -------------------------------------------------------------------------------------------
def _defaults_file(cache: Path) -> Path | None:
    """Where the installed mnist1d's default arguments are kept (``_mnist1d_defaults``); None without mnist1d."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return cache / f"mnist1d_defaults_{version('mnist1d')}.json"
    except PackageNotFoundError:
        return None


def _remember_defaults(cache: Path, args: dict) -> None:
    """Write mnist1d's default arguments to ``_defaults_file`` (atomically; a read-only cache is left as it is)."""
    path = _defaults_file(cache)
    if path is None:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(args))
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        log.debug("could not write %s: %s", path, e)


def _mnist1d_defaults(cache: Path) -> dict:
    """``mnist1d.data.get_dataset_args(as_dict=True)``, read from ``_defaults_file`` where a run wrote it for the
    installed mnist1d, else from mnist1d itself (and written there). Importing mnist1d costs ~0.9 CPU-s (it
    imports matplotlib and scipy); a run that finds its draw cached needs only these arguments (the cache file
    is named after their digest), so the jobs of a sweep skip that import. The draw itself is always generated
    from mnist1d's own defaults (``load_mnist1d``), which are written here again."""
    path = _defaults_file(cache)
    if path is not None:
        try:
            args = json.loads(path.read_text())
            if isinstance(args, dict) and "num_samples" in args and "seed" in args:
                return args
        except (OSError, ValueError):
            pass  # absent or unreadable: from mnist1d
    from mnist1d.data import get_dataset_args

    args = get_dataset_args(as_dict=True)
    _remember_defaults(cache, args)
    return args


def _mnist1d_path(cfg, args: dict) -> Path:
    """The cache file of the draw ``args`` (mnist1d's arguments): named after the digest of all but the URL."""
    recipe = {k: v for k, v in args.items() if k != "url"}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir(cfg.cache_dir) / f"mnist1d_{digest}.npz"


def load_mnist1d(cfg) -> Dataset:
    n, n_train = int(cfg.num_samples), int(cfg.get("train_samples", 4000))
    if n < 20 or n % 10:
        raise ValueError(f"data.num_samples={n} must be a multiple of 10 (10 classes), at least 20")
    if not 1 <= n_train < n:
        raise ValueError(f"data.train_samples={n_train} is out of range; allowed: 1..{n - 1} (data.num_samples-1)")
    # generated whole (train_split 1) and split here: the first n_train train, as the paper's 80/20 split of
    # 5000 does with n_train=4000
    draw = dict(num_samples=n, train_split=1.0, seed=int(cfg.seed), shuffle_seq=bool(cfg.shuffle_seq))
    args = {**_mnist1d_defaults(cache_dir(cfg.cache_dir)), **draw}
    path = _mnist1d_path(cfg, args)
    arrays = None
    if path.exists():
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in ("x", "y")}
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:  # a corrupt cache: regenerate
            log.warning("the MNIST-1D cache %s is unreadable (%s: %s); regenerating it", path, type(e).__name__, e)
    if arrays is None:
        from mnist1d.data import get_dataset_args, make_dataset
        from mnist1d.utils import ObjectView

        defaults = get_dataset_args(as_dict=True)  # mnist1d's own, whatever the file of defaults said
        _remember_defaults(cache_dir(cfg.cache_dir), defaults)
        args = {**defaults, **draw}
        path = _mnist1d_path(cfg, args)  # named after what it holds
        state = np.random.get_state()  # make_dataset reseeds numpy's global generator; put it back
        try:
            d = make_dataset(ObjectView(args))
        finally:
            np.random.set_state(state)
        arrays = {k: np.asarray(d[k]) for k in ("x", "y")}  # the whole draw (train_split 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
    x, y = arrays["x"], arrays["y"]
    return _as_dataset("mnist1d", x[:n_train], y[:n_train], x[n_train:], y[n_train:], "classification", 10)


# ---- digits --------------------------------------------------------------------------------------------
def load_digits(cfg) -> Dataset:
    from sklearn.datasets import load_digits as sk_digits

    d = sk_digits()
    x, y = d.data.astype(np.float64), d.target.astype(np.int64)
    tr, va = _split(len(y), float(cfg.val_fraction), int(cfg.split_seed), "data.val_fraction")
    xtr, xva = _standardise(x[tr], x[va])
    return _as_dataset("digits", xtr, y[tr], xva, y[va], "classification", 10)


# ---- regression13 --------------------------------------------------------------------------------------
def load_regression13(cfg) -> Dataset:
    n_tr, n_va = int(cfg.num_train), int(cfg.num_val)
    for k, v in (("data.num_train", n_tr), ("data.num_val", n_va)):
        if v < 1:
            raise ValueError(f"{k}={v} must be >= 1")
    rng = np.random.default_rng(int(cfg.seed))
    w = rng.standard_normal(13) / np.sqrt(13)
    v = rng.standard_normal(13) / np.sqrt(13)
    x = rng.standard_normal((n_tr + n_va, 13))
    y = x @ w + 0.5 * np.sin(3.0 * (x @ v)) + float(cfg.noise) * rng.standard_normal(n_tr + n_va)
    return _as_dataset("regression13", x[:n_tr], y[:n_tr], x[n_tr:], y[n_tr:], "regression", 1)


# ---- idx -----------------------------------------------------------------------------------------------
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path) -> np.ndarray:
    """One IDX file (optionally gzipped): magic 0x0000 <dtype> <ndim>, big-endian uint32 dims, data."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic {raw[:4].hex()})")
    ndim = raw[3]
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    count = int(np.prod(dims)) if dims else 0
    data = np.frombuffer(raw, dtype=dtype, count=count, offset=4 + 4 * ndim)
    return data.reshape(dims)


def _find(root: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (root / name).exists():
            return root / name
    return None


def load_idx(cfg) -> Dataset:
    from omegaconf import OmegaConf

    if (OmegaConf.is_config(cfg) and OmegaConf.is_missing(cfg, "path")) or cfg.path in (None, ""):
        raise ValueError("data.path is not set; allowed: a directory holding train-images-idx3-ubyte and "
                         "train-labels-idx1-ubyte (e.g. data=idx data.path=/data/mnist)")
    root = Path(os.path.expanduser(str(cfg.path)))
    if not root.is_dir():
        raise ValueError(f"data.path={str(cfg.path)!r} does not exist or is not a directory; allowed: a directory "
                         "holding train-images-idx3-ubyte and train-labels-idx1-ubyte (optionally .gz)")
    files = {k: _find(root, k) for k in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                         "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
    for k in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        if files[k] is None:
            raise ValueError(f"data.path={str(cfg.path)!r} has no {k} (or {k}.gz); found: "
                             f"{sorted(p.name for p in root.iterdir())}")
    x = read_idx(files["train-images-idx3-ubyte"]).astype(np.float64)
    y = read_idx(files["train-labels-idx1-ubyte"]).astype(np.int64)
    if len(x) != len(y):
        raise ValueError(f"{files['train-images-idx3-ubyte']} has {len(x)} images but the labels file {len(y)}")
    if cfg.limit is not None:
        x, y = x[: int(cfg.limit)], y[: int(cfg.limit)]
    if files["t10k-images-idx3-ubyte"] and files["t10k-labels-idx1-ubyte"]:
        xva = read_idx(files["t10k-images-idx3-ubyte"]).astype(np.float64)
        yva = read_idx(files["t10k-labels-idx1-ubyte"]).astype(np.int64)
        xtr, ytr = x, y
    else:
        tr, va = _split(len(y), float(cfg.val_fraction), int(cfg.split_seed), "data.val_fraction")
        xtr, ytr, xva, yva = x[tr], y[tr], x[va], y[va]
    xtr, xva = xtr.reshape(len(xtr), 1, -1), xva.reshape(len(xva), 1, -1)
    xtr, xva = _standardise(xtr, xva)
    return _as_dataset("idx", xtr, ytr, xva, yva, "classification", int(max(ytr.max(), yva.max())) + 1)


LOADERS = {"mnist1d": load_mnist1d, "digits": load_digits, "regression13": load_regression13, "idx": load_idx,
           **text_data.LOADERS}


def load(cfg) -> Dataset:
    """The dataset named by ``cfg.name`` (a ``DataConfig``)."""
    if cfg.name not in LOADERS:
        raise ValueError(f"data.name={cfg.name!r} is not a dataset; allowed: {', '.join(LOADERS)}")
    return LOADERS[cfg.name](cfg)


class BatchSampler:
    """Mini-batch indices as a pure function of (seed, iteration): epoch e uses a permutation drawn from a
    generator seeded with ``derive_seed(seed, 1, e)``; the last incomplete batch of an epoch is dropped.
    A resumed run therefore sees exactly the batches of an uninterrupted one."""

    def __init__(self, n: int, batch_size: int, seed: int):
        if batch_size < 1 or batch_size > n:
            raise ValueError(f"batch_size={batch_size} is out of range; allowed: 1..{n} (the training set size)")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.per_epoch = n // batch_size
        self._epoch, self._perm = None, None

    def indices(self, iteration: int) -> torch.Tensor:
        from emunum.optim import derive_seed

        epoch, k = divmod(iteration, self.per_epoch)
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(derive_seed(self.seed, 1, epoch))
            self._perm, self._epoch = torch.randperm(self.n, generator=g), epoch
        return self._perm[k * self.batch_size:(k + 1) * self.batch_size]
