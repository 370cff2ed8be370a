"""Conclusions computed from a lesson's own measured figures (notebooks 01 to 05).

A stored output is read on other machines than the one that measured it: a faster
CPU, one thread, a busy machine. So a cell that draws a conclusion from measured
figures prints it computed from those figures, with the rule stated, instead of
leaving the markdown to assert it. Each function here takes plain figures (or an
object with the named attributes) and returns the line to print;
``tests/test_figures_agree.py`` applies the same rules to the printed figures.

Plain data only: this module imports no other wing (``bench`` and ``machine`` are
above ``lessons``), so a ScalingResult or a Monitor is read by its attributes.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "ABOUT_THE_SAME",
    "batch_verdicts",
    "bucket_trend",
    "fastest",
    "rate_ratio",
    "scaling_verdict",
    "starved_device",
]

# Two rates within 5% of each other are "about the same": the run-to-run noise of a
# quiet machine is of that order, so a finer verdict would flip between runs.
ABOUT_THE_SAME = 0.05


def _compare(ratio: float) -> str:
    if ratio >= 1 + ABOUT_THE_SAME:
        return "faster"
    if ratio <= 1 - ABOUT_THE_SAME:
        return "slower"
    return "about as fast"


def rate_ratio(
    label: str, rate: float, base_label: str, base_rate: float, unit: str = "samples/s"
) -> str:
    """One line: ``label``'s rate as a multiple of ``base_label``'s, and the verdict.

    Args:
        label, rate: what was compared and its rate (higher is faster).
        base_label, base_rate: what it is compared with.
        unit: the rates' unit, printed.

    Returns:
        ``"bf16: 262 samples/s, 0.12x fp32's 2,131: slower here"``; within 5% either
        way the verdict is "about as fast". A base rate of 0 (nothing was timed)
        gives no ratio and says so.

    Example:
        >>> rate_ratio("bf16", 262, "fp32", 2131)
        "bf16: 262 samples/s, 0.12x fp32's 2,131: slower here"
    """
    if base_rate <= 0:
        return f"{label}: {rate:,.0f} {unit}; {base_label} measured 0 {unit}: no ratio"
    ratio = round(rate / base_rate, 2)  # the verdict reads the ratio as printed
    return (
        f"{label}: {rate:,.0f} {unit}, {ratio:.2f}x {base_label}'s {base_rate:,.0f}: "
        f"{_compare(ratio)} here"
    )


def fastest(rates: Mapping[str, float], unit: str = "samples/s") -> str:
    """One line: which of ``rates`` was fastest, and how many times each other one.

    Example:
        >>> fastest({"PNG files": 3135, "one .tar": 3733, "one .npy": 17567})
        'fastest here: one .npy, 4.71x one .tar and 5.60x PNG files'
    """
    if not rates:
        raise ValueError("fastest needs at least one rate, got none")
    order = sorted(rates, key=rates.get, reverse=True)
    best, rest = order[0], order[1:]
    if rates[best] <= 0:
        return f"fastest here: none (every rate is 0 {unit})"
    parts = [
        f"{rates[best] / rates[name]:.2f}x {name}" if rates[name] > 0 else
        f"{name} measured 0 {unit}"
        for name in rest
    ]  # fmt: skip
    return f"fastest here: {best}" + (f", {' and '.join(parts)}" if parts else "")


def bucket_trend(rows: Sequence[tuple[float, int, float]]) -> str:
    """Whether DDP's step time follows the bucket cap, beyond this machine's noise.

    Args:
        rows: ``(bucket_cap_mb, buckets per step, median step ms)``, in the order the
            caps were measured.

    Returns:
        Two lines. Caps that gave the same number of buckets did the same work, so
        their difference is noise. The verdict is "a trend" only when the times rise
        (or fall) with the cap at every row *and* their spread is more than twice
        that noise.
    """
    if len(rows) < 2:
        raise ValueError(f"bucket_trend needs two caps or more, got {len(rows)}")
    ms = [r[2] for r in rows]
    by_buckets: dict[int, list[float]] = {}
    for _, buckets, t in rows:
        by_buckets.setdefault(buckets, []).append(t)
    same = [max(ts) - min(ts) for ts in by_buckets.values() if len(ts) > 1]
    noise = max(same) if same else None
    ordered = sorted(rows, key=lambda r: r[0])
    steps = [b[2] - a[2] for a, b in itertools.pairwise(ordered)]
    monotonic = all(d > 0 for d in steps) or all(d < 0 for d in steps)
    spread = max(ms) - min(ms)
    trend = monotonic and (noise is None or spread > 2 * noise)
    noise_text = (
        f"caps with the same buckets differ by {noise:.1f} ms (noise)"
        if noise is not None
        else "no two caps gave the same buckets (noise unknown)"
    )
    return (
        f"steps from {min(ms):.1f} to {max(ms):.1f} ms; {noise_text}\n"
        f"a trend with the bucket size: {'yes' if trend else 'no'}"
    )


def scaling_verdict(result: Any) -> str:
    """One line per mode of a scaling run: at its largest world size, the speed-up
    and efficiency it printed, and whether the ranks were faster than its baseline.

    Args:
        result: a :class:`workshop.bench.scaling_results.ScalingResult` (``rows``
            with ``mode``, ``world_size``, ``speedup``, ``efficiency``,
            ``base_world_size``).

    Returns:
        ``"weak scaling, 1 to 2 ranks: speed-up 0.99, efficiency 50%: about as
        fast as 1 rank"``; "faster" or "slower" past 5% either way (the speed-up as
        printed, two decimals, is what the rule reads).
    """
    lines = []
    for mode in ("weak", "strong"):
        rows = [r for r in result.rows if r.mode == mode and r.speedup is not None]
        if not rows:
            continue
        top = max(rows, key=lambda r: r.world_size)
        base = top.base_world_size
        if top.world_size == base:
            lines.append(f"{mode} scaling: only {base} rank(s) measured, no speed-up")
            continue
        speedup = round(top.speedup, 2)
        lines.append(
            f"{mode} scaling, {base} to {top.world_size} ranks: speed-up "
            f"{speedup:.2f}, efficiency {top.efficiency:.0%}: {_compare(speedup)} "
            f"{'than' if _compare(speedup) != 'about as fast' else 'as'} {base} "
            f"rank{'s' if base > 1 else ''}"
        )
    return "\n".join(lines)


def _phase_rows(table: str) -> dict[str, list[str]]:
    """A Monitor table's rows by phase: the cells, split at runs of 2+ spaces."""
    rows = {}
    for line in table.splitlines()[1:]:
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = cells[1:]
    return rows


def starved_device(
    monitor: Any, starved: str, fed: str, cpus: int | None = None
) -> str:
    """What a data-starved step costs, from a Monitor's table of the two phases.

    Args:
        monitor: a :class:`workshop.machine.Monitor` that recorded both phases.
        starved: the phase that decoded its data in the training loop.
        fed: the phase that trained on data prepared ahead.
        cpus: the machine's CPUs, for the process's share in cores (default: all).

    Returns:
        Three lines, from the figures ``monitor.table()`` prints: the ms per step of
        both, the part of a starved step spent preparing data, and how many cores
        this process kept busy in each.

    Raises:
        KeyError: a phase the table does not have; the message names those it has.
    """
    rows = _phase_rows(monitor.table())
    for name in (starved, fed):
        if name not in rows:
            raise KeyError(
                f"no phase {name!r} in the monitor's table; it has {list(rows)}"
            )
    cpus = cpus or os.cpu_count() or 1
    loop_ms, ahead_ms = float(rows[starved][2]), float(rows[fed][2])
    cores = [float(rows[n][4]) * cpus / 100 for n in (starved, fed)]
    extra = loop_ms - ahead_ms
    share = f" ({extra / loop_ms:.0%})" if loop_ms > 0 else ""
    # Three lines of at most 88 columns, as every table a notebook prints.
    first = f"{starved}: {loop_ms:.1f} ms a step against {ahead_ms:.1f} ms {fed}:\n  "
    if extra > 0:
        first += (
            f"{extra:.1f} ms of each step{share} prepared data while the device waited"
        )
    else:
        first += "no step waited for data here"
    one = all(0.75 <= c <= 1.25 for c in cores)
    return (
        f"{first}\nthis process kept {cores[0]:.2f} and {cores[1]:.2f} of {cpus} cores "
        f"busy: about one core in both: {'yes' if one else 'no'}"
    )


def _spread(values: Iterable[float]) -> float:
    values = list(values)
    return max(values) - min(values)


def batch_verdicts(result: Any) -> str:
    """Three lines on :func:`compare_global_batch`'s runs, computed from the mean
    accuracies and the seeds' spread it prints (rounded as printed).

    1. N ranks at the same learning rate against 1 rank: behind or not.
    2. lr x N: the share of that gap it recovers (none when there is no gap).
    3. the warm-up against none: the difference of their means, against the
       larger spread (max - min) of their seeds: within it or beyond it.
    """
    one, same, warm, scaled = result.runs[:4]
    n = same.ranks
    a1, a_same = round(one.accuracy, 3), round(same.accuracy, 3)
    a_warm, a_scaled = round(warm.accuracy, 3), round(scaled.accuracy, 3)
    gap = a1 - a_same
    lines = [
        f"{n} ranks, same lr: {a_same:.3f} against 1 rank's {a1:.3f}: "
        f"{'behind' if gap > 0 else 'not behind'}"
    ]
    if gap > 0:
        lines.append(
            f"lr x {n}: {a_scaled:.3f}, recovers {(a_scaled - a_same) / gap:.0%} of "
            "that gap"
        )
    else:
        lines.append(f"lr x {n}: {a_scaled:.3f}; no gap to recover")
    spread = max(
        _spread(round(a, 2) for a in warm.accuracies),
        _spread(round(a, 2) for a in scaled.accuracies),
    )
    diff = a_warm - a_scaled
    lines.append(
        f"warm-up against none: {diff:+.3f}; the seeds spread over {spread:.2f}: "
        f"{'within' if abs(diff) <= spread else 'beyond'} the spread"
    )
    return "\n".join(lines)
