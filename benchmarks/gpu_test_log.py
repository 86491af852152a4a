"""A pytest plugin that writes each test's outcome to a file as it is known, for ``gpu_check.py``'s ``tests``
section: a run stopped by its time limit has written no junit file, and its failures were unknown (the first GPU
run, 2026-11-26: nine failed, names lost).

    EMUNUM_TEST_LOG=path python -m pytest -p gpu_test_log ...      # with benchmarks/ on PYTHONPATH

One line per test, tab-separated: outcome (passed, failed, skipped, error), node id, and for a failure or error
the first line of its exception's message (else the last line of its report; at most 300 characters). A failing
setup is the test's ``error`` line; a failing teardown adds an ``error`` line after the test's own. Under
pytest-xdist only the controller writes (the workers' reports reach it); each line is flushed when written.
Without EMUNUM_TEST_LOG the plugin does nothing.
"""
from __future__ import annotations

import os

ENV = "EMUNUM_TEST_LOG"
_out = []


def pytest_configure(config):
    path = os.environ.get(ENV)
    if path and not hasattr(config, "workerinput"):
        _out.append(open(path, "a", encoding="utf-8"))


def pytest_unconfigure(config):
    while _out:
        _out.pop().close()


def outcome_of(report):
    """The log's outcome for a report, or None where the report adds no line (a passing setup or teardown)."""
    if report.when == "call":
        return report.outcome
    if report.failed:
        return "error"
    if report.when == "setup" and report.skipped:
        return "skipped"
    return None


def pytest_runtest_logreport(report):
    if not _out:
        return
    outcome = outcome_of(report)
    if outcome is None:
        return
    msg = ""
    if outcome in ("failed", "error"):
        crash = getattr(report.longrepr, "reprcrash", None)  # the exception's own message, where pytest has it
        text = crash.message if crash is not None else str(report.longreprtext)
        lines = [ln for ln in text.splitlines() if ln.strip()]
        msg = " ".join(lines[:1] if crash is not None else lines[-1:])[:300]
    f = _out[0]
    f.write("\t".join((outcome, report.nodeid, msg.replace("\t", " "))) + "\n")
    f.flush()
