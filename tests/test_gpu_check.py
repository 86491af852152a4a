"""benchmarks/gpu_check.sh without a GPU (its smoke mode), its pure helpers, and the override of the unmeasured
CUDA constant it measures."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest

from benchmark_script import ROOT, load

gpu_check = load("gpu_check")
qmod = importlib.import_module("emunum.quantize")


@pytest.mark.parametrize("kernel, torch_path, want", [
    ([5, 5, 5, 5], [1, 2, 5, 9], 64),  # a tie counts for the torch path; it loses from 256 on
    ([5, 5, 5, 5], [6, 1, 1, 1], 0),  # lost at the smallest size: the kernel everywhere
    ([5, 5, 5, 5], [1, 1, 1, 1], 256),  # never lost: the largest size measured
    ([5, 5, 5, 5], [1, 9, 1, 1], 1),  # the first loss ends the range, even if it wins again above
])
def test_the_crossover_is_the_largest_size_below_which_the_torch_path_never_lost(kernel, torch_path, want):
    assert gpu_check.crossover_max_numel([1, 4, 64, 256], kernel, torch_path) == want


def test_junit_counts_name_each_failure_and_error(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite tests="5" failures="1" errors="1" skipped="1">'
        '<testcase classname="tests.a" name="t1"/>'
        '<testcase classname="tests.a" name="t2"><failure message="bits differ"/></testcase>'
        '<testcase classname="tests.b" name="t3"><error message="boom"/></testcase>'
        '<testcase classname="tests.b" name="t4"><skipped/></testcase>'
        '<testcase classname="tests.b" name="t5"/></testsuite></testsuites>')
    got = gpu_check._junit_counts(str(xml))
    assert (got["tests"], got["passed"], got["failures"], got["errors"], got["skipped"]) == (5, 2, 1, 1, 1)
    assert got["failed"] == [{"test": "tests.a::t2", "message": "bits differ"},
                             {"test": "tests.b::t3", "message": "boom"}]
    assert "missing" in gpu_check._junit_counts(str(tmp_path / "none.xml"))["junit"]


def test_smoke_mode_runs_on_the_cpu_says_gpu_checks_were_skipped_and_writes_one_file(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_check.sh"), "--smoke", "--sections",
                        "quantize,crossover", str(out)], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "GPU checks skipped" in r.stdout
    assert [p.name for p in out.iterdir()] == ["gpu_check.json"]
    rep = json.loads((out / "gpu_check.json").read_text())
    assert rep["mode"] == "smoke" and rep["gpu"] is None
    q, c = rep["sections"]["quantize"], rep["sections"]["crossover"]
    assert q["status"] == "ok" and c["status"] == "skipped"
    assert [(row["fmt"], row["mode"]) for row in q["result"]["rows"]] == [
        ("e4m3fn", "nearest"), ("e5m2", "stochastic"), ("int8", "nearest")]
    assert all(row["share_of_copy"] > 0 for row in q["result"]["rows"])


def test_an_unknown_section_is_refused_by_name():
    with pytest.raises(SystemExit):
        gpu_check.main(["--smoke", "--sections", "quantize,warp"])


@pytest.mark.parametrize("raw, want", [("", 256), ("0", 0), (" 4096 ", 4096)])
def test_the_torch_path_threshold_is_overridable_from_the_environment(monkeypatch, raw, want):
    monkeypatch.setenv("EMUNUM_CUDA_TORCH_PATH_MAX_NUMEL", raw)
    assert qmod._env_numel("EMUNUM_CUDA_TORCH_PATH_MAX_NUMEL", 256) == want


@pytest.mark.parametrize("raw", ["-1", "lots", "1e3"])
def test_a_bad_torch_path_threshold_names_the_variable_and_what_is_allowed(monkeypatch, raw):
    monkeypatch.setenv("EMUNUM_CUDA_TORCH_PATH_MAX_NUMEL", raw)
    with pytest.raises(ValueError, match=r"EMUNUM_CUDA_TORCH_PATH_MAX_NUMEL=.*integer >= 0"):
        qmod._env_numel("EMUNUM_CUDA_TORCH_PATH_MAX_NUMEL", 256)
