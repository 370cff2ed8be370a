"""Every shell script of the project, batch scripts included, passes ``bash -n`` and
shellcheck: the scripts are what learners copy to their own cluster."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from conftest import ROOT

SCRIPTS = sorted([*(ROOT / "slurm").glob("*.sbatch"), *(ROOT / "scripts").glob("*.sh")])


def test_there_are_scripts_to_check():
    names = {p.name for p in SCRIPTS}
    assert {"train_ddp.sbatch", "jupyter.sbatch", "setup.sh"} <= names, names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bash_parses_it(script):
    done = subprocess.run(
        ["bash", "-n", str(script)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(
    shutil.which("shellcheck") is None,
    reason="needs shellcheck (make setup installs it as root on Debian/Ubuntu: "
    "apt-get install shellcheck)",
)
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck_finds_nothing(script):
    done = subprocess.run(
        ["shellcheck", "--severity=style", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout
