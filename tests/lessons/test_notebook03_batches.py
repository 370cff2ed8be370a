"""Large global batches: the warm-up schedule, the errors for bad settings, and a real
run on 1 and 4 ranks. Accuracies after one short epoch vary with the seed, so the run
asserts relations between means over fixed seeds, with wide margins (measured on a
2-core CPU over seeds 0-6, the gaps were at least twice the margins asserted)."""

from __future__ import annotations

import itertools

import pytest

from workshop.lessons.notebook03_batches import (
    BatchRun,
    LargeBatchResult,
    compare_global_batch,
    warmup_factor,
)


def test_the_warm_up_ramps_from_the_unscaled_to_the_scaled_rate():
    factors = [warmup_factor(step, 4, 8.0) for step in range(7)]
    assert factors[0] == pytest.approx(1 / 8)  # starts at the 1-rank learning rate
    assert factors[4:] == [1.0, 1.0, 1.0]  # the scaled rate from step 4 on
    assert all(a < b for a, b in itertools.pairwise(factors[:5]))
    assert [warmup_factor(step, 0, 8.0) for step in range(3)] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("scale", [0.5, 0.0, float("nan")])
def test_a_warm_up_that_would_ramp_down_is_refused(scale):
    with pytest.raises(ValueError, match=r"scale=.* must be 1 or more"):
        warmup_factor(0, 3, scale)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"world_size": 1},
            r"world_size must be a whole number, 2 or more, not 1; "
            r"e\.g\. compare_global_batch\(world_size=4",
        ),
        ({"per_rank_batch": 0}, r"per_rank_batch must be a whole number, 1 or more, "),
        ({"epochs": 1.5}, r"epochs must be a whole number, 1 or more, not 1\.5"),
        ({"warmup_steps": -1}, r"warmup_steps must be a whole number, 0 or more, not"),
        ({"lr": 0.0}, r"lr must be a number above 0, not 0\.0; e\.g\. lr=0\.05"),
        ({"lr": float("nan")}, r"lr must be a number above 0, not nan"),
        (
            {"seeds": ()},
            r"seeds must be one or more whole numbers, each 0 or more, "
            r"not \(\); e\.g\. seeds=\(0, 1, 2\)",
        ),
        ({"seeds": (0, "1")}, r"seeds must be one or more whole numbers.*\(0, '1'\)"),
        (
            {"seeds": 3},
            r"seeds must be one or more whole numbers, each 0 or more, "
            r"not 3",
        ),
    ],
)
def test_bad_settings_are_refused_before_any_rank_starts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        compare_global_batch(**kwargs)


def test_the_table_fits_88_columns_and_shows_every_run():
    runs = tuple(
        BatchRun(ranks, 32, lr, warm, steps, (0.5, 0.25, 0.125))
        for ranks, lr, warm, steps in [
            (1, 0.05, 0, 45),
            (16, 0.05, 0, 3),
            (16, 0.8, 3, 3),
            (16, 0.8, 0, 3),
        ]
    )
    text = LargeBatchResult(runs, 1, (0, 1, 2), "gloo").table()
    assert max(len(line) for line in text.splitlines()) <= 88
    assert "16 ranks, lr x 16, warm-up" in text
    assert " 512 " in text  # 16 ranks x 32: the global batch
    assert "0.292" in text  # the mean of the three seeds
    assert runs[1].global_batch == 512


def test_the_table_fits_88_columns_with_many_ranks_and_seeds():
    seeds = tuple(range(12))
    accuracies = tuple(0.5 + 0.01 * s for s in seeds)
    runs = tuple(
        BatchRun(ranks, 32, lr, warm, steps, accuracies)
        for ranks, lr, warm, steps in [
            (1, 0.05, 0, 45),
            (1024, 0.05, 0, 1),
            (1024, 51.2, 3, 1),
            (1024, 51.2, 0, 1),
        ]
    )
    text = LargeBatchResult(runs, 1, seeds, "nccl").table()
    assert max(len(line) for line in text.splitlines()) <= 88
    assert "1024 ranks, lr x 1024, warm-up" in text and "32768" in text
    # Every seed's accuracy is shown, for every run.
    assert text.count("0.61") == 4
