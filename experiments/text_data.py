"""Byte-level text corpora for the language-model workload (``data=stdlib``, ``data=text``).

Tokens are bytes (vocabulary 256; no tokenizer, any file works). A corpus is one byte string; its first
``1 - val_fraction`` is the training text and the rest the validation text (a contiguous split, as enwik8's).
Each split is cut into non-overlapping windows of ``context + 1`` bytes taken every ``context`` bytes (the
trailing bytes that do not fill a window are dropped): ``x`` is a window's first ``context`` bytes and ``y``
the next-byte targets (the window shifted by one). So x and y are int64 tensors of shape (N, context).

- stdlib: the source text of the running Python's standard library, found through
  ``sysconfig.get_paths()["stdlib"]``. The selection is deterministic: every ``*.py`` file under that
  directory, excluding the directories in ``STDLIB_EXCLUDED`` (tests, third-party site-packages, ...), in
  the order of their sorted relative POSIX paths, every k-th of them (k spreads ``max_bytes`` over the
  whole library; see ``stdlib_corpus``), concatenated whole (each preceded by a ``# file: <path>`` line),
  and cut at ``max_bytes``. Another Python version has another standard library, so the corpus' sha256
  digest goes into results.json (``data_sha256``): two runs compare only if their digests match.
- text: the bytes of the file ``path`` (the first ``max_bytes`` of them if set).
"""
from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .dataset import Dataset

VOCAB = 256  # byte values
# directory names left out of the stdlib corpus: test suites (largely generated data), third-party code,
# caches, and the two large GUI/tooling packages whose style differs most from the rest
STDLIB_EXCLUDED = frozenset({"test", "tests", "site-packages", "dist-packages", "__pycache__", "idlelib",
                             "lib2to3", "tkinter", "turtledemo", "ensurepip", "config-3"})


@dataclass(frozen=True)
class Corpus:
    """The corpus bytes, its sha256 digest and where it came from (``files``: relative paths, in order)."""

    text: bytes
    sha256: str
    source: str
    files: tuple[str, ...] = ()


def _check_int(field: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{field}={value!r} is out of range; allowed: an integer >= {minimum}")
    return value


def _max_bytes(cfg) -> int | None:
    v = cfg.max_bytes
    return None if v is None else _check_int("data.max_bytes", v, 1)


def stdlib_files(root: Path) -> list[str]:
    """The relative POSIX paths of the ``*.py`` files under ``root``, outside ``STDLIB_EXCLUDED`` directories
    (and their ``*-packages``/``config-*`` kin), sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in STDLIB_EXCLUDED and not d.startswith("config-")]
        rel = Path(dirpath).relative_to(root)
        out += [(rel / f).as_posix() for f in filenames if f.endswith(".py")]
    return sorted(out)


def stdlib_corpus(max_bytes: int | None, root: str | os.PathLike | None = None) -> Corpus:
    """The standard-library corpus (see the module docstring); ``root`` defaults to sysconfig's stdlib.

    So that a small ``max_bytes`` still spans the whole library, the files are taken with a stride: every
    k-th file of the sorted list (k = max(1, total size // max_bytes)) from the first, then, if those hold
    fewer than ``max_bytes``, every k-th from the second, and so on; the concatenation is cut at
    ``max_bytes`` (shorter only if the whole library is)."""
    root = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise ValueError(f"the standard library directory {str(root)!r} (sysconfig 'stdlib') does not exist")
    files = stdlib_files(root)
    if not files:
        raise ValueError(f"the standard library directory {str(root)!r} has no *.py files")
    sizes = [(root / rel).stat().st_size for rel in files]
    stride = 1 if max_bytes is None else max(1, sum(sizes) // max_bytes)
    parts, used, size = [], [], 0
    for rel in (f for start in range(stride) for f in files[start::stride]):
        chunk = f"# file: {rel}\n".encode() + (root / rel).read_bytes()
        parts.append(chunk)
        used.append(rel)
        size += len(chunk)
        if max_bytes is not None and size >= max_bytes:
            break
    text = b"".join(parts)
    if max_bytes is not None:
        text = text[:max_bytes]
    return Corpus(text, hashlib.sha256(text).hexdigest(), f"stdlib:{root}", tuple(used))


def file_corpus(path, max_bytes: int | None) -> Corpus:
    """The bytes of the text file ``path`` (its first ``max_bytes``)."""
    if path in (None, ""):
        raise ValueError("data.path is not set; allowed: a readable text file (e.g. data=text data.path=notes.txt)")
    p = Path(os.path.expanduser(str(path)))
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "does not exist"
        raise ValueError(f"data.path={str(path)!r} {what}; allowed: a readable text file")
    try:
        with open(p, "rb") as f:
            text = f.read() if max_bytes is None else f.read(max_bytes)
    except OSError as e:
        raise ValueError(f"data.path={str(path)!r} cannot be read ({e.strerror}); allowed: a readable text file") from e
    return Corpus(text, hashlib.sha256(text).hexdigest(), f"file:{p}")


def windows(text: bytes, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) int64 (N, context): windows of ``context + 1`` bytes every ``context`` bytes, y = x shifted."""
    a = np.frombuffer(text, dtype=np.uint8)
    n = (len(a) - 1) // context
    idx = np.arange(n)[:, None] * context + np.arange(context + 1)[None, :]
    w = torch.from_numpy(a[idx].astype(np.int64))
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def split(corpus: Corpus, context: int, val_fraction: float, source_field: str):
    """Train/validation windows of ``corpus`` (see the module docstring)."""
    context = _check_int("data.context", context, 1)
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"data.val_fraction={val_fraction} is out of range; allowed: 0 < data.val_fraction < 1")
    cut = int(round(len(corpus.text) * (1.0 - val_fraction)))
    train, val = corpus.text[:cut], corpus.text[cut:]
    for name, part in (("training", train), ("validation", val)):
        if len(part) < context + 1:
            raise ValueError(f"{source_field}: the {name} split has {len(part)} bytes, fewer than one window "
                             f"of data.context + 1 = {context + 1}; allowed: a larger corpus, a smaller "
                             f"data.context, or another data.val_fraction")
    return windows(train, context), windows(val, context)


def _dataset(name: str, corpus: Corpus, cfg, source_field: str):
    (xtr, ytr), (xva, yva) = split(corpus, cfg.context, float(cfg.val_fraction), source_field)
    return Dataset(name, xtr, ytr, xva, yva, "language_model", VOCAB, sha256=corpus.sha256)


def load_stdlib(cfg):
    return _dataset("stdlib", stdlib_corpus(_max_bytes(cfg)), cfg, "data=stdlib")


def load_text(cfg):
    from omegaconf import OmegaConf

    path = None if OmegaConf.is_config(cfg) and OmegaConf.is_missing(cfg, "path") else cfg.path
    return _dataset("text", file_corpus(path, _max_bytes(cfg)), cfg, f"data.path={str(path)!r}")


LOADERS = {"stdlib": load_stdlib, "text": load_text}
