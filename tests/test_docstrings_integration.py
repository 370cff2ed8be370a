"""The slow test of test_docstrings.py: every example in the package's docstrings,
run in a fresh process (make test-fast leaves it out)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from conftest import ROOT, repo_env

RUN_ALL = (
    "import sys; sys.path.insert(0, 'tests'); "
    "from test_docstrings import MODULES, run_examples; "
    "report = run_examples(MODULES); print(report); sys.exit(1 if report else 0)"
)


def test_every_docstring_example_gives_what_it_shows(tmp_path):
    # An Example is what a reader copies: one that no longer runs, or prints
    # something else, misleads. Those marked "+SKIP" (a launch, a cluster) are not
    # run. A fresh process: some examples run a backward pass or start threads.
    # The command builders' examples only need their program to exist (they never
    # run it): where Slurm or Open MPI is missing (a GPU node without MPI, a
    # laptop), a stand-in that is never started takes its place on PATH.
    for program in ("mpirun", "srun"):
        if shutil.which(program) is None:
            (tmp_path / program).write_text("#!/bin/sh\nexit 0\n")
            (tmp_path / program).chmod(0o755)
    path = f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run(
        [sys.executable, "-c", RUN_ALL], cwd=ROOT, env=repo_env(PATH=path),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
