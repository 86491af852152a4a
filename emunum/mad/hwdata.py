"""Measured tensor-core outputs (Khattak and Mikaitis, MATLAB-tensor-core ``model_validation/``): loading.

Layout of one GPU x input-format pair (a directory ``<GPU>/<format>/``):
  ``a_<GPU>_<fmt>.txt``, ``b_<GPU>_<fmt>.txt``: one vector per line, K hexadecimal binary32 words;
  ``c_<GPU>_fp32.txt``, ``d_<GPU>_fp32.txt`` (and ``d_<GPU>_fp16.txt``): one 32-character binary word per
  line (the fp16 file holds the fp16 value's binary32 word). d is what the GPU returned for d = a.b + c in
  one MMA instruction. Files may be gzip-compressed (``.txt.gz``, as vendored in ``tests/data``).
For the H100/H200 fp8 pairs the GPU accumulated into a zeroed D (wgmma), so c = 0 there (``c_is_zero``),
as the authors' validation does.
"""
from __future__ import annotations

import gzip
import os
from dataclasses import dataclass

import numpy as np

GPUS = ("V100", "A100", "A2", "Ada", "L40S", "H100", "H200", "B200")
FORMATS = ("fp16", "bf16", "tf32", "E4M3", "E5M2")
PRESET_GPU = {"V100": "v100", "A100": "a100", "A2": "a2", "Ada": "ada", "L40S": "l40s", "H100": "h100",
              "H200": "h200", "B200": "b200"}
PRESET_FMT = {"fp16": "fp16", "bf16": "bf16", "tf32": "tf32", "E4M3": "fp8_e4m3", "E5M2": "fp8_e5m2"}


@dataclass(frozen=True)
class Pair:
    """One GPU x format data set: a, b (n, K) float32; c (n,) float32; d32 (n,) and d16 (n,) or None."""

    gpu: str
    fmt: str
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    d32: np.ndarray
    d16: np.ndarray | None

    @property
    def preset(self) -> str:
        return f"{PRESET_GPU[self.gpu]}_{PRESET_FMT[self.fmt]}"

    @property
    def c_is_zero(self) -> bool:
        return self.gpu in ("H100", "H200") and self.fmt in ("E4M3", "E5M2")


def _open(path: str):
    if os.path.exists(path):
        return open(path, "rt")
    if os.path.exists(path + ".gz"):
        return gzip.open(path + ".gz", "rt")
    return None


def _hex_rows(f, limit) -> np.ndarray:
    rows = []
    for line in f:
        if line.strip():
            rows.append([int(w, 16) for w in line.split()])
            if limit is not None and len(rows) == limit:
                break
    return np.array(rows, dtype=np.uint32).view(np.float32)


def _bin_rows(f, limit) -> np.ndarray:
    vals = []
    for line in f:
        if line.strip():
            vals.append(int(line.strip(), 2))
            if limit is not None and len(vals) == limit:
                break
    return np.array(vals, dtype=np.uint32).view(np.float32)


def load_pair(root: str, gpu: str, fmt: str, limit: int | None = None) -> Pair | None:
    """The pair under ``root/<gpu>/<fmt>/`` (None when absent); ``limit`` keeps the first vectors only."""
    d = os.path.join(root, gpu, fmt)
    files = {}
    for key, name in (("a", f"a_{gpu}_{fmt}.txt"), ("b", f"b_{gpu}_{fmt}.txt"), ("c", f"c_{gpu}_fp32.txt"),
                      ("d32", f"d_{gpu}_fp32.txt"), ("d16", f"d_{gpu}_fp16.txt")):
        files[key] = _open(os.path.join(d, name))
    if any(files[k] is None for k in ("a", "b", "c", "d32")):
        for f in files.values():
            if f is not None:
                f.close()
        return None
    try:
        a, b = _hex_rows(files["a"], limit), _hex_rows(files["b"], limit)
        c, d32 = _bin_rows(files["c"], limit), _bin_rows(files["d32"], limit)
        d16 = None if files["d16"] is None else _bin_rows(files["d16"], limit)
    finally:
        for f in files.values():
            if f is not None:
                f.close()
    return Pair(gpu, fmt, a, b, c, d32, d16)


def load_all(root: str, limit: int | None = None) -> list[Pair]:
    """Every pair present under ``root`` (the ``model_validation`` directory), in GPUS x FORMATS order."""
    out = []
    for g in GPUS:
        for f in FORMATS:
            p = load_pair(root, g, f, limit)
            if p is not None:
                out.append(p)
    return out
