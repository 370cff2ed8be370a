"""The private cluster's two nodes (scripts/local_slurm.sh), and slurm/mpirun.sbatch.

The private cluster runs two node daemons on this machine, so a job of two nodes runs
on two nodes: each node's slurmd starts that node's tasks, which see their own node's
name. mpirun.sbatch, Open MPI under Slurm, is submitted there and must start one rank
on each node. Both scripts pass ``bash -n`` and shellcheck."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from conftest import ROOT, needs_private_slurm

from workshop.cluster.slurm_here import LOCAL_SLURM

MPIRUN_SBATCH = ROOT / "slurm" / "mpirun.sbatch"


@pytest.mark.parametrize("script", [LOCAL_SLURM, MPIRUN_SBATCH], ids=lambda p: p.name)
def test_the_scripts_pass_bash_n_and_shellcheck(script):
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck missing (Debian/Ubuntu: apt-get install shellcheck)")
    done = subprocess.run(
        ["shellcheck", str(script)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout


@needs_private_slurm  # checked after Slurm, root and the host name
def test_a_folder_too_long_for_slurms_sockets_is_refused(tmp_path):
    folder = tmp_path / ("x" * 80)
    done = subprocess.run(["bash", str(LOCAL_SLURM), "start", str(folder)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1
    assert re.fullmatch(
        rf"local_slurm\.sh: the folder {re.escape(str(folder))} has "
        rf"{len(str(folder))} characters; Slurm's job sockets in it would pass the "
        r"108 a socket's path may have\. Use a folder of at most 68 characters "
        r"\(mktemp -d makes one\)\n",
        done.stderr,
    )
    assert list(folder.iterdir()) == []  # nothing started, nothing written
