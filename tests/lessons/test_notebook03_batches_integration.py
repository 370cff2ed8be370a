"""The slow tests of test_notebook03_batches.py (they start processes, kernels or ranks,
or take seconds): make test runs them, make test-fast leaves them out: real training on
ranks."""

from __future__ import annotations

import math

import pytest

from workshop.lessons.notebook03_batches import (
    compare_global_batch,
)
from workshop.training.data import digits


def test_more_ranks_at_the_same_batch_per_rank_take_fewer_steps_and_learn_less():
    result = compare_global_batch(world_size=4, seeds=(0, 1, 2))
    one, same_lr, scaled_warm, scaled = result.runs
    samples = len(digits("train"))
    # A DistributedSampler gives each rank ceil(samples / 4) of them.
    assert one.steps == math.ceil(samples / 32)
    assert same_lr.steps == scaled.steps == math.ceil(math.ceil(samples / 4) / 32)
    assert (one.global_batch, same_lr.global_batch) == (32, 128)
    assert (scaled_warm.lr, scaled_warm.warmup_steps) == (pytest.approx(0.2), 3)
    for run in result.runs:
        assert len(run.accuracies) == 3
        assert all(0.0 <= a <= 1.0 for a in run.accuracies)
    # Four times fewer steps at the same learning rate: far less learned.
    assert one.accuracy > same_lr.accuracy + 0.2
    # The linear scaling rule recovers part of it, with or without the warm-up.
    assert scaled_warm.accuracy > same_lr.accuracy + 0.1
    assert scaled.accuracy > same_lr.accuracy + 0.1
    assert result.backend in ("gloo", "nccl")
