"""Large global batches: more ranks, fewer steps, and the learning rate.

Used by notebook 03 ("Large global batches"). With DDP every rank keeps its batch, so
N ranks make a global batch N times larger and an epoch N times fewer optimizer steps.
After the same epochs the model has taken fewer steps and is less trained, unless the
learning rate grows with the batch: the *linear scaling rule* (lr x N), usually with a
short *warm-up* that ramps the learning rate up from the 1-rank value over the first
steps (Goyal et al., 2017, arXiv:1706.02677).

:func:`compare_global_batch` measures it for real, with notebook 02's SmallCNN on the
digits and ranks started by :func:`workshop.launch`. Runs this short vary from seed
to seed, so each setting is trained with a few seeds and the table gives their mean::

    result = compare_global_batch(world_size=4)
    print(result.table())
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from ..checks import positive_number, whole, whole_list

__all__ = [
    "BatchRun",
    "LargeBatchResult",
    "compare_global_batch",
    "large_batch_worker",
    "warmup_factor",
]


def warmup_factor(step: int, warmup_steps: int, scale: float) -> float:
    """The learning rate's factor at ``step`` for a gradual warm-up to ``lr x scale``.

    Starts at ``1 / scale`` (the unscaled learning rate) and grows linearly to 1 (the
    scaled one) at ``warmup_steps``, as Goyal et al. warm up; 1 throughout without
    warm-up. Pass it to ``torch.optim.lr_scheduler.LambdaLR``.

    Args:
        step: optimizer steps taken so far (``LambdaLR`` counts from 0).
        warmup_steps: steps to reach the scaled rate; 0 for no warm-up.
        scale: how many times the 1-rank rate the scaled rate is (N for N ranks).

    Returns:
        The factor ``LambdaLR`` multiplies the optimizer's (scaled) rate by.

    Raises:
        ValueError: ``scale`` below 1 (a warm-up ramps up, never down).

    Example:
        >>> [round(warmup_factor(s, 3, 4.0), 2) for s in range(5)]
        [0.25, 0.5, 0.75, 1.0, 1.0]
    """
    if not scale >= 1:  # also refuses NaN
        raise ValueError(
            f"scale={scale!r} must be 1 or more: the scaled rate over the 1-rank "
            "one, e.g. 4.0 for 4 ranks"
        )
    if warmup_steps <= 0 or step >= warmup_steps:
        return 1.0
    start = 1.0 / scale
    return start + (1.0 - start) * step / warmup_steps


def large_batch_worker(
    settings: Sequence[tuple[float, int, float]],
    per_rank_batch: int,
    epochs: int,
    seeds: Sequence[int],
) -> list[tuple[int, list[float]]]:
    """Train SmallCNN on the digits once per setting and seed; run on every rank.

    Args:
        settings: (learning rate, warm-up steps, warm-up scale) per setting.
        per_rank_batch: samples per rank per step.
        epochs: passes over the training digits.
        seeds: one training run per seed (weights and sample order).

    Returns:
        For each setting: (optimizer steps per run, test accuracy of each seed).

    Example:
        >>> launch(large_batch_worker, [(0.05, 0, 1.0)], 32, 1, [0],
        ...        world_size=4).returns[0]                     # doctest: +SKIP
        [(12, [0.169...])]
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data.distributed import DistributedSampler

    from ..env import rank_device
    from ..training.data import digits
    from ..training.loaders import make_loader
    from ..training.models import SmallCNN
    from ..training.steps import evaluate, train_step

    device = rank_device(dist.get_backend())
    train_set, test_set = digits("train"), digits("test")
    test_loader = make_loader(test_set, 360, shuffle=False)
    out = []
    for lr, warmup_steps, scale in settings:
        accuracies, steps = [], 0
        for seed in seeds:
            torch.manual_seed(seed)  # the same first weights on every rank
            model = SmallCNN().to(device)
            ddp = DDP(
                model, device_ids=[device.index] if device.type == "cuda" else None
            )
            optimizer = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
            schedule = torch.optim.lr_scheduler.LambdaLR(
                optimizer,
                partial(warmup_factor, warmup_steps=warmup_steps, scale=scale),
            )
            sampler = DistributedSampler(train_set, seed=seed)
            loader = make_loader(
                train_set, per_rank_batch, shuffle=False, sampler=sampler
            )
            steps = 0
            for epoch in range(epochs):
                sampler.set_epoch(epoch)
                for batch in loader:
                    train_step(ddp, [batch], optimizer)
                    schedule.step()
                    steps += 1
            # Every rank tests on all 360 digits; evaluate sums the counts over the
            # ranks, numerator and denominator alike, so this is the accuracy.
            accuracies.append(evaluate(ddp, test_loader))
        out.append((steps, accuracies))
    return out


@dataclass(frozen=True)
class BatchRun:
    """One setting of :func:`compare_global_batch`, trained with each seed.

    Attributes:
        ranks: number of ranks.
        per_rank_batch: samples per rank per step.
        lr: the learning rate after warm-up.
        warmup_steps: steps of linear warm-up (0: none).
        steps: optimizer steps per run.
        accuracies: test accuracy of each seed's run, 0..1.
    """

    ranks: int
    per_rank_batch: int
    lr: float
    warmup_steps: int
    steps: int
    accuracies: tuple[float, ...]

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step, all ranks together."""
        return self.ranks * self.per_rank_batch

    @property
    def accuracy(self) -> float:
        """The mean test accuracy over the seeds."""
        return statistics.fmean(self.accuracies)


@dataclass(frozen=True)
class LargeBatchResult:
    """What :func:`compare_global_batch` measured: one :class:`BatchRun` per setting.

    ``runs`` are, in order: 1 rank; N ranks at the same learning rate; N ranks with
    it scaled by N and warmed up; N ranks scaled by N without warm-up.
    """

    runs: tuple[BatchRun, ...]
    epochs: int
    seeds: tuple[int, ...]
    backend: str

    def table(self) -> str:
        """The runs as a table, lines at most 88 characters long."""
        import textwrap

        n = self.runs[-1].ranks
        names = (
            "1 rank",
            f"{n} ranks, same lr",
            f"{n} ranks, lr x {n}, warm-up",
            f"{n} ranks, lr x {n}",
        )
        wide = max(25, *(len(name) + 1 for name in names))  # 128 ranks, lr x 128
        lines = [
            f"{'setting':<{wide}}{'ranks':>5}{'batch':>7}{'lr':>6}{'warm-up':>8}"
            f"{'steps':>6}{'accuracy':>9}  each seed"
        ]
        for name, run in zip(names, self.runs, strict=False):
            seeds = " ".join(f"{a:.2f}" for a in run.accuracies)
            line = (
                f"{name:<{wide}}{run.ranks:>5}{run.global_batch:>7}{run.lr:>6.3g}"
                f"{run.warmup_steps:>8}{run.steps:>6}{run.accuracy:>9.3f}"
            )
            # Many seeds go on lines of their own, under the setting, at 88 columns.
            if len(line) + 2 + len(seeds) <= 88:
                lines.append(f"{line}  {seeds}")
            else:
                lines += [line, *textwrap.wrap(seeds, 88, initial_indent="    ",
                                               subsequent_indent="    ")]  # fmt: skip
        note = (
            f"batch: samples per step, all ranks together. SmallCNN on the digits, "
            f"{self.epochs} epoch(s), SGD with momentum 0.9, backend {self.backend}; "
            f"accuracy on the 360 test digits, mean over seeds {list(self.seeds)}."
        )
        return "\n".join([*lines, *textwrap.wrap(note, 88)])


def compare_global_batch(
    world_size: int = 4,
    per_rank_batch: int = 32,
    lr: float = 0.05,
    epochs: int = 1,
    warmup_steps: int = 3,
    seeds: Sequence[int] = (0, 1, 2),
    timeout: float = 300.0,
) -> LargeBatchResult:
    """Train on 1 rank and on ``world_size`` ranks at the same batch per rank.

    Four settings, each trained once per seed, tested on the held-out digits: 1 rank
    at ``lr``; ``world_size`` ranks at ``lr`` (the global batch ``world_size`` times
    larger, so ``world_size`` times fewer steps); ``world_size`` ranks at ``lr x
    world_size`` warmed up over ``warmup_steps``; and the same without warm-up. Two
    launches (1 rank, then ``world_size`` ranks, every setting in turn).

    Args:
        world_size: ranks of the large-batch runs, 2 or more.
        per_rank_batch: samples per rank per step.
        lr: the 1-rank learning rate (notebook 03's script uses 0.05).
        epochs: passes over the training digits, the same for every run.
        warmup_steps: steps of linear warm-up for the scaled learning rate.
        seeds: the seeds each setting is trained with (at least one).
        timeout: seconds each launch may take.

    Returns:
        A :class:`LargeBatchResult`; ``.table()`` prints it.

    Raises:
        ValueError: a count below its least value, a learning rate that is not a
            number above 0, or no seeds.
        LaunchError: a rank failed or ``timeout`` passed (from ``launch``).

    Example:
        >>> print(compare_global_batch(world_size=4).table())    # doctest: +SKIP
    """
    from ..ranks.launcher import launch

    example = "e.g. compare_global_batch(world_size=4, per_rank_batch=32, epochs=1)"
    whole("world_size", world_size, 2, fix=example)
    whole("per_rank_batch", per_rank_batch, 1, fix=example)
    whole("epochs", epochs, 1, fix=example)
    whole("warmup_steps", warmup_steps, 0, fix=example)
    positive_number("lr", lr, fix="e.g. lr=0.05")
    seeds = tuple(whole_list("seeds", seeds, 0, fix="e.g. seeds=(0, 1, 2)"))
    n = world_size
    one = launch(
        large_batch_worker, [(lr, 0, 1.0)], per_rank_batch, epochs, seeds,
        world_size=1, show="none", timeout=timeout,
    )  # fmt: skip
    many = launch(
        large_batch_worker,
        [(lr, 0, 1.0), (lr * n, warmup_steps, float(n)), (lr * n, 0, float(n))],
        per_rank_batch, epochs, seeds, world_size=n, show="none", timeout=timeout,
    )  # fmt: skip
    settings = [(1, lr, 0), (n, lr, 0), (n, lr * n, warmup_steps), (n, lr * n, 0)]
    measured = one.returns[0] + many.returns[0]
    runs = tuple(
        BatchRun(ranks, per_rank_batch, rate, warm, steps, tuple(accuracies))
        for (ranks, rate, warm), (steps, accuracies) in zip(
            settings, measured, strict=True
        )
    )
    return LargeBatchResult(runs, epochs, seeds, many.backend)
