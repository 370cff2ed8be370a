"""The slow tests of test_exercises.py (they start processes, kernels or ranks, or take
seconds): make test runs them, make test-fast leaves them out: every reference answer
run."""

from __future__ import annotations

import pytest
from test_exercises import RIGHT, WRONG

# Notebook 05's solutions and wrong answers sit beside their own tests.
from workshop.lessons.exercises import EXERCISES, check, judge


# 02.resume is checked by training a step in this process.
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.backward_in_process)
        if n == "02.resume"
        else n
        for n in sorted(EXERCISES)
    ],
)
def test_reference_answers_pass_and_wrong_ones_get_a_hint(name, capsys):
    assert check(name, RIGHT[name]) is None  # a notebook cell shows the verdict only
    assert capsys.readouterr().out == f"Right: {name}\n"
    assert judge(name, RIGHT[name]) is True
    assert capsys.readouterr().out == f"Right: {name}\n"
    assert judge(name, WRONG[name]) is False
    out = capsys.readouterr().out
    assert out.startswith(f"Not yet: {name}.\n") and "\nHint: " in out
    assert "\nIt wants " in out
    assert max(len(line) for line in out.splitlines()) <= 88  # a notebook column
    # A function: the first case it gets wrong, and the right value.
    if name in WHY_WRONG:
        assert WHY_WRONG[name] in out


# What the verdict says of WRONG's functions: the first failing case, as a unit test
# would show it, so the learner can debug rather than guess.
WHY_WRONG = {
    "01.bubble": "bubble(2, 1) returned 1; it should be 0.5.",
    "02.bytes": "ring_bytes(25557032, 4, 8) returned 102228128; it should be 178899224",
    "02.ring": "on 2 ranks, rank 0 returned [",
    "03.placement": "placement(3, 4) returned (3, 0); it should be (0, 3).",
    "03.local_rank": "local_rank(['--local-rank=1', '--epochs', '1'], {}) returned 0;",
    "03.hybrid": "hybrid(1, 2, 2) returned (0, 0, 16); it should be (2, 2, 1).",
    "03.efficiency": "efficiency([(2, 322.93), (4, 629.01), (64, 9318.2)], False)",
    "03.ring_time": "ring_time(100000000, 16, 5e-06, 12500000000) returned 0.00815; it",
    "04.row_split": "on 2 ranks, rank 0's output is off by up to",
    "04.server_bytes": "server_bytes(8, 4000000) returned 32000000; it should be 6",
}
