"""The textbook cost of a ring all-reduce, and the bandwidths nccl-tests reports.

A ring all-reduce of S bytes over N ranks takes 2(N-1) steps, each sending S/N
bytes to the next rank: ``T = 2(N-1)·alpha + 2(N-1)/N · S / beta``, where alpha is
the latency of one step and beta the bandwidth of one link (bytes/s).

nccl-tests reports two bandwidths for a measured time T:
``algbw = S / T`` (what the caller sees) and ``busbw = algbw · 2(N-1)/N`` (what
each link carried, comparable across world sizes and with the hardware's speed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..checks import whole

__all__ = [
    "AlphaBeta",
    "algbw",
    "bus_factor",
    "busbw",
    "fit_alpha_beta",
    "ring_all_reduce_time",
]


def bus_factor(world_size: int) -> float:
    """The share of the data each rank sends in a ring all-reduce: 2(N-1)/N.

    Example:
        >>> bus_factor(4)
        1.5
    """
    whole("world_size", world_size)
    return 2 * (world_size - 1) / world_size


def algbw(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: the message size over the time it took.

    Raises:
        ValueError: a time that is not positive, or a negative size.

    Example:
        >>> algbw(8e6, 0.004)
        2000000000.0
    """
    if not seconds > 0:
        raise ValueError(f"time must be > 0 seconds, got {seconds!r}")
    if size_bytes < 0:
        raise ValueError(f"size must be >= 0 bytes, got {size_bytes!r}")
    return size_bytes / seconds


def busbw(size_bytes: float, seconds: float, world_size: int) -> float:
    """Bus bandwidth in bytes/s of an all-reduce: ``algbw · 2(N-1)/N``.

    Example:
        >>> busbw(8e6, 0.004, 4)
        3000000000.0
    """
    return algbw(size_bytes, seconds) * bus_factor(world_size)


def ring_all_reduce_time(
    size_bytes: float, world_size: int, alpha: float, beta: float
) -> float:
    """Predicted seconds of a ring all-reduce of ``size_bytes`` on ``world_size``
    ranks (1 costs nothing), with ``alpha`` s per step and ``beta`` bytes/s per link.

    Example:
        >>> ring_all_reduce_time(4e6, 4, alpha=1e-5, beta=1e9)
        0.00606
    """
    whole("world_size", world_size)
    if alpha < 0 or not beta > 0:
        raise ValueError(
            f"need alpha >= 0 and beta > 0, got alpha={alpha!r}, beta={beta!r}"
        )
    steps = 2 * (world_size - 1)
    return steps * alpha + bus_factor(world_size) * size_bytes / beta


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted ring model: ``alpha`` (s per step), ``beta`` (bytes/s per link), the
    world size, and the worst relative error over the fitted points."""

    alpha: float
    beta: float
    world_size: int
    max_rel_error: float

    def predict(self, size_bytes: float) -> float:
        """Predicted seconds for an all-reduce of ``size_bytes`` at this world size."""
        return ring_all_reduce_time(size_bytes, self.world_size, self.alpha, self.beta)

    def describe(self) -> str:
        """One line for a report, e.g. ``alpha = 35.2 us, beta = 1.84 GB/s``."""
        return (
            f"alpha = {self.alpha * 1e6:.1f} us per step, "
            f"beta = {self.beta / 1e9:.3g} GB/s per link "
            f"(N = {self.world_size}; worst error {self.max_rel_error:.0%})"
        )


def fit_alpha_beta(
    sizes: Sequence[float], seconds: Sequence[float], world_size: int
) -> AlphaBeta:
    """Fit the ring all-reduce model to measured (size, time) points.

    The fit minimises *relative* error, so the microseconds of small messages count as
    much as the long transfers of large ones; alpha and beta are kept non-negative.

    Args:
        seconds: measured time of each size (a median, say).
        world_size: ranks the measurement ran on; 2 or more.

    Returns:
        The :class:`AlphaBeta` fit with its worst relative error.

    Raises:
        ValueError: fewer than two distinct sizes, mismatched lengths, a time that is
            not positive, or world_size < 2.

    Example:
        >>> times = [ring_all_reduce_time(s, 4, 2e-5, 5e8) for s in (1e3, 1e7)]
        >>> fit = fit_alpha_beta([1e3, 1e7], times, 4)
        >>> round(fit.alpha * 1e6, 3), round(fit.beta / 1e6, 3)
        (20.0, 500.0)
    """
    whole("world_size", world_size)
    if world_size < 2:
        raise ValueError(
            "an all-reduce on 1 rank sends nothing, so there is no alpha or beta to "
            "fit; measure with world_size >= 2"
        )
    if len(sizes) != len(seconds):
        raise ValueError(
            f"got {len(sizes)} sizes but {len(seconds)} times; pass one time per size"
        )
    if len(set(sizes)) < 2:
        raise ValueError(
            f"need at least two different sizes to fit alpha and beta, got "
            f"{list(sizes)}; measure a small and a large message at least"
        )
    negative = [s for s in sizes if not s >= 0]
    if negative:
        raise ValueError(f"sizes must be >= 0 bytes, got {negative}")
    bad = [t for t in seconds if not 0 < t < math.inf]
    if bad:
        raise ValueError(
            f"times must be finite and > 0 seconds, got {bad}; drop those points"
        )
    steps = 2 * (world_size - 1)
    factor = bus_factor(world_size)
    # T = steps·alpha + factor·S·(1/beta): linear in (alpha, g = 1/beta). Dividing each
    # row by T makes it a fit of relative error: minimise sum (model/T - 1)^2.
    rows = [(steps / t, factor * s / t) for s, t in zip(sizes, seconds, strict=True)]
    alpha, g = _nonneg_lstsq(rows)
    if g <= 0:  # all sizes took the same time: bandwidth is too high to resolve
        g = (
            min(t / (factor * s) for s, t in zip(sizes, seconds, strict=True) if s > 0)
            * 1e-6
        )
    fit = AlphaBeta(alpha, 1.0 / g, world_size, 0.0)
    worst = max(
        abs(fit.predict(s) - t) / t for s, t in zip(sizes, seconds, strict=True)
    )
    return AlphaBeta(alpha, 1.0 / g, world_size, worst)


def _nonneg_lstsq(rows: list[tuple[float, float]]) -> tuple[float, float]:
    """min sum (a·x + b·y - 1)^2 over x, y >= 0: the 2x2 normal equations, or
    the better one-variable fit where the joint one is negative."""
    saa = sum(a * a for a, _ in rows)
    sbb = sum(b * b for _, b in rows)
    sab = sum(a * b for a, b in rows)
    sa = sum(a for a, _ in rows)
    sb = sum(b for _, b in rows)

    def loss(x: float, y: float) -> float:
        return sum((a * x + b * y - 1) ** 2 for a, b in rows)

    candidates = [(sa / saa if saa else 0.0, 0.0), (0.0, sb / sbb if sbb else 0.0)]
    det = saa * sbb - sab * sab
    if det > 1e-12 * saa * sbb:
        x = (sa * sbb - sb * sab) / det
        y = (sb * saa - sa * sab) / det
        if x >= 0 and y >= 0:
            candidates.append((x, y))
    best = min(candidates, key=lambda c: loss(*c))
    return best if all(math.isfinite(v) for v in best) else (0.0, 0.0)
