"""The ring all-reduce's 2(N-1) steps, computed right (workshop.comm.ring)."""

from __future__ import annotations

import doctest

import pytest
from figure_helpers import flat

import workshop.comm.ring
from workshop.comm.ring import ring_all_reduce_steps


@pytest.mark.parametrize("n", [2, 3, 4, 6])
def test_a_ring_takes_2_n_minus_1_steps_and_ends_with_the_sum_everywhere(n):
    values = [[10 * r + i for i in range(n + 1)] for r in range(n)]
    steps = ring_all_reduce_steps(values)
    assert len(steps) == 2 * (n - 1)
    assert [s.step for s in steps] == list(range(2 * (n - 1)))
    assert [s.phase for s in steps] == ["reduce-scatter"] * (n - 1) + ["all-gather"] * (
        n - 1
    )
    total = [sum(v[i] for v in values) for i in range(n + 1)]
    for rank in range(n):
        assert flat(steps[-1].after[rank]) == total
        assert steps[-1].counts[rank] == [n] * n
    # Chunks split as evenly as they can: n + 1 values in n chunks.
    assert sorted(len(c) for c in steps[0].before[0]) == [1] * (n - 1) + [2]


def test_each_ring_step_sends_the_right_chunk_and_adds_or_copies_it():
    values = [[4 * r + i for i in range(4)] for r in range(4)]
    steps = ring_all_reduce_steps(values)
    # Reduce-scatter step s: rank r sends chunk (r - s) mod 4; all-gather step s:
    # chunk (r + 1 - s) mod 4, the one it finished.
    assert [s.sends for s in steps] == [
        [0, 1, 2, 3],
        [3, 0, 1, 2],
        [2, 3, 0, 1],
        [1, 2, 3, 0],
        [0, 1, 2, 3],
        [3, 0, 1, 2],
    ]
    first = steps[0]
    assert first.before[1] == [[4], [5], [6], [7]]
    assert first.sent[0] == [0]
    assert first.after[1] == [[4], [5], [6], [7]]  # 4 + rank 0's chunk 0, which is 0
    assert first.after[0][3] == [3 + 15]  # rank 3's chunk 3 added to rank 0's
    # After reduce-scatter rank r holds the full sum of chunk r + 1, and only it.
    middle = steps[2]
    for r in range(4):
        c = (r + 1) % 4
        assert middle.after[r][c] == [sum(4 * q + c for q in range(4))]
        assert middle.counts[r][c] == 4
        assert sum(count == 4 for count in middle.counts[r]) == 1
    # All-gather copies: what arrives replaces what was there.
    assert steps[3].after[1][1] == steps[3].sent[0] == [28]


@pytest.mark.parametrize(
    "values", [[[1, 2]], [[1, 2], [1]], [[1], [2], [3, 4]], [[1], [2]][:1]]
)
def test_a_ring_that_cannot_be_computed_is_explained(values):
    with pytest.raises(ValueError, match="a ring needs 2 or more ranks"):
        ring_all_reduce_steps(values)


def test_the_docstring_examples_run():
    assert doctest.testmod(workshop.comm.ring).failed == 0
