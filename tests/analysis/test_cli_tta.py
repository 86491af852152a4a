"""The `emunum report` and `emunum tta` commands (in process, on hand-made sweeps): outputs, files written,
exit codes and the error messages for bad input."""
from __future__ import annotations

import csv
import io

import pytest

from emunum import cli
from test_report import make_run  # noqa: E402  (tests/ is on sys.path under pytest)


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "multirun" / "2024-01-01" / "00-00-00"
    make_run(root, "0", "fp32", "reached", 400, 0, [0.5, 0.8, 0.85, 0.91])
    make_run(root, "1", "fp32", "reached", 400, 1, [0.5, 0.7, 0.88, 0.92])
    make_run(root, "2", "fp8", "reached", 600, 0, [0.4, 0.6, 0.7, 0.8, 0.85, 0.93])
    make_run(root, "3", "fp8", "not_reached", None, 1, [0.4, 0.6, 0.7, 0.8, 0.85, 0.86])
    return root


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_report_prints_the_table_and_writes_the_plot(sweep, capsys):
    code, out, err = run(capsys, "report", sweep)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["format", "runs", "reached"]
    assert lines[2].split()[:6] == ["fp32", "2", "2/2", "0", "0", "400.0"]
    # fp8's unreached run (seed 1, 600 iterations run) is a censored lower bound: ">=", open above
    assert lines[3].split()[:8] == ["fp8", "2", "1/2", "0", "0", ">=", "600.0", "[600,"] and ">= 1.500" in lines[3]
    assert "inf]" in lines[3] and "slower" in lines[3]  # both paired ratios are >= 1.5
    assert (sweep / "convergence.png").read_bytes()[:4] == b"\x89PNG"
    assert f"wrote {sweep / 'convergence.png'}" in err


def test_report_md_and_csv_to_files(sweep, tmp_path, capsys):
    code, out, err = run(capsys, "report", sweep, "--format", "md", "--out", tmp_path / "r" / "t.md",
                         "--plot", tmp_path / "p.png")
    assert code == 0 and out == ""
    assert (tmp_path / "r" / "t.md").read_text().startswith("| format | runs | reached |")
    assert (tmp_path / "p.png").exists() and not (sweep / "convergence.png").exists()
    code, out, _ = run(capsys, "report", sweep, "--format", "csv", "--no-plot")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["format"], float(r["iters_mean"]), float(r["ratio_to_fp32"])) for r in rows] == [
        ("fp32", 400.0, 1.0), ("fp8", 600.0, 1.5)]
    assert not (sweep / "convergence.png").exists()


def test_report_with_missing_baseline_explains_on_the_table(sweep, capsys):
    code, out, err = run(capsys, "report", sweep, "--baseline", "bf16", "--no-plot")
    assert code == 0
    assert "note: baseline 'bf16' is not in the sweep (formats: fp32, fp8): no ratios" in out
    code, out, err = run(capsys, "report", sweep, "--baseline", "bf16", "--no-plot", "--format", "csv")
    assert "note: baseline 'bf16' is not in the sweep" in err and "note" not in out


@pytest.mark.parametrize("argv, message", [
    (["report", "{missing}"], "emunum report: error: sweep directory '{missing}' does not exist"),
    (["report", "{sweep}", "--format", "html"], "emunum report: error: --format='html' is not an output format"),
    (["tta", "{sweep}", "--format", "xls", "--seconds-per-iteration", "fp32=1"], "--format='xls'"),
    (["tta", "{sweep}", "--seconds-per-iteration", "fp32=0.031", "fp8"],
     "emunum tta: error: --seconds-per-iteration: 'fp8' is not NAME=SECONDS"),
    (["tta", "{sweep}", "--seconds-per-iteration", "fp32=0.031", "fp4=0.01"],
     "emunum tta: error: --seconds-per-iteration: format 'fp4' is not in the sweep; the sweep's formats: fp32, fp8"),
    (["tta", "--seconds-per-iteration", "fp32=0.031", "{sweep}"], "no sweep directory given; put it before"),
    (["tta", "{sweep}", "--hardware", "tpu_like"], "hardware='tpu_like' is not a file nor a known description"),
    (["tta", "{sweep}", "--sim", "{sweep}/nope.yaml"], "no such file"),
])
def test_bad_input_exits_2_with_a_message_naming_the_value(sweep, tmp_path, capsys, argv, message):
    fill = {"sweep": str(sweep), "missing": str(tmp_path / "missing")}
    code, out, err = run(capsys, *[a.format(**fill) for a in argv])
    assert code == 2 and out == ""
    assert message.format(**fill) in err


def test_tta_requires_exactly_one_time_source(sweep, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["tta", str(sweep)])
    assert e.value.code == 2
    assert "one of the arguments --seconds-per-iteration --sim --hardware is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["tta", str(sweep), "--sim", "a.yaml", "--hardware", "h100_like"])
    assert "not allowed with argument" in capsys.readouterr().err


def _csv(out):
    return {r["format"]: r for r in csv.DictReader(io.StringIO(out))}


def test_tta_from_pairs_shows_both_factors(sweep, capsys):
    code, out, err = run(capsys, "tta", sweep, "--seconds-per-iteration", "fp32=0.032", "fp8=0.008")
    assert code == 0
    fp8 = [ln for ln in out.splitlines() if ln.startswith("fp8")][0].split()
    # format reached iters s/iter TTA gain loss speed-up
    # fp8's unreached run makes iterations and TTA lower bounds and the speed-up an upper bound
    assert fp8 == ["fp8", "1/2", ">=", "600.0", "0.008", ">=", "4.8", "[4.8,", "inf]", "4.000x", ">=", "1.500x",
                   "[1.5,", "inf]", "<=", "2.667x", "[0,", "2.67]"]
    assert "speed-up = TTA(fp32) / TTA = throughput gain / stat. eff. loss" in out
    code, out, _ = run(capsys, "tta", sweep, "--seconds-per-iteration", "fp32=0.032", "fp8=0.008", "--format", "csv")
    rows = _csv(out)
    assert float(rows["fp8"]["speedup"]) == (0.032 / 0.008) / (600 / 400)  # throughput gain / stat. eff. loss
    assert (rows["fp8"]["tta_ci_low"], rows["fp8"]["tta_ci_high"], rows["fp8"]["verdict"]) == (
        repr(600 * 0.008), "inf", "slower")
    assert float(rows["fp32"]["tta_seconds"]) == 400 * 0.032


@pytest.mark.parametrize("name, text", [
    ("sim.yaml", "fp32: 0.032\nfp8: 0.008\n"),
    ("sim.csv", "format,seconds_per_iteration\nfp32,0.032\nfp8,0.008\n"),
])
def test_tta_from_a_sim_file_equals_the_pairs(sweep, tmp_path, capsys, name, text):
    (tmp_path / name).write_text(text)
    _, want, _ = run(capsys, "tta", sweep, "--seconds-per-iteration", "fp32=0.032", "fp8=0.008", "--format", "csv")
    code, got, _ = run(capsys, "tta", sweep, "--sim", tmp_path / name, "--format", "csv")
    assert code == 0 and got == want


def test_tta_sim_with_a_format_outside_the_sweep_names_it(sweep, tmp_path, capsys):
    (tmp_path / "sim.yaml").write_text("fp32: 0.032\nfp8: 0.008\ne4m3: 0.007\n")
    code, out, err = run(capsys, "tta", sweep, "--sim", tmp_path / "sim.yaml")
    assert code == 2
    assert f"--sim {tmp_path / 'sim.yaml'}: format 'e4m3' is not in the sweep; the sweep's formats: fp32, fp8" in err


def test_tta_format_without_a_time_is_na_with_a_note(sweep, capsys):
    code, out, _ = run(capsys, "tta", sweep, "--seconds-per-iteration", "fp32=0.032")
    assert code == 0
    assert [ln for ln in out.splitlines() if ln.startswith("fp8")][0].split()[4:6] == ["n/a", "n/a"]
    assert "note: no seconds per iteration for 'fp8': its TTA is n/a" in out


def test_tta_out_file(sweep, tmp_path, capsys):
    code, out, err = run(capsys, "tta", sweep, "--seconds-per-iteration", "fp32=1", "fp8=1", "--format", "md",
                         "--out", tmp_path / "tta.md")
    assert code == 0 and out == "" and f"wrote {tmp_path / 'tta.md'}" in err
    assert "| fp8 | 1/2 | >= 600.0 | 1 | >= 600 [600, inf] | 1.000x | >= 1.500x [1.5, inf] | <= 0.667x [0, 0.667] |" in (tmp_path / "tta.md").read_text()


def test_formats_command_still_works(capsys):
    code, out, _ = run(capsys, "formats")
    assert code == 0 and out.splitlines()[0].startswith("name") and "e4m3fn" in out
