"""The slow tests of test_cli_inputs.py (they start processes, kernels or ranks, or take
seconds): make test runs them, make test-fast leaves them out: what a user sees, in
fresh processes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_cli_inputs import ROOT


@pytest.mark.parametrize(
    "argv",
    [
        ["workshop.bench", "launch", "--repeats", "0"],
        ["workshop.bench", "launch", "--world-size", "0"],
        ["workshop", "check-node", "--json", "{file}/check.json"],
    ],
)
def test_what_a_user_sees_is_usage_and_one_error_line(argv, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    argv = [a.format(file=a_file) for a in argv]
    done = subprocess.run(
        [sys.executable, "-m", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("usage: ")
    last = done.stderr.splitlines()[-1]
    assert last.startswith(
        f"python -m {argv[0]} {argv[1]}: error: argument {argv[2]}: "
    )
    assert argv[3] in last
