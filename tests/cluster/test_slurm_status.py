"""workshop.cluster.slurm_status, time limits: --time read as Slurm reads it, printed
as scontrol prints it; and Slurm's own reading of the same forms, on the machine's
Slurm or a private cluster."""

from __future__ import annotations

import pytest

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
