"""The kernel ABI (``kernels/abi.py``) is the one place that names what crosses from specs to kernels: its codes
equal the specs' enums and the kernels' constants, every spec builds its record, and the tags are unique."""
import ast
from pathlib import Path

import pytest

import emunum
from emunum.formats import Overflow, RoundMode
from emunum.formats.block import E8M0
from emunum.kernels import abi
from emunum.kernels.scalar import common
from emunum.mad import unit as mad_unit
from emunum.kernels import gemm_scalar
from emunum.mad.multiplier import Multiplier, MultiplierKind

SPECS = {"e5m2": abi.FloatArgs, "int8": abi.FixedArgs, "posit8": abi.PositArgs, "nf4": abi.TableArgs,
         "e4m3fn": abi.FloatArgs, "hifloat8": abi.HiF8Args}


def test_the_abi_module_imports_nothing_from_emunum():
    tree = ast.parse(Path(abi.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level]
    assert not any(n.startswith(("emunum", "kernels")) for n in names)
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))


def test_mode_codes_are_the_round_modes():
    assert {m.name: m.value for m in abi.Mode} == {m.name: m.value for m in RoundMode}


def test_overflow_codes_are_the_specs_and_the_scalar_cores():
    assert {m.name: m.value for m in abi.Overflow} == {m.name: m.value for m in Overflow}
    assert (common.OVF_INF, common.OVF_NAN, common.OVF_SAT) == (abi.Overflow.INF, abi.Overflow.NAN,
                                                                 abi.Overflow.SATURATE)


def test_kinds_are_unique_and_every_record_carries_its_own():
    kinds = [k.value for k in abi.Kind]
    assert len(kinds) == len(set(kinds))
    records = [abi.FloatArgs, abi.FixedArgs, abi.PositArgs, abi.TableArgs, abi.LogArgs, abi.CustomArgs, abi.ScaleArgs,
               abi.HiF8Args]
    assert len({r.KIND for r in records}) == len(records)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_each_spec_builds_its_record_by_field_name(name):
    rec = emunum.get_format(name).to_kernel_args()
    assert type(rec) is SPECS[name]
    assert rec._fields == SPECS[name]._fields


def test_log_custom_and_scale_records():
    assert type(emunum.LogFormat(4, 2).to_kernel_args()) is abi.LogArgs
    assert E8M0.to_kernel_args() == abi.ScaleArgs(emin=-127, emax=127)


def test_the_custom_op_encoding_uses_the_same_tags():
    from emunum.ops import format_to_args
    assert format_to_args("e5m2")[0] == abi.Kind.FLOAT and format_to_args("int8")[0] == abi.Kind.FIXED
    assert format_to_args("posit8")[0] == abi.Kind.POSIT and format_to_args("nf4")[0] == abi.Kind.INTERNED


def _module_ints(path: str) -> dict:
    """Module-level ``NAME = <int>`` assignments of a kernels/ file, read without importing it (no numba.cuda)."""
    tree = ast.parse((Path(abi.__file__).parent / path).read_text())
    out = {}
    for n in tree.body:
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, int):
            out.update({t.id: n.value.value for t in n.targets if isinstance(t, ast.Name)})
    return out


@pytest.mark.parametrize("path", ["gemm_scalar.py", "multiterm_scalar.py", "multiplier_scalar.py", "gemm_cuda.py",
                                  "gemm_approx_cuda.py", "gemm_multiterm_cuda.py"])
def test_no_kernel_module_redefines_a_layout_constant_of_the_abi(path):
    shared = {"NPARAM", "NTPARAM", "NPRM", "NO_FLOOR", "MAX_LANES", "MAX_TERMS"} | {
        n for n in dir(abi) if n[:2] in ("P_", "T_", "M_") and n[2:].isupper()}
    assert not shared & set(_module_ints(path))


def test_the_multiterm_and_multiplier_vectors_are_filled_by_slot_name():
    u = emunum.MADUnit.preset("h100_fp8_e4m3")
    prm = u.multiterm_params()[0]
    assert len(prm) == abi.NTPARAM and prm[abi.T_TERMS] == u.terms
    prm, _ = Multiplier.drum(4, "e5m2").kernel_args()
    assert len(prm) == abi.NPRM and prm[abi.M_KIND] == MultiplierKind.DRUM and prm[abi.M_BITS] == 4
    assert prm[abi.M_MAN] == 2 and prm[abi.M_EMIN] == -14 and prm[abi.M_WIDTH] == 1


def test_the_mad_parameter_vector_is_tagged_and_sized_as_the_kernel_reads_it():
    assert mad_unit.NPARAM == gemm_scalar.NPARAM
    p = mad_unit.format_params(emunum.get_format("e5m2"), RoundMode.UP)
    assert p[gemm_scalar.P_KIND] == abi.Kind.FLOAT and p[gemm_scalar.P_MODE] == RoundMode.UP
    q = mad_unit.format_params(emunum.get_format("int8"), RoundMode.NEAREST)
    assert q[gemm_scalar.P_KIND] == abi.Kind.FIXED and q[gemm_scalar.P_FRAC] == 0



SPEC_ONLY = {"to_code_jit", "from_code_jit", "add_jit", "mul_jit", "check_mode", "derived_args", "nbits"}


@pytest.mark.parametrize("module", ["custom_cpu.py", "custom_cuda.py"])
def test_custom_kernels_read_the_record_not_the_spec(module):
    """The custom kernels take ``abi.CustomArgs``: no attribute that only the CustomFormat spec has."""
    tree = ast.parse((Path(abi.__file__).parent / module).read_text())
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not used & SPEC_ONLY, sorted(used & SPEC_ONLY)


def test_a_custom_record_filled_by_hand_rounds_like_the_specs():
    import numpy as np
    from numba import njit

    from emunum.formats import CustomFormat
    from emunum.kernels import custom_cpu

    @njit
    def to_code(x):  # the integers -8..7, nearest, saturating
        return np.int64(min(max(round(x), -8), 7) + 8)

    @njit
    def from_code(c):
        return np.float64(c - 8)

    spec = CustomFormat(to_code, from_code, 4, name="int4_by_hand")
    args = abi.CustomArgs(to_code, from_code, 16, "int4_by_hand", derived=spec.derived_args)
    x = np.linspace(-9.0, 9.0, 145)
    got, want = np.empty_like(x), np.empty_like(x)
    for mode in (0, 2, 3):  # nearest, toward zero, up
        custom_cpu.quantize_custom(x, got, args, mode, 0, 32)
        custom_cpu.quantize_custom(x, want, spec.to_kernel_args(), mode, 0, 32)
        assert np.array_equal(got, want)
    assert np.array_equal(got, np.minimum(np.maximum(np.ceil(x), -8), 7))  # up, exactly
