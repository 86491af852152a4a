"""`emunum formats`: every preset with its limits, from the module, the console script and main()."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from emunum.cli import main
from emunum.formats import PRESETS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _check_table(text: str) -> None:
    lines = text.split("\n\n")[0].splitlines()  # the scalar table; the block-format table follows
    assert lines[0].split()[:2] == ["name", "kind"]
    rows = {line.split()[0]: line for line in lines[2:] if line.strip()}
    assert set(rows) == set(PRESETS)
    for name, fmt in PRESETS.items():
        fields = rows[name].split()
        assert f"{fmt.max:.6g}" in fields, (name, rows[name])
        assert f"{fmt.eps:.4g}" in fields, (name, rows[name])


def test_formats_via_python_module():
    r = subprocess.run([sys.executable, "-m", "emunum.cli", "formats"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    _check_table(r.stdout)


def test_formats_via_console_script():
    exe = shutil.which("emunum", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("the emunum console script is not installed in this environment")
    r = subprocess.run([exe, "formats"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    _check_table(r.stdout)


def test_formats_via_main(capsys):
    assert main(["formats"]) == 0
    _check_table(capsys.readouterr().out)


def test_known_rows():
    from emunum.cli import formats_table

    rows = {line.split()[0]: line.split() for line in formats_table().splitlines()[2:]}
    assert rows["e4m3fn"][:6] == ["e4m3fn", "float", "4", "3", "7", "fn"] and "448" in rows["e4m3fn"]
    assert rows["fp8_152"][6] == "57344" and rows["int8"][:2] == ["int8", "fixed"] and "127" in rows["int8"]
    assert rows["uint8"][1] == "ufixed" and "255" in rows["uint8"]


@pytest.mark.parametrize("argv", [[], ["nope"]])
def test_bad_command_exits_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "usage: emunum" in capsys.readouterr().err


def test_formats_lists_the_posit_presets_in_their_own_table(capsys):
    from emunum.formats import POSIT_PRESETS

    assert main(["formats"]) == 0
    table = [t for t in capsys.readouterr().out.split("\n\n") if t.startswith("posit")]
    assert len(table) == 1
    rows = {line.split()[0]: line.split() for line in table[0].splitlines()[2:-1]}
    assert set(rows) == set(POSIT_PRESETS)
    for name, fmt in POSIT_PRESETS.items():
        assert rows[name][1:] == [str(fmt.nbits), str(fmt.es), f"{fmt.max:.6g}", f"{fmt.min_positive:.6g}"]


def test_units_lists_every_mad_preset_and_every_matrix_instruction(capsys):
    from emunum.mad import MADUnit
    from emunum.mad.mma import MMA_PRESETS
    from emunum.mad.presets import describe

    assert main(["units"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    names = {line for line in lines if line and not line.startswith((" ", "aliases", "-", "matrix", "use"))}
    mad_names = {name for name, _ in describe()}
    assert mad_names <= names
    for name in mad_names:
        i = lines.index(name)
        assert lines[i + 1].strip() == str(MADUnit.preset(name))
    rows = {line.split()[0]: line for line in lines if line.split() and line.split()[0] in MMA_PRESETS}
    assert set(rows) == set(MMA_PRESETS)
    for name, u in MMA_PRESETS.items():
        fields = rows[name].split()
        assert fields[1:7] == [u.kind.name.lower(), u.element, str(u.k), str(u.terms), str(u.frac_bits),
                               str(u.out_man)], rows[name]
        assert fields[7:] == ([u.scale, f"x{u.block}"] if u.scale else ["-"]), rows[name]
        assert lines[lines.index(rows[name]) + 1] == f"    source: {u.source}"


def test_block_table_names_each_presets_outer_scale_and_four_over_six(capsys):
    from emunum.formats import BLOCK_PRESETS, MXPLUS_PRESETS

    presets = {**BLOCK_PRESETS, **MXPLUS_PRESETS}
    assert main(["formats"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()
            and line.split()[0] in presets}
    assert set(rows) == set(presets)
    for name, f in presets.items():
        fos = "-" if f.four_over_six is None else f"{f.four_over_six.metric.value},{f.four_over_six.bound}"
        assert rows[name][5] == f.outer_scale.value and rows[name][-1] == fos, (name, rows[name])
