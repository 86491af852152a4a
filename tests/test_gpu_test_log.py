"""benchmarks/gpu_test_log.py and gpu_check's reading of it: a test run stopped before pytest writes its junit file
still names its failures, and a finished one (pytest-xdist included) logs each test once, as junit counts it."""
from __future__ import annotations

import os
import subprocess
import sys

from benchmark_script import ROOT, load

gpu_check = load("gpu_check")

CASES = '''
import os, signal
import pytest

def test_a_pass():
    pass

def test_b_fail():
    assert 1 == 2, "bits differ"

@pytest.fixture
def broken():
    raise RuntimeError("no device")

def test_c_error(broken):
    pass

@pytest.mark.skip(reason="not here")
def test_d_skip():
    pass
'''
STOP = '''
def test_e_stop():  # the process ends here, as at a time limit: no junit file
    os.kill(os.getpid(), signal.SIGKILL)
'''


def _pytest(tmp_path, body: str, *args):
    (tmp_path / "test_cases.py").write_text(body)
    log, xml = tmp_path / "tests.log", tmp_path / "junit.xml"
    paths = [os.path.join(ROOT, "benchmarks"), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "EMUNUM_TEST_LOG": str(log), "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "gpu_test_log",
                    f"--junitxml={xml}", "--rootdir", str(tmp_path), "test_cases.py", *args],
                   cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return str(log), str(xml)


def test_a_run_stopped_before_its_junit_file_still_names_its_failures(tmp_path):
    log, xml = _pytest(tmp_path, CASES + STOP)
    assert not os.path.exists(xml)
    got = gpu_check.log_counts(log)
    assert (got["tests"], got["passed"], got["failures"], got["errors"], got["skipped"]) == (4, 1, 1, 1, 1)
    assert [f["test"] for f in got["failed"]] == ["test_cases.py::test_b_fail", "test_cases.py::test_c_error"]
    assert "bits differ" in got["failed"][0]["message"] and "no device" in got["failed"][1]["message"]
    assert got["log"].startswith("partial")


def test_each_test_is_logged_once_under_xdist_as_junit_counts_it(tmp_path):
    log, xml = _pytest(tmp_path, CASES, "-n", "2")
    junit, logged = gpu_check._junit_counts(xml), gpu_check.log_counts(log)
    keys = ("tests", "passed", "failures", "errors", "skipped")
    assert [logged[k] for k in keys] == [junit[k] for k in keys] == [4, 1, 1, 1, 1]
    assert sorted(f["test"] for f in logged["failed"]) == sorted(
        f["test"].replace("test_cases::", "test_cases.py::") for f in junit["failed"])


def test_without_the_variable_nothing_is_written(tmp_path):
    (tmp_path / "test_cases.py").write_text(CASES)
    env = {k: v for k, v in os.environ.items() if k != "EMUNUM_TEST_LOG"}
    env["PYTHONPATH"] = os.path.join(ROOT, "benchmarks")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "gpu_test_log",
                        "--rootdir", str(tmp_path), "test_cases.py"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert "1 failed, 1 passed, 1 skipped, 1 error" in r.stdout
    assert set(os.listdir(tmp_path)) <= {"__pycache__", "test_cases.py"}  # no log anywhere here
