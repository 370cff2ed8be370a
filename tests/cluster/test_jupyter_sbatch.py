"""slurm/jupyter.sbatch: JupyterLab on a compute node, reached through an SSH tunnel.

The script is submitted to the private cluster of scripts/local_slurm.sh (one node or
two: the server runs on whichever node the job gets) and reached through the address
and token it prints; then it is cancelled, and nothing may be left: no server, no job
process, no runtime file. The same script run by bash alone (no Slurm) is stopped by
a TERM to the script itself, which its trap passes on. Its errors are read without
starting a server, and it passes ``bash -n`` and shellcheck."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, clean_env

SCRIPT = ROOT / "slurm" / "jupyter.sbatch"
BASH = shutil.which("bash") or "/bin/bash"  # found here: the tests change PATH
READY = "JupyterLab is ready on "


def _environment() -> dict[str, str]:
    """WORKSHOP_VENV for the job: the environment running these tests, so that the
    server is the JupyterLab installed beside them (a venv, or PATH as it is)."""
    prefix = Path(sys.prefix)
    if (prefix / "bin" / "activate").is_file():
        return {"WORKSHOP_VENV": str(prefix)}
    return {"WORKSHOP_VENV": "none", "PATH": f"{Path(sys.executable).parent}:"
            f"{os.environ.get('PATH', '')}"}  # fmt: skip


# --- the script as text --------------------------------------------------------------


def test_the_script_parses():
    done = subprocess.run([BASH, "-n", str(SCRIPT)], capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="needs shellcheck "
                    "(Debian/Ubuntu: apt-get install shellcheck)")  # fmt: skip
def test_shellcheck_finds_nothing():
    done = subprocess.run(
        ["shellcheck", str(SCRIPT)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_header_says_how_to_submit_and_what_to_edit():
    head = SCRIPT.read_text().split("set -euo pipefail")[0]
    assert "sbatch slurm/jupyter.sbatch" in head
    for line in ("##SBATCH --account=", "##SBATCH --partition=",
                 "##SBATCH --reservation=", "#SBATCH --gpus-per-node=",
                 "#SBATCH --time=", "#SBATCH --nodes=1"):  # fmt: skip
        assert f"\n{line}" in head, line
    assert "LOGIN_HOST" in head and "WORKSHOP_VENV" in head


# --- errors, before any server starts ------------------------------------------------


def _run_script(env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [BASH, str(SCRIPT)], env=clean_env(**env), cwd=cwd,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _bin(folder: Path, tools: dict[str, str]) -> str:
    """A folder of fake tools (name -> body of a sh script) for PATH."""
    folder.mkdir()
    for name, body in tools.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    return str(folder)


def test_a_venv_that_is_not_there_is_named(tmp_path):
    done = _run_script({"WORKSHOP_VENV": str(tmp_path / "nope")})
    assert done.returncode == 1
    assert re.search(
        rf"^jupyter\.sbatch: WORKSHOP_VENV={tmp_path}/nope is not a virtual "
        r"environment \(no bin/activate in it\)\. HINT: give the folder made by "
        r"'python -m venv', or WORKSHOP_VENV=none with a 'module load' line",
        done.stderr,
    ), done.stderr


def test_without_jupyterlab_it_says_where_it_looked(tmp_path):
    path = _bin(tmp_path / "bin", {"hostname": "echo node1"})
    done = _run_script({"WORKSHOP_VENV": "none", "PATH": f"{path}:/nonexistent"})
    assert done.returncode == 1
    assert done.stderr == (
        "jupyter.sbatch: JupyterLab not found (tried WORKSHOP_VENV=none, then "
        "jupyter-lab on PATH, then python3 -m jupyterlab). HINT: run 'make setup' "
        f"in {ROOT}, set WORKSHOP_VENV to your environment, or load your site's "
        "JupyterLab module in this script\n"
    )


def test_submitting_from_outside_the_repository_is_refused(tmp_path):
    done = _run_script({**_environment(), "WORKSHOP_DIR": str(tmp_path)})
    assert done.returncode == 1
    assert done.stderr == (
        f"jupyter.sbatch: no notebooks folder at {tmp_path}/notebooks. HINT: submit "
        "from the repository root (cd scaling-pytorch-hpc; sbatch "
        "slurm/jupyter.sbatch), or set WORKSHOP_DIR to it\n"
    )


def test_no_server_starts_without_a_token(tmp_path):
    # A python3 that prints nothing for the token (and is itself for the port).
    real = shutil.which("python3")
    fake = _bin(tmp_path / "bin", {"python3": (
        f'case "$*" in *secrets*) exit 0;; *) exec {real} "$@";; esac')})  # fmt: skip
    # WORKSHOP_VENV=none: an activated venv would put its python3 first.
    here = Path(sys.executable).parent  # jupyter-lab beside the tests' Python
    env = {"WORKSHOP_VENV": "none", "PATH": f"{fake}:{here}:{os.environ['PATH']}"}
    done = _run_script(env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.endswith(
        "jupyter.sbatch: could not make a token (python3 printed ''); refusing to "
        "start a server without one\n"
    ), done.stderr
    assert "jupyter-lab" not in done.stderr and READY not in done.stdout


# --- the server, run by bash alone: a TERM to the script stops it ---------------------


# --- the server as a Slurm job on the private cluster --------------------------------
