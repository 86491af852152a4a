"""Result folders are data (docs/guarantees.md): the analysis commands write only regular files they create
under their output directory, never through a link; they read only regular files (a FIFO, socket or device is
skipped with a note, never waited on); absurd values in any file they read end the command with exit status 2
and a message naming the file. Commands that could hang or crash run in a forked child process with a timeout."""
from __future__ import annotations

import json
import os
import pytest

import forked_cli
from emunum import cli

GOOD = {"format": "fp32", "status": "reached", "iterations_to_accuracy": 100, "iterations_run": 100, "seed": 0}
TIMEOUT = 120


def _sweep(tmp_path, n=2):
    sweep = tmp_path / "sweep"
    for i in range(n):
        run = sweep / str(i)
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "config.yaml").write_text(f"seed: {i}\nformat:\n  name: fp32\n")
        (run / "results.json").write_text(json.dumps({**GOOD, "seed": i}))
    return sweep


def _cli(*argv):
    """emunum in a forked child process (a hang or a crash fails the test instead of the session)."""
    p = forked_cli.run(argv, TIMEOUT)
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    return p


TTA = ["--seconds-per-iteration", "fp32=0.1"]


# ---- writing: never through a link, only under the output directory --------------------------------------------
@pytest.mark.parametrize("name", ["convergence.png", "loss.png"])
def test_report_never_writes_through_a_planted_symlink(tmp_path, name):
    sweep = _sweep(tmp_path)
    victim = tmp_path / "outside.txt"
    victim.write_text("precious")
    (sweep / name).symlink_to(victim)
    p = _cli("report", sweep)
    assert victim.read_text() == "precious"
    assert p.returncode == 2 and "symbolic link" in p.stderr and name in p.stderr, p.stderr


@pytest.mark.parametrize("command", ["report", "tta"])
@pytest.mark.parametrize("target", ["symlink", "dangling symlink", "fifo", "directory"])
def test_out_and_plot_refuse_links_and_special_files(tmp_path, command, target):
    sweep = _sweep(tmp_path)
    victim = tmp_path / "outside.txt"
    victim.write_text("precious")
    out = tmp_path / "table.txt"
    if target == "symlink":
        out.symlink_to(victim)
    elif target == "dangling symlink":
        out.symlink_to(tmp_path / "nowhere" / "x")
    elif target == "fifo":
        os.mkfifo(out)
    else:
        out.mkdir()
    extra = TTA if command == "tta" else ["--no-plot"]
    p = _cli(command, sweep, "--out", out, *extra)
    assert p.returncode == 2 and "refusing to write" in p.stderr and str(out) in p.stderr, p.stderr
    assert victim.read_text() == "precious" and not (tmp_path / "nowhere").exists()
    if command == "report":  # --plot too
        p = _cli("report", sweep, "--plot", out)
        assert p.returncode == 2 and "refusing to write" in p.stderr, p.stderr
        assert victim.read_text() == "precious"


def test_a_hard_link_keeps_its_other_name_and_the_new_file_is_the_commands_own(tmp_path):
    sweep = _sweep(tmp_path)
    victim = tmp_path / "outside.txt"
    victim.write_text("precious")
    out = sweep / "table.txt"
    os.link(victim, out)
    assert cli.main(["report", str(sweep), "--no-plot", "--out", str(out)]) == 0
    assert victim.read_text() == "precious" and "fp32" in out.read_text() and not out.is_symlink()
    assert [f.name for f in sweep.iterdir() if f.name.startswith(".")] == []  # no temporary file left


# ---- reading: regular files only ---------------------------------------------------------------------------------
def _plant(path, what, tmp_path):
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    if what == "fifo":
        os.mkfifo(path)
    elif what == "symlink to a fifo":
        fifo = tmp_path / f"fifo-{path.name}"
        os.mkfifo(fifo)
        path.symlink_to(fifo)
    elif what == "char device":
        path.symlink_to("/dev/zero")
    elif what == "dangling symlink":
        path.symlink_to(tmp_path / "missing")
    elif what == "symlink loop":
        path.symlink_to(path)
    elif what == "socket":
        import socket
        import tempfile
        # bound in a short directory, then moved: AF_UNIX paths stop at ~107 bytes, and tmp_path under pytest -n
        # (.../popen-gw0/<test name>/...) can be longer
        short = tempfile.mkdtemp(prefix="sock-")
        s = socket.socket(socket.AF_UNIX)
        s.bind(os.path.join(short, "s"))
        s.close()
        os.rename(os.path.join(short, "s"), path)
        os.rmdir(short)


SPECIAL = ["fifo", "symlink to a fifo", "char device", "dangling symlink", "symlink loop", "socket"]


@pytest.mark.parametrize("file,command", [("results.json", "report"), ("results.json", "tta"),
                                          (".hydra/config.yaml", "report"), (".hydra/config.yaml", "tta"),
                                          ("tensorboard/events.out.tfevents.1", "report")])
def test_special_files_in_a_run_are_skipped_with_a_note(tmp_path, file, command):
    """One sweep per file and command: run 0 is good, run k holds the k-th kind of special file (one process,
    so that a hang on any kind fails the test within the timeout)."""
    sweep = _sweep(tmp_path, 1 + len(SPECIAL))
    for k, what in enumerate(SPECIAL, start=1):
        _plant(sweep / str(k) / file, what, tmp_path)
    p = _cli(command, sweep, *(TTA if command == "tta" else []))
    assert p.returncode == 0, p.stderr
    for k, what in enumerate(SPECIAL, start=1):
        assert f"note: skipped {sweep / str(k) / file.split('/')[0]}" in p.stderr, (what, p.stderr)
    assert "fp32" in p.stdout


@pytest.mark.parametrize("what", ["fifo", "char device", "dangling symlink"])
def test_a_sweep_with_only_special_files_exits_2_naming_them(tmp_path, what):
    sweep = tmp_path / "sweep"
    _plant(sweep / "0" / "results.json", what, tmp_path)
    p = _cli("report", sweep)
    assert p.returncode == 2 and "results.json" in p.stderr, p.stderr


@pytest.mark.parametrize("what", ["fifo", "char device"])
@pytest.mark.parametrize("option,name", [("--sim", "sim.yaml"), ("--sim", "sim.csv"), ("--hardware", "hw.yaml")])
def test_tta_input_files_that_are_not_regular_exit_2_naming_them(tmp_path, what, option, name):
    sweep = _sweep(tmp_path)
    _plant(tmp_path / name, what, tmp_path)
    p = _cli("tta", sweep, option, tmp_path / name)
    assert p.returncode == 2 and name in p.stderr, p.stderr


# ---- absurd values -------------------------------------------------------------------------------------------
HUGE = "9" * 400
ABSURD_RESULTS = {
    "400-digit iterations": f'{{"format": "fp32", "status": "reached", "iterations_to_accuracy": {HUGE}}}',
    "5000-digit iterations": f'{{"format": "fp32", "status": "reached", "iterations_to_accuracy": {"9" * 5000}}}',
    "400-digit seed": f'{{"format": "fp32", "status": "reached", "iterations_to_accuracy": 5, "seed": {HUGE}}}',
    "2**64 iterations_run": '{"format": "fp32", "status": "not_reached", "iterations_run": 18446744073709551616}',
    "400-digit accuracy": f'{{"format": "fp32", "status": "reached", "iterations_to_accuracy": 5, '
                          f'"best_accuracy": {HUGE}}}',
    "1e400 seconds": '{"format": "fp32", "status": "reached", "iterations_to_accuracy": 5, '
                     '"seconds_per_iteration": 1e400}',
    "negative seconds": '{"format": "fp32", "status": "reached", "iterations_to_accuracy": 5, '
                        '"seconds_per_iteration": -1}',
    "infinite target": '{"format": "fp32", "status": "reached", "iterations_to_accuracy": 5, '
                       '"target_accuracy": -Infinity}',
    "100000-deep array": "[" * 100000 + "]" * 100000,
    "100000-deep in a value": '{"format": "fp32", "status": "reached", "iterations_to_accuracy": 5, "x": '
                              + "[" * 100000 + "]" * 100000 + "}",
    "a list for the status": '{"format": "fp32", "status": [1], "iterations_to_accuracy": 5}',
    "iteration_cost a list": '{"format": "fp32", "status": "reached", "iterations_to_accuracy": 5, '
                             '"iteration_cost": [1, 2, 3, 4]}',
    "iteration_cost missing a key": '{"format": "fp32", "status": "reached", "iterations_to_accuracy": 5, '
                                    '"iteration_cost": {"flops": 1, "param_elements": 1, "input_elements": 1}}',
    "negative flops": '{"format": "fp32", "status": "reached", "iterations_to_accuracy": 5, "iteration_cost": '
                      '{"flops": -1, "param_elements": 1, "activation_elements": 1, "input_elements": 1}}',
    "400-digit flops": f'{{"format": "fp32", "status": "reached", "iterations_to_accuracy": 5, "iteration_cost": '
                       f'{{"flops": {HUGE}, "param_elements": 1, "activation_elements": 1, "input_elements": 1}}}}',
    "null flops": '{"format": "fp32", "status": "reached", "iterations_to_accuracy": 5, "iteration_cost": '
                  '{"flops": null, "param_elements": 1, "activation_elements": 1, "input_elements": 1}}',
}
ABSURD_CONFIGS = {
    "400-digit max_iters": f"format:\n  name: fp32\nmax_iters: {HUGE}\n",
    "5000-digit seed": f"format:\n  name: fp32\nseed: {'9' * 5000}\n",
    "negative max_iters": "format:\n  name: fp32\nmax_iters: -3\n",
    "100000-deep list": "x: " + "[" * 100000 + "]" * 100000 + "\n",
    "100000-deep mapping": "x: " + "{a: " * 100000 + "1" + "}" * 100000 + "\n",
}


@pytest.mark.parametrize("command", ["report", "tta"])
@pytest.mark.parametrize("name", list(ABSURD_RESULTS))
def test_absurd_results_exit_2_naming_the_file(tmp_path, capsys, command, name):
    sweep = _sweep(tmp_path)
    (sweep / "1" / "results.json").write_text(ABSURD_RESULTS[name])
    code = cli.main([command, str(sweep), *(TTA if command == "tta" else ["--no-plot"])])
    err = capsys.readouterr().err
    assert code == 2 and str(sweep / "1" / "results.json") in err and "Traceback" not in err, (name, err)
    assert len(err) < 2000


@pytest.mark.parametrize("command", ["report", "tta"])
@pytest.mark.parametrize("name", list(ABSURD_CONFIGS))
def test_absurd_configs_exit_2_naming_the_file(tmp_path, capsys, command, name):
    sweep = _sweep(tmp_path)
    (sweep / "1" / ".hydra" / "config.yaml").write_text(ABSURD_CONFIGS[name])
    code = cli.main([command, str(sweep), *(TTA if command == "tta" else ["--no-plot"])])
    err = capsys.readouterr().err
    assert code == 2 and str(sweep / "1" / ".hydra" / "config.yaml") in err and "Traceback" not in err, (name, err)
    assert len(err) < 2000


@pytest.mark.parametrize("content", [f"fp32: {HUGE}\n", "fp32: 1e400\n", "fp32: " + "[" * 100000 + "]" * 100000,
                                     f"format,seconds_per_iteration\nfp32,{HUGE}\n"])
def test_absurd_sim_files_exit_2_naming_the_file(tmp_path, capsys, content):
    sweep = _sweep(tmp_path)
    sim = tmp_path / ("sim.csv" if content.startswith("format,") else "sim.yaml")
    sim.write_text(content)
    assert cli.main(["tta", str(sweep), "--sim", str(sim)]) == 2
    err = capsys.readouterr().err
    assert str(sim) in err and "Traceback" not in err and len(err) < 2000, err


@pytest.mark.parametrize("content", [f"name: x\npeak_flops: {{16: {HUGE}}}\nmemory_bandwidth: 1e12\n",
                                     f"name: x\npeak_flops: {{16: 1e12}}\nmemory_bandwidth: {HUGE}\n",
                                     "name: " + "[" * 100000 + "]" * 100000 + "\n"])
def test_absurd_hardware_files_exit_2_naming_the_file(tmp_path, capsys, content):
    sweep = _sweep(tmp_path)
    hw = tmp_path / "hw.yaml"
    hw.write_text(content)
    assert cli.main(["tta", str(sweep), "--hardware", str(hw)]) == 2
    err = capsys.readouterr().err
    assert str(hw) in err and "Traceback" not in err and len(err) < 2000, err


def test_one_run_without_its_config_does_not_label_every_run_by_every_key(tmp_path):
    from emunum.analysis import report
    sweep = _sweep(tmp_path, 3)
    for i in range(3):
        (sweep / str(i) / ".hydra" / "config.yaml").write_text(
            f"seed: {i}\nlr: 0.01\nmodel:\n  name: mlp\n  width: 64\nformat:\n  name: fp32\n")
    (sweep / "2" / ".hydra" / "config.yaml").unlink()
    labels = [r.format for r in report.load_sweep(sweep)]
    assert labels == ["fp32", "fp32", "fp32 [no .hydra/config.yaml]"]
