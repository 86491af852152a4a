"""Matrix instructions (emunum/mad/mma.py, scaled_gemm.py, kernels/mma_*): bit for bit against MMA-Sim.

Oracle: MMA-Sim (github.com/microsoft/MMA-Sim, MIT), run outside the project by tests/data/mmasim/generate.py;
its outputs are committed with their provenance (tests/data/mmasim/PROVENANCE.md). Every preset, single
instructions and chains of 2 and 3, zero tolerance (bits compared; NaN matches NaN).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from emunum.mad import scaled_mm
from emunum.mad.mma import MMA_PRESETS, MMAUnit, mma_preset

DATA = os.path.join(os.path.dirname(__file__), "data", "mmasim")


def load(name: str, steps: int):
    """(a (V, K), a_scale, b (K, V), b_scale, c (V, V) with the vectors' c on the diagonal, expected d (V,)):
    the vectors as one GEMM whose diagonal holds them."""
    d = np.load(os.path.join(DATA, f"{name}.npz"))
    a, b = torch.from_numpy(d[f"a{steps}"]), torch.from_numpy(d[f"b{steps}"]).T
    sa = torch.from_numpy(d[f"sa{steps}"]) if f"sa{steps}" in d else None
    sb = torch.from_numpy(d[f"sb{steps}"]).T if f"sb{steps}" in d else None
    return a, sa, b, sb, torch.diag(torch.from_numpy(d[f"c{steps}"])), d[f"d{steps}"]


def mismatches(got: np.ndarray, want: np.ndarray) -> int:
    got = np.asarray(got, np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    return int((~same).sum())


@pytest.mark.parametrize("steps", [1, 2, 3])
@pytest.mark.parametrize("name", list(MMA_PRESETS))
def test_scaled_mm_reproduces_mmasim_bit_for_bit(name, steps):
    a, sa, b, sb, c, want = load(name, steps)
    got = scaled_mm(a, sa, b, sb, c, name).diagonal().numpy()
    assert mismatches(got, want) == 0


# A datapath one bit narrower or wider than MMA-Sim's, or rounding its result one bit shorter, must be caught by
# the vectors (the vectors are strong enough to tell the accumulator's width).
BROKEN = [(n, f, d) for n, u in MMA_PRESETS.items() for f, d in
          [("frac_bits", -1), ("frac_bits", 1)] + ([("out_man", -1)] if u.kind != 2 else [])]


@pytest.mark.parametrize("name,field,delta", BROKEN)
def test_vectors_catch_a_datapath_one_bit_off(name, field, delta):
    unit = MMA_PRESETS[name]
    broken = unit.replace(**{field: getattr(unit, field) + delta})
    bad = 0
    for steps in (1, 2, 3):
        a, sa, b, sb, c, want = load(name, steps)
        bad += mismatches(scaled_mm(a, sa, b, sb, c, broken).diagonal().numpy(), want)
    assert bad > 0


def test_presets_state_the_issue_parameters():
    assert MMA_PRESETS["b200_mxf4nvf4_ue4m3"].frac_bits == 35 and MMA_PRESETS["b200_mxf4nvf4_ue4m3"].block == 16
    assert MMA_PRESETS["b200_mxf4nvf4_ue8m0"].block == 32
    assert all(MMA_PRESETS[n].frac_bits == 25 for n in ("b200_f8f6f4_e4m3", "b200_f8f6f4_e5m2", "b200_mxf8f6f4_e4m3"))
    assert (MMA_PRESETS["a100_mma_bf16"].k, MMA_PRESETS["a100_mma_bf16"].terms) == (16, 8)
    assert mma_preset("mi300_mfma_fp8").element_format.max == 240.0


def test_zero_and_short_k():
    """K = 0 gives c; a last step shorter than the instruction takes the remaining products only."""
    c = torch.tensor([[1.5, -2.0]])
    got = scaled_mm(torch.zeros(1, 0), None, torch.zeros(0, 2), None, c, "h100_wgmma_e4m3")
    assert torch.equal(got, c)
    a = torch.tensor([[1.0, 2.0, 0.5]])
    b = torch.tensor([[1.0], [3.0], [-0.25]])
    assert scaled_mm(a, None, b, None, None, "b200_f8f6f4_e4m3").item() == 1.0 + 6.0 - 0.125


# ---- bad input ---------------------------------------------------------------------------------------------

def _ok_nvf4(M=2, K=32, N=3):
    return (torch.full((M, K), 0.5), torch.ones(M, K // 16), torch.full((K, N), 1.5), torch.ones(K // 16, N))


@pytest.mark.parametrize("field,value,match", [
    ("a_scale", 0.5009765625, r"a_scale\[0, 0\]=0\.5009765625 is not a ue4m3 scale.*allowed: UE4M3"),
    ("b_scale", -1.0, r"b_scale\[0, 0\]=-1\.0 is not a ue4m3 scale.*non-negative"),
    ("a", 0.75, r"a\[0, 0\]=0\.75 is not a fp4_e2m1 value.*quantise first"),
    ("b", 7.0, r"b\[0, 0\]=7\.0 is not a fp4_e2m1 value"),
])
def test_off_grid_values_are_named(field, value, match):
    a, sa, b, sb = _ok_nvf4()
    args = dict(a=a, a_scale=sa, b=b, b_scale=sb)
    args[field] = args[field].clone()
    args[field][0, 0] = value
    with pytest.raises(ValueError, match=match):
        scaled_mm(args["a"], args["a_scale"], args["b"], args["b_scale"], None, "b200_mxf4nvf4_ue4m3")


def test_e8m0_scale_must_be_a_power_of_two():
    a, b = torch.ones(1, 32), torch.ones(32, 1)
    with pytest.raises(ValueError, match=r"a_scale\[0, 0\]=3\.0 is not a e8m0 scale.*powers of two"):
        scaled_mm(a, torch.tensor([[3.0]]), b, torch.ones(1, 1), None, "b200_mxf8f6f4_e4m3")


def test_k_not_a_multiple_of_the_block_is_named():
    with pytest.raises(ValueError, match=r"K=24 is not a multiple of b200_mxf4nvf4_ue4m3's block=16"):
        scaled_mm(torch.ones(1, 24), torch.ones(1, 1), torch.ones(24, 1), torch.ones(1, 1), None,
                  "b200_mxf4nvf4_ue4m3")


def test_element_type_the_instruction_does_not_take():
    a = torch.ones(2, 32, dtype=torch.float8_e5m2)
    with pytest.raises(TypeError, match=r"a\.dtype=torch\.float8_e5m2: h100_wgmma_e4m3 takes e4m3fn elements"):
        scaled_mm(a, None, torch.ones(32, 2), None, None, "h100_wgmma_e4m3")
    with pytest.raises(TypeError, match=r"b\.dtype=torch\.int32"):
        scaled_mm(torch.ones(2, 32), None, torch.ones(32, 2, dtype=torch.int32), None, None, "h100_wgmma_e4m3")


def test_scales_for_a_unit_without_scales_and_unknown_unit():
    with pytest.raises(ValueError, match="a_scale given for h100_wgmma_e4m3, which takes no block scales"):
        scaled_mm(torch.ones(1, 32), torch.ones(1, 1), torch.ones(32, 1), None, None, "h100_wgmma_e4m3")
    with pytest.raises(ValueError, match="unit='b300' is not a matrix-instruction preset; allowed: b200_f8f6f4_e4m3"):
        scaled_mm(torch.ones(1, 32), None, torch.ones(32, 1), None, None, "b300")


def test_c_must_be_fp32_values():
    with pytest.raises(ValueError, match=r"c\[0, 0\]=0\.1 is not an fp32 value"):
        scaled_mm(torch.ones(1, 32), None, torch.ones(32, 1), None, torch.tensor([[0.1]], dtype=torch.float64),
                  "h100_wgmma_e4m3")


def test_inputs_are_not_modified():
    a, sa, b, sb, c, _ = load("b200_mxf4nvf4_ue8m0", 1)
    before = [t.clone() for t in (a, sa, b, sb, c)]
    scaled_mm(a, sa, b, sb, c, "b200_mxf4nvf4_ue8m0")
    assert all(torch.equal(x, y) for x, y in zip(before, (a, sa, b, sb, c)))


def test_unit_is_frozen():
    with pytest.raises(Exception):
        MMA_PRESETS["h100_wgmma_e4m3"].frac_bits = 12  # type: ignore[misc]
    assert isinstance(MMA_PRESETS["h100_wgmma_e4m3"], MMAUnit)


@pytest.mark.parametrize("gpu,fmt,name", [("H100", "E4M3", "h100_wgmma_e4m3"), ("A100", "bf16", "a100_mma_bf16")])
def test_model_presets_reproduce_measured_hardware_vectors(gpu, fmt, name):
    """Where MMA-Sim's model and Khattak and Mikaitis's measured GPU outputs (tests/data/tensor_cores) cover the
    same instruction, the MMA-Sim preset reproduces the hardware too (docs/matrix_units.md: B200 fp8 does not)."""
    from emunum.mad import hwdata

    p = hwdata.load_pair(os.path.join(os.path.dirname(__file__), "data", "tensor_cores"), gpu, fmt)
    c = np.zeros_like(p.c) if p.c_is_zero else p.c
    got = scaled_mm(torch.from_numpy(p.a), None, torch.from_numpy(p.b).T, None,
                    torch.diag(torch.from_numpy(c.astype(np.float32))), name).diagonal().numpy()
    assert mismatches(got, p.d32) == 0
