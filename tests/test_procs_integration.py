"""Ctrl-C in a real script (make test-fast leaves it out)."""

from __future__ import annotations

import signal
import subprocess
import sys

from conftest import ROOT, repo_env
from test_procs import MESSAGE


def test_a_script_that_does_not_catch_it_ends_as_ctrl_c_ends_it():
    code = (
        "from workshop._procs import interrupted\n"
        f"raise interrupted({MESSAGE!r}) from None\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=repo_env(),
        cwd=ROOT,
    )
    # Python re-raises an uncaught KeyboardInterrupt as SIGINT on itself: a shell
    # shows status 130, and whatever started the script sees Ctrl-C.
    assert done.returncode == -signal.SIGINT, done.stderr
    assert done.stderr.splitlines()[-1] == f"KeyboardInterrupt: {MESSAGE}"
