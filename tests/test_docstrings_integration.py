"""The slow test of test_docstrings.py: every example in the package's docstrings,
run in a fresh process (make test-fast leaves it out)."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT, repo_env

RUN_ALL = (
    "import sys; sys.path.insert(0, 'tests'); "
    "from test_docstrings import MODULES, run_examples; "
    "report = run_examples(MODULES); print(report); sys.exit(1 if report else 0)"
)


def test_every_docstring_example_gives_what_it_shows():
    # An Example is what a reader copies: one that no longer runs, or prints
    # something else, misleads. Those marked "+SKIP" (a launch, a cluster) are not
    # run. A fresh process: some examples run a backward pass or start threads.
    done = subprocess.run(
        [sys.executable, "-c", RUN_ALL], cwd=ROOT, env=repo_env(),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
