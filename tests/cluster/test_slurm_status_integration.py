"""The slow test of test_slurm_status.py: Slurm itself (the machine's, or else the run's
private cluster) reads the time forms as we do. make test runs it, make test-fast leaves
it out."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from conftest import needs_private_slurm

from workshop.cluster.slurm_status import scontrol_time_limit, time_limit_minutes


def _answers() -> bool:
    if shutil.which("scontrol") is None:
        return False
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, timeout=30)
    return ping.returncode == 0 and b"UP" in ping.stdout


@pytest.fixture(scope="module")
def slurm(request):
    """A Slurm that answers: the machine's own, or else the run's private cluster."""
    if _answers():
        return None
    return request.getfixturevalue("private_slurm")


@needs_private_slurm
def test_slurm_reads_the_forms_as_we_do(slurm):
    # Held jobs never run; each is cancelled once its limit is read.
    for text in ("5:30", "0-10:05", "2-12"):
        job = subprocess.run(
            ["sbatch", "--parsable", "--hold", f"--time={text}", "--output=/dev/null",
             "--wrap", "true"], capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if job.returncode != 0:
            pytest.skip(f"sbatch refused a held job here: {job.stderr.strip()}")
        job_id = job.stdout.strip().split(";")[0]
        try:
            shown = subprocess.run(
                ["scontrol", "show", "job", job_id], capture_output=True, text=True,
                timeout=60,
            ).stdout  # fmt: skip
        finally:
            subprocess.run(["scancel", job_id], timeout=60)
        expected = scontrol_time_limit(time_limit_minutes(text))
        assert f"TimeLimit={expected} " in shown, shown
