"""workshop.comm.costmodel: nccl-tests' bandwidths, the ring model and its fit."""

from __future__ import annotations

import random

import pytest

from workshop.comm.costmodel import (
    AlphaBeta,
    algbw,
    bus_factor,
    busbw,
    fit_alpha_beta,
    ring_all_reduce_time,
)

SIZES = [4096 * 4**k for k in range(8)]  # 4 KiB .. 64 MiB, as the benchmark's


@pytest.mark.parametrize(
    ("world_size", "factor"), [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)]
)
def test_bus_factor_is_2_n_minus_1_over_n(world_size, factor):
    assert bus_factor(world_size) == factor


def test_algbw_and_busbw_against_hand_computed_values():
    # 8 MB in 4 ms: 2 GB/s seen by the caller; 4 ranks each carried 1.5 times that.
    assert algbw(8e6, 0.004) == pytest.approx(2e9)
    assert busbw(8e6, 0.004, 4) == pytest.approx(3e9)
    # 1 GiB in 0.5 s on 8 ranks: algbw 2^31 B/s, busbw 7/4 of it.
    assert algbw(2**30, 0.5) == 2**31
    assert busbw(2**30, 0.5, 8) == pytest.approx(2**31 * 1.75)
    # On 2 ranks busbw equals algbw: each rank sends half and receives half, twice.
    assert busbw(1e6, 1e-3, 2) == algbw(1e6, 1e-3) == pytest.approx(1e9)


def test_ring_time_against_hand_computed_value():
    # 2(N-1) = 6 steps of 10 us, plus 1.5 * 4 MB at 1 GB/s = 6 ms.
    assert ring_all_reduce_time(4e6, 4, alpha=1e-5, beta=1e9) == pytest.approx(0.00606)
    assert ring_all_reduce_time(4e6, 1, alpha=1e-5, beta=1e9) == 0.0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: algbw(1e6, 0.0), r"time must be > 0 seconds, got 0\.0"),
        (lambda: algbw(-1, 1.0), r"size must be >= 0 bytes, got -1"),
        (
            lambda: busbw(1e6, 1.0, 0),
            r"world_size must be a whole number, 1 or more, not 0",
        ),
        (
            lambda: bus_factor(True),
            r"world_size must be a whole number, 1 or more, not True",
        ),
        (
            lambda: ring_all_reduce_time(1e6, 2, alpha=1e-5, beta=0),
            r"need alpha >= 0 and beta > 0, got alpha=1e-05, beta=0",
        ),
    ],
)
def test_bad_inputs_name_the_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("world_size", [2, 4, 8])
@pytest.mark.parametrize(("alpha", "beta"), [(3e-4, 9e8), (2e-5, 2e11)])
def test_fit_recovers_alpha_and_beta_from_exact_times(world_size, alpha, beta):
    times = [ring_all_reduce_time(s, world_size, alpha, beta) for s in SIZES]
    fit = fit_alpha_beta(SIZES, times, world_size)
    assert fit.alpha == pytest.approx(alpha, rel=1e-9)
    assert fit.beta == pytest.approx(beta, rel=1e-9)
    assert fit.world_size == world_size
    assert fit.max_rel_error < 1e-9
    assert fit.predict(SIZES[3]) == pytest.approx(times[3], rel=1e-9)


def test_fit_recovers_alpha_and_beta_from_noisy_times():
    rng = random.Random(0)
    alpha, beta = 4e-4, 9e8
    sizes = SIZES * 5  # five noisy repetitions of every size
    times = [
        ring_all_reduce_time(s, 2, alpha, beta) * rng.uniform(0.9, 1.1) for s in sizes
    ]
    fit = fit_alpha_beta(sizes, times, 2)
    assert fit.alpha == pytest.approx(alpha, rel=0.1)
    assert fit.beta == pytest.approx(beta, rel=0.1)
    # ±10% noise: no point can be far from the fitted model.
    assert 0.05 < fit.max_rel_error < 0.25


def test_fit_weighs_small_and_large_messages_alike():
    # A 100 us latency is invisible next to a 100 ms transfer in absolute terms;
    # relative errors keep it: 10% off at the small end would show.
    times = [ring_all_reduce_time(s, 4, 1e-4, 1e9) for s in SIZES]
    times[0] *= 1.2
    fit = fit_alpha_beta(SIZES, times, 4)
    assert fit.alpha == pytest.approx(1e-4, rel=0.25)
    assert fit.max_rel_error == pytest.approx(
        max(abs(fit.predict(s) - t) / t for s, t in zip(SIZES, times, strict=True))
    )


def test_fit_of_flat_times_gives_alpha_and_a_beta_too_high_to_matter():
    fit = fit_alpha_beta([1e3, 1e4, 1e5], [1e-3, 1e-3, 1e-3], 2)
    assert fit.alpha == pytest.approx(0.5e-3, rel=1e-6)
    assert fit.predict(1e5) == pytest.approx(1e-3, rel=1e-3)


def test_fit_errors_say_what_to_do():
    with pytest.raises(ValueError, match=r"1 rank sends nothing.*world_size >= 2"):
        fit_alpha_beta(SIZES, [1e-3] * len(SIZES), 1)
    with pytest.raises(ValueError, match=r"got 3 sizes but 2 times; pass one time"):
        fit_alpha_beta([1, 2, 3], [1e-3, 2e-3], 2)
    with pytest.raises(ValueError, match=r"two different sizes.*got \[4096, 4096\]"):
        fit_alpha_beta([4096, 4096], [1e-3, 2e-3], 2)
    with pytest.raises(ValueError, match=r"finite and > 0 seconds, got \[0\.0, nan\]"):
        fit_alpha_beta([1, 2, 3], [1e-3, 0.0, float("nan")], 2)
    with pytest.raises(ValueError, match=r"sizes must be >= 0 bytes, got \[-4\]"):
        fit_alpha_beta([-4, 8], [1e-3, 2e-3], 2)


def test_alpha_beta_describes_itself_in_microseconds_and_gb_per_s():
    fit = AlphaBeta(alpha=35.2e-6, beta=1.84e9, world_size=4, max_rel_error=0.12)
    assert fit.describe() == (
        "alpha = 35.2 us per step, beta = 1.84 GB/s per link (N = 4; worst error 12%)"
    )
    assert fit.predict(0) == pytest.approx(6 * 35.2e-6)
