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

SPECS = {"e5m2": abi.FloatArgs, "int8": abi.FixedArgs, "posit8": abi.PositArgs, "nf4": abi.TableArgs,
         "e4m3fn": abi.FloatArgs}


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
    records = [abi.FloatArgs, abi.FixedArgs, abi.PositArgs, abi.TableArgs, abi.LogArgs, abi.CustomArgs, abi.ScaleArgs]
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


def test_the_mad_parameter_vector_is_tagged_and_sized_as_the_kernel_reads_it():
    assert mad_unit.NPARAM == gemm_scalar.NPARAM
    p = mad_unit.format_params(emunum.get_format("e5m2"), RoundMode.UP)
    assert p[gemm_scalar.P_KIND] == abi.Kind.FLOAT and p[gemm_scalar.P_MODE] == RoundMode.UP
    q = mad_unit.format_params(emunum.get_format("int8"), RoundMode.NEAREST)
    assert q[gemm_scalar.P_KIND] == abi.Kind.FIXED and q[gemm_scalar.P_FRAC] == 0
