"""The training loop: one code path for a notebook, DDP ranks and Slurm jobs.

Between notebook 01 (one device), notebook 02 (DDP ranks) and a Slurm job, the
model wrapper and the sampler change, never the loop. :func:`train_step` and
:func:`evaluate` (re-exported from :mod:`workshop.training.steps`) serve lessons
that write their own loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from ..checks import one_of, positive_number, whole
from .compiled import (
    check_compile,
    compile_model,
    graphs_compiled,
    inductor_unavailable,
)
from .progress import History, Progress
from .steps import (
    check_amp,
    check_bf16_gpu,
    evaluate,
    resolve_device,
    sum_over_ranks,
    train_step,
)

__all__ = ["LR_SCHEDULES", "OPTIMIZERS", "train"]

#: Values of ``optimizer``, with the learning rate each uses when ``lr`` is None.
OPTIMIZERS = {"sgd": 0.05, "adam": 1e-3}
#: Values of ``schedule``: how the learning rate changes over a run.
LR_SCHEDULES = ("cosine", "constant")


def _groups(loader: Iterable, size: int) -> Iterator[list[Any]]:
    """Batches of ``loader`` in lists of ``size``; the last list may be shorter."""
    group: list[Any] = []
    for batch in loader:
        group.append(batch)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


def _check_objects(model: Any, loader: Any, eval_loader: Any) -> None:
    """Refuse, before a step, a model or loader of the wrong kind, which would fail
    deep inside torch or only after the first epoch."""
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module, got {type(model).__name__}; e.g. "
            "train(SmallCNN(), loader)"
        )
    for name, value in (("loader", loader), ("eval_loader", eval_loader)):
        if not isinstance(value, Iterable) and (name == "loader" or value is not None):
            raise TypeError(
                f"{name} must give batches of (inputs, targets), got "
                f"{type(value).__name__}; e.g. make_loader(digits(), 64, shuffle=True)"
            )


def _optimizer(name: str, model: nn.Module, lr: float | None) -> torch.optim.Optimizer:
    one_of("optimizer", name, OPTIMIZERS)
    lr = OPTIMIZERS[name] if lr is None else lr
    positive_number("lr", lr, what="a learning rate", fix="e.g. lr=0.05")
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return torch.optim.Adam(model.parameters(), lr=lr)


def _lr_factor(schedule: str, step: int, total: int | None) -> float:
    """Multiplier of the base learning rate for optimizer step ``step`` (from 0)."""
    if schedule == "constant" or not total:
        return 1.0
    # Cosine decay from lr to almost 0 at the last step. With a constant rate the
    # last steps still jump around, and BatchNorm's running statistics lag behind
    # the weights: test accuracy of SmallCNN on digits then swings between 0.8 and
    # 0.95 from one epoch to the next; with the decay it ends near 0.99.
    return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))


def _planned_steps(
    schedule: str, epochs: int, steps_per_epoch: int | None, max_steps: int | None
) -> int | None:
    one_of("schedule", schedule, LR_SCHEDULES)
    planned = None if steps_per_epoch is None else epochs * steps_per_epoch
    if max_steps is not None:
        planned = max_steps if planned is None else min(planned, max_steps)
    if schedule == "cosine" and planned is None:
        raise ValueError(
            "schedule='cosine' needs to know how many steps the run takes, but the "
            "loader has no length; pass max_steps=..., or schedule='constant'"
        )
    return planned


def train(
    model: nn.Module,
    loader: Iterable,
    *,
    epochs: int = 1,
    lr: float | None = None,
    optimizer: str = "sgd",
    schedule: str = "cosine",
    device: str | torch.device | None = None,
    amp: str | None = None,
    accumulate: int = 1,
    channels_last: bool = False,
    eval_loader: Iterable | None = None,
    max_steps: int | None = None,
    progress: bool | Progress = True,
    seed: int | None = None,
    compile: bool | str = False,
) -> History:
    """Train a classifier with cross-entropy loss; the same loop on one device and
    on every rank of a DDP job (wrap the model and give the loader a
    ``DistributedSampler`` first: only rank 0 prints, the History holds the job's).

    Args:
        model: a module (plain or DDP-wrapped) mapping inputs to class scores.
        loader: batches of (inputs, targets).
        lr: learning rate; None takes the optimizer's default in :data:`OPTIMIZERS`
            (0.05 for SGD, 1e-3 for Adam).
        optimizer: "sgd" (with momentum 0.9) or "adam"; made anew at each call.
        schedule: "cosine" (decays from ``lr`` to near 0 over the run) or "constant".
        device: see :func:`resolve_device`.
        amp: None (float32), "bf16" (bfloat16 autocast, no scaler) or "fp16"
            (float16 autocast with a GradScaler; GPU only).
        accumulate: micro-batches per optimizer step (gradient accumulation).
        channels_last: train in the channels-last memory format; with DDP, convert
            the model before wrapping it, so the gradient buckets match its layout.
        eval_loader: if given, :func:`evaluate` on it after each epoch.
        max_steps: stop after this many optimizer steps in all, even mid-epoch.
        progress: True prints (rank 0 only), False not, or a configured
            :class:`workshop.training.progress.Progress`.
        seed: if given, ``torch.manual_seed(seed)`` first (dropout, augmentations;
            not the model's initial weights, drawn before ``train``).
        compile: True trains through ``torch.compile`` (inductor), or a backend's
            name ("aot_eager"); wrap a DDP model before. The History times the
            compiled steps apart
            (:meth:`~workshop.training.progress.History.compile_summary`).

    Returns:
        A :class:`workshop.training.progress.History`.

    Raises:
        ValueError: a bad argument ("fp16" on a CPU, counts below 1, an unknown
            name) or a loader that yields nothing.
        TypeError: a model, loader or switch of the wrong kind.
        RuntimeError: ``compile=True`` where inductor cannot compile
            (:func:`~workshop.training.compiled.inductor_unavailable` says why).

    Example:
        >>> torch.manual_seed(0)                                    # doctest: +SKIP
        >>> model = SmallCNN()                                      # doctest: +SKIP
        >>> history = train(model, make_loader(digits(), 64, shuffle=True),
        ...                 epochs=3, eval_loader=make_loader(digits("test"), 256,
        ...                 shuffle=False))                         # doctest: +SKIP
        >>> print(history.table())                                  # doctest: +SKIP
    """
    _check_objects(model, loader, eval_loader)
    whole("epochs", epochs)
    whole("accumulate", accumulate)
    if max_steps is not None:
        whole("max_steps", max_steps)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed={seed!r} must be a whole number, e.g. seed=0, or None")
    if not isinstance(channels_last, bool):
        raise TypeError(f"channels_last must be True or False, got {channels_last!r}")
    if not isinstance(progress, (bool, Progress)):
        raise TypeError(f"progress must be True, False or a Progress, got {progress!r}")
    backend = check_compile(compile)
    device = resolve_device(device)
    if backend == "inductor" and device.type == "cpu":
        # Found before the model moves or trains: inductor's own error comes at the
        # first step, pages long (CppCompileError, the whole compiler command).
        why = inductor_unavailable()
        if why:
            raise RuntimeError(f"compile={compile!r}: {why}")
    check_amp(amp, device)
    check_bf16_gpu(amp, device)
    if seed is not None:
        torch.manual_seed(seed)
    model.to(device)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    opt = _optimizer(optimizer, model, lr)
    # The compiled module shares the model's parameters; the optimizer steps them.
    stepped = compile_model(model, backend)
    scaler = torch.amp.GradScaler(device.type) if amp == "fp16" else None
    own = isinstance(progress, Progress)
    reporter = progress if own else Progress(enabled=None if progress else False)
    try:
        steps_per_epoch: int | None = math.ceil(len(loader) / accumulate)
    except TypeError:  # an iterable without a length
        steps_per_epoch = None
    planned = _planned_steps(schedule, epochs, steps_per_epoch, max_steps)
    base_lr = opt.param_groups[0]["lr"]
    reporter.start(epochs, steps_per_epoch)

    history = History()
    for epoch in range(epochs):
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            # A DistributedSampler shuffles by (seed, epoch): without this, every
            # epoch would visit the samples in the same order.
            sampler.set_epoch(epoch)
        model.train()
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        samples = 0
        start = time.perf_counter()
        for step, group in enumerate(_groups(loader, accumulate), start=1):
            lr_now = base_lr * _lr_factor(schedule, history.steps, planned)
            for param_group in opt.param_groups:
                param_group["lr"] = lr_now
            graphs = graphs_compiled() if backend else 0
            began = time.perf_counter()
            result = train_step(
                stepped, group, opt, amp=amp, scaler=scaler, channels_last=channels_last
            )
            if backend and graphs_compiled() > graphs:
                # This step compiled: its time is the warm-up's, not the steady
                # state's (its compute is a small part of it).
                history.compiled_steps.append(history.steps + 1)
                history.graphs += graphs_compiled() - graphs
                history.warmup_seconds += time.perf_counter() - began
                history.warmup_samples += result.samples
            loss_sum += result.loss_sum
            correct += result.correct
            samples += result.samples
            history.steps += 1
            if reporter.due():
                reporter.step(epoch + 1, step, loss_sum.item() / samples, samples)
            if max_steps is not None and history.steps >= max_steps:
                break
        if samples == 0:
            raise ValueError(
                f"the loader yielded no batches in epoch {epoch + 1}; is its dataset "
                "empty, or drop_last=True with fewer samples than one batch?"
            )
        # Reading the sums waits for the GPU to finish the epoch, so the clock is
        # read after it; summing over ranks gives every rank the job's figures.
        loss_total, correct_total, samples_total = sum_over_ranks(
            [loss_sum, correct, samples], device
        )
        seconds = time.perf_counter() - start
        history.loss.append(loss_total / samples_total)
        history.accuracy.append(correct_total / samples_total)
        history.seconds.append(seconds)
        history.samples_per_second.append(samples_total / seconds)
        if eval_loader is not None:
            history.eval_accuracy.append(evaluate(model, eval_loader, device))
        reporter.epoch_end(
            epoch + 1,
            history.loss[-1],
            history.accuracy[-1],
            history.final_eval_accuracy,
            history.samples_per_second[-1],
            seconds,
        )
        if max_steps is not None and history.steps >= max_steps:
            break
    return history
