"""Why more devices are not always faster: measure a training step's cost and split
it into a fixed part and a part that grows with the batch.

A step costs ``fixed + per_sample * batch``. The fixed part (launching kernels,
Python, the optimizer, synchronisation) does not shrink when the batch is split across
devices; only the per-sample part does. A small model is almost all fixed cost, so
more devices barely help; a large model is almost all per-sample cost, so they do.

Used by notebook 01, section 7::

    timings = [time_steps(model, b, (1, 16, 16), 10) for b in (16, 64, 256)]
    cost = fit_step_cost(timings)
    speedups = projected_speedup(cost, global_batch=256, devices=[1, 2, 4, 8])
"""

from __future__ import annotations

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

    def fixed_share(self, batch_size: int) -> float:
        """Fraction of a step at ``batch_size`` that splitting cannot shrink."""
        return self.fixed_s / self.seconds(batch_size)


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
    """Least-squares fit of ``seconds = fixed + per_sample * batch`` to timings.

    Raises:
        ValueError: fewer than two distinct batch sizes.

    Example:
        >>> fit_step_cost([StepTiming(10, 0.02), StepTiming(20, 0.03)])
        StepCost(fixed_s=0.01, per_sample_s=0.001)
    """
    sizes = {t.batch_size for t in timings}
    if len(sizes) < 2:
        raise ValueError(
            f"fitting a step's cost needs timings at two or more batch sizes, got "
            f"{sorted(sizes)}; time e.g. batch sizes 16, 64 and 256"
        )
    n = len(timings)
    mean_b = sum(t.batch_size for t in timings) / n
    mean_s = sum(t.seconds_per_step for t in timings) / n
    cov = sum((t.batch_size - mean_b) * (t.seconds_per_step - mean_s) for t in timings)
    var = sum((t.batch_size - mean_b) ** 2 for t in timings)
    per_sample = max(cov / var, 0.0)
    fixed = max(mean_s - per_sample * mean_b, 0.0)
    return StepCost(round(fixed, 12), round(per_sample, 12))


def projected_speedup(
    cost: StepCost,
    global_batch: int,
    devices: Sequence[int],
    comm_s: float = 0.0,
) -> list[float]:
    """Speed-up of a step when ``global_batch`` is split across each device count.

    Every device pays the fixed cost; each computes ``global_batch / n`` samples; with
    more than one device a step also pays ``comm_s`` to combine the gradients.

    Example:
        >>> projected_speedup(StepCost(0.0, 0.001), 100, [1, 2, 4])
        [1.0, 2.0, 4.0]
    """
    one = cost.seconds(global_batch)
    return [
        one / (cost.seconds(global_batch / n) + (comm_s if n > 1 else 0.0))
        for n in devices
    ]
