"""The vectorised paths of kernels/mma_vec.py (and the arithmetic grid check of kernels/mma_check.py) give the
scalar cores' bits (kernels/mma_scalar.py through kernels/mma_cpu.py), zero tolerance, on random and adversarial
operands: every element value, subnormal elements and scales, zeros, zero scales, scales at both ends of
E8M0, large c (overflow to inf), subnormal c, cancellation against c, infinite and NaN c, NaN scales, chains
of many steps, shapes that cross the kernels' tiles. The scalar cores are checked against MMA-Sim's vectors
in tests/test_mad_mma.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from emunum.formats import get_format
from emunum.kernels import mma_check, mma_cpu
from emunum.mad import mma_backend, scaled_gemm
from emunum.mad.mma import MMA_PRESETS, MMAKind

FUSED8 = [n for n, u in MMA_PRESETS.items() if u.kind == MMAKind.NV_FUSED and u.element_format.bits <= 8]
GROUPS = [n for n, u in MMA_PRESETS.items() if u.kind == MMAKind.NV_GROUPS]
F8 = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def scalar(a, sa, b, sb, c, unit) -> np.ndarray:
    """The scalar cores' D (float32) on the same operands."""
    out = np.empty((a.shape[0], b.shape[1]))
    ops = mma_backend._scalar_operands(a, sa, b, sb, c, unit)
    mma_cpu.gemm(*(t.numpy() for t in ops), out, unit.params())
    return out.astype(np.float32)


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return bool(((got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))).all())


def elements(shape, fmt: str, g: torch.Generator, kind: str) -> torch.Tensor:
    """Element values: every code of the format ("all"), tiny ones (subnormals, zeros) and large ones mixed
    ("spread"), or zeros with a few tiny values ("sparse")."""
    if fmt == "fp4_e2m1":
        vals = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
        vals = torch.cat([vals, -vals])
    else:
        vals = torch.arange(256, dtype=torch.uint8).view(F8[fmt]).float()
        vals = vals[torch.isfinite(vals)]
    if kind == "spread":
        small = vals[(vals.abs() < 2.0 ** (get_format(fmt).emin + 1))]
        vals = torch.cat([small.repeat(8), vals.abs().max().reshape(1) * torch.tensor([1.0, -1.0])])
    x = vals[torch.randint(len(vals), shape, generator=g)]
    if kind == "spread":
        x = torch.where(torch.rand(shape, generator=g) < 0.9, x, vals[-2] * torch.sign(torch.randn(shape, generator=g)))
    if kind == "sparse":
        x = torch.where(torch.rand(shape, generator=g) < 0.9, torch.zeros(()), x)
    return x


def scales(shape, scale: str, g: torch.Generator, nan: bool) -> torch.Tensor:
    if scale == "e8m0":
        s = torch.exp2(torch.randint(-127, 128, shape, generator=g).double())
        near_one = torch.exp2(torch.randint(-8, 8, shape, generator=g).double())
        s = torch.where(torch.rand(shape, generator=g) < 0.5, s, near_one)
    else:
        codes = torch.randint(0, 127, shape, generator=g).to(torch.uint8)  # non-negative E4M3: 0, subnormals .. 448
        s = codes.view(torch.float8_e4m3fn).double()
    if nan:
        s = torch.where(torch.rand(shape, generator=g) < 0.05, torch.full_like(s, float("nan")), s)
    return s


def accumulators(shape, kind: str, g: torch.Generator, a, b) -> torch.Tensor:
    """c: zeros, random fp32 values over the whole range (large ones overflow), subnormals, the negated fp32
    dot product (cancellation), or a mix with infinities and NaN."""
    if kind == "zero":
        return torch.zeros(shape)
    if kind == "wide":
        return torch.randn(shape, generator=g) * torch.exp2(torch.randint(-149, 128, shape, generator=g).float())
    if kind == "subnormal":
        return torch.randint(-2**23, 2**23, shape, generator=g).float() * 2.0**-149
    if kind == "cancel":
        return -(a.double() @ b.double()).float()
    c = torch.randn(shape, generator=g)
    special = torch.tensor([float("inf"), -float("inf"), float("nan"), 3.0e38, -3.4e38])
    pick = torch.randint(len(special), shape, generator=g)
    return torch.where(torch.rand(shape, generator=g) < 0.2, special[pick], c)


CASES = [("all", "zero"), ("all", "wide"), ("spread", "subnormal"), ("spread", "cancel"), ("sparse", "subnormal"),
         ("all", "special"), ("spread", "wide")]


def operands(unit, kind, ckind, seed, M=19, N=133, steps=5, nan_scales=False):
    g = torch.Generator().manual_seed(seed)
    K = unit.terms * steps
    a = elements((M, K), unit.element, g, kind)
    b = elements((K, N), unit.element, g, kind)
    sa = sb = None
    if unit.scale:
        sa = scales((M, K // unit.block), unit.scale, g, nan_scales)
        sb = scales((K // unit.block, N), unit.scale, g, nan_scales)
    if kind == "spread" and sa is not None:  # one block pair far above the others: products truncate
        sa[:, 1] = 2.0**120 if unit.scale == "e8m0" else 448.0
    c = accumulators((M, N), ckind, g, a, b)
    return a, sa, b, sb, c


def run_fast(path, a, sa, b, sb, c, unit):
    out = c.numpy().astype(np.float64)
    took = path(a.contiguous(), sa, b.contiguous(), sb, unit, out)
    return took, out.astype(np.float32)


@pytest.mark.parametrize("kind,ckind", CASES)
@pytest.mark.parametrize("name", FUSED8)
def test_fused8_gives_the_scalar_cores_bits(name, kind, ckind):
    unit = MMA_PRESETS[name]
    for seed in range(3):
        a, sa, b, sb, c = operands(unit, kind, ckind, seed)
        took, got = run_fast(mma_backend._fused8, a, sa, b, sb, c, unit)
        assert took
        assert same_bits(got, scalar(a, sa, b, sb, c, unit)), (name, kind, ckind, seed)


@pytest.mark.parametrize("kind,ckind", CASES)
@pytest.mark.parametrize("name", GROUPS)
def test_groups_vec_gives_the_scalar_cores_bits(name, kind, ckind):
    unit = MMA_PRESETS[name]
    for seed in range(3):
        a, sa, b, sb, c = operands(unit, kind, ckind, seed, nan_scales=seed == 2)
        took, got = run_fast(mma_backend._groups_vec, a, sa, b, sb, c, unit)
        assert took
        assert same_bits(got, scalar(a, sa, b, sb, c, unit)), (name, kind, ckind, seed)


# Units beside the presets: a narrower or wider accumulator, a shorter result, another step length; the fast
# paths take their parameters from the unit.
VARIANTS = [("b200_mxf8f6f4_e4m3", dict(frac_bits=24)), ("b200_f8f6f4_e5m2", dict(frac_bits=3, out_man=10)),
            ("h100_wgmma_e4m3", dict(terms=16, k=16)), ("b200_mxf4nvf4_ue4m3", dict(frac_bits=36)),
            ("b200_mxf4nvf4_ue8m0", dict(frac_bits=20, out_man=12)), ("b200_mxf4nvf4_ue4m3", dict(terms=32, k=32))]


@pytest.mark.parametrize("name,changes", VARIANTS)
def test_fast_paths_follow_the_units_parameters(name, changes):
    unit = MMA_PRESETS[name].replace(**changes)
    path = mma_backend._groups_vec if unit.kind == MMAKind.NV_GROUPS else mma_backend._fused8
    for kind, ckind in CASES:
        a, sa, b, sb, c = operands(unit, kind, ckind, 7, M=9, N=40, steps=3)
        took, got = run_fast(path, a, sa, b, sb, c, unit)
        assert took
        assert same_bits(got, scalar(a, sa, b, sb, c, unit)), (kind, ckind)


def test_dispatch_declines_what_the_fast_paths_do_not_cover():
    """NaN scales, non-finite elements or scales that change within a step (fused) and groups of other than
    16 elements go to other paths, with the scalar cores' bits."""
    unit = MMA_PRESETS["b200_mxf8f6f4_e4m3"]
    a, sa, b, sb, c = operands(unit, "all", "wide", 3, nan_scales=True)
    assert not run_fast(mma_backend._fused8, a, sa, b, sb, c, unit)[0]
    assert same_bits(mma_backend.gemm(a, sa, b, sb, c, unit).numpy(), scalar(a, sa, b, sb, c, unit))
    unit = MMA_PRESETS["b200_f8f6f4_e5m2"]
    a, sa, b, sb, c = operands(unit, "all", "wide", 4)
    a[0, 0] = float("inf")
    assert not run_fast(mma_backend._fused8, a, sa, b, sb, c, unit)[0]
    assert same_bits(mma_backend.gemm(a, sa, b, sb, c, unit).numpy(), scalar(a, sa, b, sb, c, unit))
    unit = MMA_PRESETS["b200_mxf8f6f4_e4m3"].replace(block=16)  # scales that change within a step
    a, sa, b, sb, c = operands(unit, "spread", "wide", 6, steps=3)
    assert not run_fast(mma_backend._fused8, a, sa, b, sb, c, unit)[0]
    assert same_bits(mma_backend.gemm(a, sa, b, sb, c, unit).numpy(), scalar(a, sa, b, sb, c, unit))
    unit = MMA_PRESETS["b200_mxf4nvf4_ue4m3"].replace(block=8, terms=8, k=8)
    a, sa, b, sb, c = operands(unit, "all", "wide", 5, steps=3)
    assert not run_fast(mma_backend._groups_vec, a, sa, b, sb, c, unit)[0]
    assert same_bits(mma_backend.gemm(a, sa, b, sb, c, unit).numpy(), scalar(a, sa, b, sb, c, unit))


GRID_FORMATS = ["fp4_e2m1", "e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fmt", GRID_FORMATS)
def test_arithmetic_grid_check_agrees_with_the_value_set(fmt, dtype):
    """count_off_grid counts exactly the values that are not in the format's value set (torch.isin on its
    values, NaN and inf where the format has them): values, their float32 neighbours, halves, out-of-range
    values, -0, NaN, +-inf, float64 subnormals."""
    f = get_format(fmt)
    grid = scaled_gemm._arithmetic_grid(f)
    assert grid is not None
    v = torch.from_numpy(f.values().astype(np.float64))
    v = v[torch.isfinite(v)]
    near = torch.cat([torch.nextafter(v.float(), torch.tensor(np.inf, dtype=torch.float32)).double(),
                      torch.nextafter(v.float(), torch.tensor(-np.inf, dtype=torch.float32)).double()])
    extra = torch.tensor([-0.0, float("nan"), float("inf"), -float("inf"), 1e30, 2.0**-140, 5e-324, 1e300])
    x = torch.cat([v, near, v * 0.5, v * 3, v * 1.25, extra]).to(dtype)
    want = (~scaled_gemm._on_grid(x, f)).numpy()
    assert int(want.sum()) > 0
    assert mma_check.count_off_grid(x.numpy(), *grid, *scaled_gemm._value_set(f)[1:]) == int(want.sum())
    for i in range(0, len(x), 7):  # element by element on a sample
        assert (mma_check.count_off_grid(x[i:i + 1].numpy(), *grid, *scaled_gemm._value_set(f)[1:]) == 1) == want[i]
