"""workshop.cluster.slurm_status, time limits: --time read as Slurm reads it, printed
as scontrol prints it; and Slurm's own reading of the same forms, on the machine's
Slurm or a private cluster."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from conftest import needs_private_slurm

from workshop.cluster.slurm_status import scontrol_time_limit, time_limit_minutes


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("5", 5), ("5:30", 6), ("5:00", 5), ("1:02:03", 63), ("0-00:05", 5),
     ("0-10:05", 605), ("24:00:00", 1440), ("1-0", 1440), ("2-12", 3600),
     ("1-2:3:4", 1564)],
)  # fmt: skip
def test_each_of_the_six_forms(text, minutes):
    assert time_limit_minutes(text) == minutes


@pytest.mark.parametrize("bad", ["", "10m", "1:2:3:4", "-5", "1-2-3", "0-10:5x", 5])
def test_other_text_is_refused_with_the_forms(bad):
    with pytest.raises(ValueError, match=r"is not a Slurm time limit; use one of M,"):
        time_limit_minutes(bad)


@pytest.mark.parametrize(
    ("minutes", "shown"),
    [(0, "00:00:00"), (5, "00:05:00"), (605, "10:05:00"), (1439, "23:59:00"),
     (1440, "1-00:00:00"), (3600, "2-12:00:00")],
)  # fmt: skip
def test_scontrol_form(minutes, shown):
    assert scontrol_time_limit(minutes) == shown


@pytest.mark.parametrize("bad", [-1, 1.5, True, "5"])
def test_scontrol_form_refuses_what_is_not_whole_minutes(bad):
    with pytest.raises(ValueError, match=r"minutes must be a whole number, 0 or more"):
        scontrol_time_limit(bad)


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
