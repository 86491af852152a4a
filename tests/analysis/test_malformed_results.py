"""Malformed result folders: an error that names the file, exit status 2, no traceback."""
from __future__ import annotations

import json

import pytest

from emunum import cli

GOOD = {"format": "fp32", "status": "reached", "iterations_to_accuracy": 100, "iterations_run": 100, "seed": 0}


def _sweep(tmp_path, results: bytes | None = None, config: bytes | None = None):
    run = tmp_path / "sweep" / "0"
    (run / ".hydra").mkdir(parents=True)
    (run / "results.json").write_bytes(results if results is not None else json.dumps(GOOD).encode())
    if config is not None:
        (run / ".hydra" / "config.yaml").write_bytes(config)
    return run


@pytest.mark.parametrize("name,results,config", [
    ("infinite iterations", b'{"format": "fp32", "status": "reached", "iterations_to_accuracy": Infinity}', None),
    ("NaN iterations", b'{"format": "fp32", "status": "reached", "iterations_to_accuracy": NaN}', None),
    ("negative iterations", b'{"format": "fp32", "status": "reached", "iterations_to_accuracy": -5}', None),
    ("a list for the object", b'[1, 2, 3]', None),
    ("binary results", bytes(range(256)), None),
    ("a python tag in config", None, b"seed: !!python/object/apply:os.system ['echo hacked']\n"),
    ("a list for the config", None, b"- 1\n- 2\n"),
    ("binary config", None, bytes(range(256))),
])
@pytest.mark.parametrize("command", ["report", "tta"])
def test_malformed_files_exit_2_naming_the_file(tmp_path, capsys, name, results, config, command):
    run = _sweep(tmp_path, results, config)
    argv = [command, str(run.parent)] + (["--seconds-per-iteration", "fp32=0.1"] if command == "tta" else
                                         ["--no-plot"])
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, (name, err)
    bad = "results.json" if results is not None else "config.yaml"
    assert bad in err and "Traceback" not in err


@pytest.mark.parametrize("how", ["text", "md"])
def test_format_names_with_pipes_or_newlines_keep_one_line_per_row(tmp_path, how):
    from emunum.analysis import report

    rows = [["a|b\nc", "1"], ["plain", "2"]]
    text = report.render_table(["format", "n"], rows, how)
    body = [ln for ln in text.splitlines() if ln.strip()]
    assert len(body) == 4  # header, rule, two rows
    if how == "md":
        assert all(ln.count("|") - ln.count("\\|") == 3 for ln in body)


def test_runs_of_one_format_with_different_configs_are_not_pooled(tmp_path):
    from emunum.analysis import report

    sweep = tmp_path / "sweep"
    for i, (model, lr, seed) in enumerate([("mlp", 0.01, 0), ("mlp", 0.01, 1), ("cnn1d", 0.01, 0),
                                           ("cnn1d", 0.001, 0)]):
        run = sweep / str(i)
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "config.yaml").write_text(
            f"seed: {seed}\nlr: {lr}\nthreads: {i}\nmodel:\n  name: {model}\nformat:\n  name: fp32\n")
        (run / "results.json").write_text(json.dumps({**GOOD, "seed": seed}))
    labels = [r.format for r in report.load_sweep(sweep)]
    assert labels == ["fp32 [lr=0.01, model.name=mlp]"] * 2 + ["fp32 [lr=0.01, model.name=cnn1d]",
                                                                "fp32 [lr=0.001, model.name=cnn1d]"]
    text = report.render(report.summarize(report.load_sweep(sweep), baseline="fp32"))
    assert "fp32 [lr=0.01, model.name=mlp]" in text  # seeds and threads alone never split a format
