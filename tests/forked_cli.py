"""``emunum`` on the command line, in a child process forked from the test process.

The child runs ``emunum.cli.main(argv)`` as ``python -m emunum.cli`` would (exit status from its return value or
``SystemExit``, a traceback and status 1 on any other exception), with its own stdout and stderr. A hang or a
crash of the command fails the test, not the session, as with a fresh interpreter; forked, the child does not
import torch again (about 2 CPU-seconds per command, most of a command's cost in the analysis tests).
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
import traceback
import types


def run(argv, timeout: float) -> types.SimpleNamespace:
    """``returncode``, ``stdout``, ``stderr`` of ``emunum <argv>``; fails (AssertionError) after ``timeout`` s."""
    from emunum import cli

    argv = [str(a) for a in argv]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = open(1, "w", closefd=False)
                sys.stderr = open(2, "w", closefd=False)
                try:
                    code = cli.main(argv)
                except SystemExit as e:
                    code = e.code
                if code is None:
                    code = 0
                elif not isinstance(code, int):
                    print(code, file=sys.stderr)
                    code = 1
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError(f"emunum {' '.join(argv)} did not finish within {timeout} s")
            time.sleep(0.01)
        out.seek(0)
        err.seek(0)
        code = os.waitstatus_to_exitcode(status)
        return types.SimpleNamespace(returncode=code, stdout=out.read().decode(), stderr=err.read().decode())
