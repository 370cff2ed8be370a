"""The measured lessons' figures agree with each other, in the stored outputs.

For every measured lesson of notebooks 01 to 05 (tests/figures_agree.py lists them,
with the factor each comparison allows and why): a quantity printed twice shows the
same digits, the same quantity measured in two cells agrees within a stated factor,
and a printed conclusion is the one its printed figures imply. These read only the
stored outputs, so they are fast; they fail on a notebook recorded on a busy machine
or with cells re-run alone.

``FIGURES_FROM=/tmp/fresh pytest tests/test_figures_agree.py`` runs the same checks
on freshly executed copies in that folder (names starting with the notebook's
number) instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from figures_agree import (
    CAUSE,
    CHECKS,
    NOTEBOOKS,
    Check,
    check_scaling_table,
    nb01_history_printed_twice,
    nb02_bucket_trend,
    nb05_starved_device,
    outputs_of,
    problems_of,
)


def _notebook(number: str) -> Path:
    folder = Path(os.environ.get("FIGURES_FROM") or NOTEBOOKS)
    found = sorted(folder.glob(f"{number}*.ipynb"))
    if not found:
        if folder == NOTEBOOKS:
            pytest.fail(f"no notebook {number}_*.ipynb in {folder}")
        pytest.skip(f"no executed copy of notebook {number} in FIGURES_FROM={folder}")
    return found[0]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: f"{c.notebook}-{c.name}")
def test_the_figures_of_a_measured_lesson_agree(check: Check):
    path = _notebook(check.notebook)
    problems = problems_of(check, outputs_of(path))
    assert not problems, (
        f"{path.name}, {check.kind} ({check.name}):\n  "
        + "\n  ".join(problems)
        + f"\n{CAUSE}"
    )


def test_every_measured_notebook_has_checks():
    assert {c.notebook for c in CHECKS} == {"01", "02", "03", "04", "05"}


# ------------------------------------------------- the checks can fail
HISTORY = (
    "epoch 1/2  loss 1.486  accuracy 0.644  eval accuracy 0.719\n"
    "epoch 2/2  loss 0.322  accuracy 0.954  eval accuracy 0.961\n"
    "epoch   loss  accuracy  eval accuracy\n"
    "    1  1.486     0.644          0.719\n"
    "    2  0.322     0.954          0.961\n"
)


def test_a_history_printed_twice_with_other_digits_is_found():
    timed = (
        "epoch   loss  accuracy  eval accuracy  samples/s  seconds\n"
        "    1  1.486     0.644          0.719       1695     0.85\n"
        "    2  {loss}     0.954          0.961       2297     0.63\n"
    )
    same = {"656ce1cd": HISTORY, "4948d744": timed.format(loss="0.322")}
    other = {"656ce1cd": HISTORY, "4948d744": timed.format(loss="0.326")}
    assert nb01_history_printed_twice(same) == []
    (problem,) = nb01_history_printed_twice(other)
    assert "656ce1cd" in problem and "4948d744" in problem and "0.326" in problem


def test_a_missing_label_names_the_cell_and_the_label():
    check = next(c for c in CHECKS if c.run is nb01_history_printed_twice)
    (problem,) = problems_of(check, {"656ce1cd": "nothing printed\n"})
    assert "cell 656ce1cd prints nothing matching" in problem


SCALING = """\
mode   ranks batch/rank samples/s speed-up effic.   step compute   comm  pred. in flight
weak       1         32       675     1.00   100%   47.4    50.6    0.0    0.0       0.3
weak       2         32       670  {speedup}    50%   95.6    91.1    4.4    2.2    28.4
strong     1         32       692     1.00   100% {step}    45.4    0.8    0.0       0.3
strong     2         16       571     0.83    41%   56.0    50.3    5.8    2.2       5.5
weak scaling, 1 to 2 ranks: speed-up {speedup}, efficiency 50%: {verdict} 1 rank
"""


def test_a_scaling_table_agrees_with_itself_or_says_where_not():
    good = SCALING.format(speedup="0.99", step="46.3", verdict="about as fast as")
    assert check_scaling_table("x", good) == []
    wrong_speedup = SCALING.format(speedup="1.20", step="46.3", verdict="faster than")
    assert any("speed-up 1.2" in p for p in check_scaling_table("x", wrong_speedup))
    busy = SCALING.format(speedup="0.99", step="66.3", verdict="about as fast as")
    assert any("same work" in p for p in check_scaling_table("x", busy))
    wrong_verdict = SCALING.format(speedup="0.99", step="46.3", verdict="slower than")
    assert any(
        "weak scaling, 1 to 2" in p for p in check_scaling_table("x", wrong_verdict)
    )


def test_a_bucket_verdict_is_recomputed_from_its_rows():
    rows = (
        "           25                 1      56.1 ms\n"
        "            1                 1      {b} ms\n"
        "          0.1                 2      55.3 ms\n"
        "         0.02                 3      53.1 ms\n"
        "steps from ...; a trend with the bucket size: {said}\n"
    )
    assert nb02_bucket_trend({"2bffeb69": rows.format(b="50.3", said="no")}) == []
    assert nb02_bucket_trend({"2bffeb69": rows.format(b="50.3", said="yes")})


def test_a_starved_device_verdict_must_use_its_table():
    table = (
        "phase               seconds  steps  ms/step  CPU %  process CPU %\n"
        "decode in the loop      3.5     24    147.2     52             51\n"
        "decoded ahead           0.8     24     32.2     51             52\n"
        "decode in the loop: {loop} ms a step against 32.2 ms decoded ahead:\n"
        "  115.0 ms of each step (78%) prepared data while the device waited\n"
        "this process kept 1.02 and 1.04 of 2 cores busy: about one core in both: yes\n"
    )
    assert nb05_starved_device({"d40d01ae": table.format(loop="147.2")}) == []
    assert nb05_starved_device({"d40d01ae": table.format(loop="150.0")})
