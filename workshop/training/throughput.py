"""Why more devices are not always faster: measure a training step's cost and split
it into a fixed part and a part that grows with the batch.

A step costs ``fixed + per_sample * batch``; splitting the batch across devices
shrinks only the per-sample part, so a small model (almost all fixed cost: kernel
launches, Python, the optimizer) barely speeds up.

Used by notebook 01, section 7::

    timings = [time_steps(model, b, (1, 16, 16), 10) for b in (16, 64, 256)]
    cost = fit_step_cost(timings)
    speedups = projected_speedup(cost, global_batch=256, devices=[1, 2, 4, 8])
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["StepCost", "StepTiming", "fit_step_cost", "projected_speedup", "time_steps"]


@dataclass(frozen=True)
class StepTiming:
    """Measured cost of one training step at one batch size."""

    batch_size: int
    seconds_per_step: float

    @property
    def samples_per_second(self) -> float:
        return self.batch_size / self.seconds_per_step


@dataclass(frozen=True)
class StepCost:
    """``seconds_per_step = fixed_s + per_sample_s * batch_size``, fitted."""

    fixed_s: float
    per_sample_s: float

    def seconds(self, batch_size: float) -> float:
        """Predicted seconds for one step at ``batch_size``."""
        return self.fixed_s + self.per_sample_s * batch_size

    def fixed_share(self, batch_size: float) -> float:
        """Fraction of a step at ``batch_size`` that splitting cannot shrink."""
        return self.fixed_s / self.seconds(batch_size)

    def speedup_limit(self, batch_size: float) -> float:
        """The speed-up no number of devices can beat when ``batch_size`` is split
        between them (Amdahl's law); ``math.inf`` without a fixed cost.

        Example:
            >>> StepCost(0.01, 0.001).speedup_limit(30)
            4.0
            >>> StepCost(0.0, 0.001).speedup_limit(30)
            inf
        """
        if self.fixed_s <= 0:
            return math.inf
        return self.seconds(batch_size) / self.fixed_s


def time_steps(
    model,
    batch_size: int,
    input_shape: Sequence[int],
    num_classes: int,
    device=None,
    *,
    steps: int = 5,
    warmup: int = 2,
    seed: int = 0,
) -> StepTiming:
    """Time full training steps (forward, backward, SGD step) on random inputs.

    Args:
        model: the model, already on ``device``.
        batch_size: samples per step.
        input_shape: one sample's shape, e.g. ``(3, 224, 224)``.
        num_classes: classes of the model's output.
        device: where the inputs go; the model's device when omitted.
        steps: timed steps (the median is kept).
        warmup: untimed steps first (allocation, kernel selection).
        seed: seed of the random inputs.

    Returns:
        A :class:`StepTiming`.
    """
    import torch

    device = device or next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn((batch_size, *input_shape), generator=generator).to(device)
    y = torch.randint(0, num_classes, (batch_size,), generator=generator).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    cuda = device.type == "cuda" if hasattr(device, "type") else False

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    seconds = []
    for i in range(warmup + steps):
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize(device)  # GPU work is asynchronous: wait for it
        if i >= warmup:
            seconds.append(time.perf_counter() - t0)
    seconds.sort()
    return StepTiming(batch_size, seconds[len(seconds) // 2])


def fit_step_cost(timings: Sequence[StepTiming]) -> StepCost:
    """Fit ``seconds = fixed + per_sample * batch`` to timings, robustly.

    Made for a busy machine: repeats at one batch size count as their median, and
    the line is fitted to relative errors (weights 1 / seconds²), since noise grows
    with a step's length and would otherwise push the fixed cost below zero. Both
    costs are kept >= 0; the fixed cost may be 0 (check before dividing by it).

    Args:
        timings: steps timed at two or more batch sizes, e.g. by :func:`time_steps`.

    Returns:
        The fitted :class:`StepCost`, both parts >= 0.

    Raises:
        ValueError: fewer than two distinct batch sizes, or a timing that is not
            a positive number of seconds.

    Example:
        >>> fit_step_cost([StepTiming(10, 0.02), StepTiming(20, 0.03)])
        StepCost(fixed_s=0.01, per_sample_s=0.001)
    """
    for t in timings:
        usable = t.batch_size > 0 and 0 < t.seconds_per_step < math.inf
        if not usable:
            raise ValueError(
                f"{t} cannot be fitted: a timing needs a batch size above 0 and a "
                "positive, finite number of seconds per step; time the step again "
                "with time_steps"
            )
    by_size: dict[int, list[float]] = {}
    for t in timings:
        by_size.setdefault(t.batch_size, []).append(t.seconds_per_step)
    if len(by_size) < 2:
        raise ValueError(
            f"fitting a step's cost needs timings at two or more batch sizes, got "
            f"{sorted(by_size)}; time e.g. batch sizes 16, 64 and 256"
        )
    points = [(b, statistics.median(s)) for b, s in sorted(by_size.items())]
    # Weighted sums of the normal equations, weight 1 / seconds^2.
    w = [1 / s**2 for _, s in points]
    sw = sum(w)
    sx = sum(wi * b for wi, (b, _) in zip(w, points, strict=True))
    sy = sum(wi * s for wi, (_, s) in zip(w, points, strict=True))
    sxx = sum(wi * b * b for wi, (b, _) in zip(w, points, strict=True))
    sxy = sum(wi * b * s for wi, (b, s) in zip(w, points, strict=True))
    per_sample = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    best = ((sy - per_sample * sx) / sw, per_sample)  # the best line, unconstrained
    candidates = [best] if min(best) >= 0 else []
    candidates += [
        (0.0, sxy / sxx),  # no fixed cost: the best line through the origin
        (sy / sw, 0.0),  # no per-sample cost: the best flat line
    ]

    def misfit(cost: tuple[float, float]) -> float:
        return sum(
            wi * (s - cost[0] - cost[1] * b) ** 2
            for wi, (b, s) in zip(w, points, strict=True)
        )

    fixed, per_sample = min(candidates, key=misfit)
    return StepCost(round(fixed, 12), round(per_sample, 12))


def projected_speedup(
    cost: StepCost,
    global_batch: int,
    devices: Sequence[int],
    comm_s: float = 0.0,
) -> list[float]:
    """Speed-up of a step when ``global_batch`` is split across each device count
    (each pays the fixed cost, and ``comm_s`` with more than one device).

    Example:
        >>> projected_speedup(StepCost(0.0, 0.001), 100, [1, 2, 4])
        [1.0, 2.0, 4.0]
    """
    one = cost.seconds(global_batch)
    return [
        one / (cost.seconds(global_batch / n) + (comm_s if n > 1 else 0.0))
        for n in devices
    ]
