"""The training loop: one code path for a notebook, DDP ranks and Slurm jobs.

Notebook 01 calls :func:`train` on one device; notebook 02 wraps the same model in
``DistributedDataParallel``, gives the loader a ``DistributedSampler`` and calls the
same :func:`train` on every rank; a Slurm job runs that script under ``srun``. What
changes between them is the model wrapper and the sampler, never the loop::

    history = train(SmallCNN(), make_loader(digits(), 64, shuffle=True), epochs=3)

:func:`train_step` is the loop's building block (one optimizer step over one or more
micro-batches), for lessons that write their own loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .env import visible_gpu_count
from .progress import History, Progress

__all__ = [
    "AMP_MODES",
    "OPTIMIZERS",
    "SCHEDULES",
    "StepResult",
    "evaluate",
    "resolve_device",
    "train",
    "train_step",
]

#: Values of ``amp``: None (float32), "bf16" or "fp16" autocast.
AMP_MODES = (None, "bf16", "fp16")
#: Values of ``optimizer``, with the learning rate each uses when ``lr`` is None.
OPTIMIZERS = {"sgd": 0.05, "adam": 1e-3}
#: Values of ``schedule``: how the learning rate changes over a run.
SCHEDULES = ("cosine", "constant")

_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class StepResult:
    """What one :func:`train_step` did, as tensors on the training device.

    Tensors, not floats, so a loop can add them up at every step without making the
    CPU wait for the GPU; ``.item()`` them when a number is needed.

    Attributes:
        loss_sum: the step's training loss summed over its samples.
        correct: samples classified right.
        samples: samples in the step (all micro-batches).
    """

    loss_sum: torch.Tensor
    correct: torch.Tensor
    samples: int

    @property
    def loss(self) -> float:
        """Mean loss per sample (waits for the GPU)."""
        return self.loss_sum.item() / self.samples


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """The device to train on.

    None picks, in order: this rank's device when ``torch.distributed`` is
    initialised (its own GPU under NCCL, the CPU under gloo, see
    :func:`workshop.worker.rank_device`), else the current CUDA GPU if there is one,
    else the CPU.

    Args:
        device: a device, a name such as "cuda:1" or "cpu", or None.

    Returns:
        A ``torch.device``.

    Raises:
        ValueError: a CUDA device was asked for where no GPU is visible.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    import torch.distributed as dist

    if device is not None:
        chosen = torch.device(device)
        if chosen.type == "cuda" and visible_gpu_count() == 0:
            raise ValueError(
                f"device={str(chosen)!r} but no CUDA GPU is visible here; pass "
                "device='cpu', or device=None to pick what is there"
            )
        return chosen
    if dist.is_available() and dist.is_initialized():
        from .worker import rank_device

        return rank_device(dist.get_backend())
    # NVML's count, not torch.cuda.is_available(): looking must not start the CUDA
    # driver, or a notebook kernel could no longer fork ranks.
    return torch.device("cuda" if visible_gpu_count() > 0 else "cpu")


def _check_amp(amp: str | None, device: torch.device) -> None:
    """Cheap checks of ``amp``, made at every step."""
    if amp not in AMP_MODES:
        raise ValueError(
            f"amp={amp!r} is not known; pass amp=None (float32), amp='bf16' or "
            "amp='fp16'"
        )
    if amp == "fp16" and device.type != "cuda":
        raise ValueError(
            f"amp='fp16' autocast needs a GPU, but this run is on device="
            f"{str(device)!r}, where float16 autocast is not generally supported; "
            "pass amp='bf16' (bfloat16 autocast works on CPUs) or amp=None"
        )


def _check_bf16_gpu(amp: str | None, device: torch.device) -> None:
    """bf16 on a GPU without bfloat16 units: refused once, before training."""
    if amp != "bf16" or device.type != "cuda":
        return
    # Compute capability 8 is Ampere. torch.cuda.is_bf16_supported() says True on
    # a V100 too, which runs bfloat16 in software, slower than float32: that defeats
    # the point of amp.
    if torch.cuda.get_device_capability(device)[0] < 8:
        raise ValueError(
            f"amp='bf16' but {torch.cuda.get_device_name(device)} has no bfloat16 "
            "units (NVIDIA GPUs before Ampere emulate it, slower than float32); "
            "pass amp='fp16', which train pairs with a GradScaler"
        )


def _to_device(
    tensor: torch.Tensor, device: torch.device, channels_last: bool
) -> torch.Tensor:
    # non_blocking: from pinned memory the copy runs while the GPU is busy; from
    # ordinary memory it is the same as a blocking copy.
    tensor = tensor.to(device, non_blocking=True)
    if channels_last and tensor.dim() == 4:
        tensor = tensor.contiguous(memory_format=torch.channels_last)
    return tensor


def train_step(
    model: nn.Module,
    micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    *,
    amp: str | None = None,
    scaler: torch.amp.GradScaler | None = None,
    channels_last: bool = False,
) -> StepResult:
    """One optimizer step over one or more micro-batches (gradient accumulation).

    Each micro-batch's mean loss is weighted by its share of the step's samples
    before ``backward``, so the accumulated gradient is that of one batch holding
    all of them: ``loss / k`` for k micro-batches of equal size. (Only for a model
    without BatchNorm, or in eval mode: BatchNorm normalises each micro-batch by its
    own statistics.) In a model wrapped in ``DistributedDataParallel``, all but the
    last micro-batch run under ``no_sync()``, so gradients cross the network once
    per step, not once per micro-batch.

    Args:
        model: the model (plain or DDP-wrapped), already on its device; its mode
            (train or eval) is left as it is.
        micro_batches: (inputs, targets) pairs; one pair for plain training.
        optimizer: steps the model's parameters.
        amp: None, "bf16" or "fp16" autocast for the forward pass.
        scaler: a ``torch.amp.GradScaler``; required with "fp16", whose small
            gradients would otherwise underflow to zero.
        channels_last: convert 4-D inputs to the channels-last memory format.

    Returns:
        A :class:`StepResult` (loss sum, correct count, samples).

    Raises:
        ValueError: no micro-batches, an unknown ``amp``, or "fp16" without scaler.

    Example:
        >>> model = SmallCNN()                                      # doctest: +SKIP
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.05)      # doctest: +SKIP
        >>> for batch in loader:                                    # doctest: +SKIP
        ...     train_step(model, [batch], opt)
    """
    if not micro_batches:
        raise ValueError("micro_batches is empty; pass a list of (inputs, targets)")
    device = next(model.parameters()).device
    _check_amp(amp, device)
    if amp == "fp16" and scaler is None:
        raise ValueError(
            "amp='fp16' needs a GradScaler, or small gradients underflow to zero; "
            "pass scaler=torch.amp.GradScaler('cuda')"
        )
    dtype = _AMP_DTYPES.get(amp)  # None: float32, autocast off
    total = sum(len(targets) for _, targets in micro_batches)
    # DDP and FSDP models have no_sync(); a plain model does not need it.
    no_sync = getattr(model, "no_sync", None)

    optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    for i, (inputs, targets) in enumerate(micro_batches):
        inputs = _to_device(inputs, device, channels_last)
        targets = targets.to(device, non_blocking=True)
        last = i == len(micro_batches) - 1
        with no_sync() if no_sync is not None and not last else nullcontext():
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                logits = model(inputs)
                loss = F.cross_entropy(logits, targets)
            share = loss * (len(targets) / total)
            (scaler.scale(share) if scaler is not None else share).backward()
        loss_sum += loss.detach().float() * len(targets)
        correct += (logits.detach().argmax(dim=1) == targets).sum()
    if scaler is not None:
        scaler.step(optimizer)  # skips the step if gradients overflowed
        scaler.update()
    else:
        optimizer.step()
    return StepResult(loss_sum=loss_sum, correct=correct, samples=total)


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _sum_over_ranks(values: list[torch.Tensor | float], device: torch.device) -> list:
    """Sum numbers over all ranks (one all_reduce); unchanged outside a job."""
    totals = torch.stack(
        [torch.as_tensor(v, device=device).to(torch.float64) for v in values]
    )
    if _distributed():
        import torch.distributed as dist

        dist.all_reduce(totals)
    return totals.tolist()


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable,
    device: str | torch.device | None = None,
) -> float:
    """Accuracy of ``model`` on the (inputs, targets) batches of ``loader``.

    Runs in eval mode (BatchNorm uses its running statistics) and restores the mode
    the model was in. Under ``torch.distributed`` the counts are summed over ranks,
    so every rank must call it (and gets the whole job's accuracy).

    Args:
        model: the model, plain or DDP-wrapped.
        loader: batches of (inputs, targets).
        device: see :func:`resolve_device`; the model is moved there.

    Returns:
        The fraction of samples classified right, 0..1.

    Raises:
        ValueError: the loader yielded no samples.

    Example:
        >>> test = make_loader(digits("test"), 256, shuffle=False)  # doctest: +SKIP
        >>> evaluate(model, test)                                   # doctest: +SKIP
        0.9861
    """
    device = resolve_device(device)
    model.to(device)
    was_training = model.training
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=device)
    samples = 0
    try:
        for inputs, targets in loader:
            logits = model(inputs.to(device, non_blocking=True))
            correct += (logits.argmax(dim=1) == targets.to(device)).sum()
            samples += len(targets)
    finally:
        model.train(was_training)
    correct_total, samples_total = _sum_over_ranks([correct, samples], device)
    if samples_total == 0:
        raise ValueError("the loader yielded no samples to evaluate on")
    return correct_total / samples_total


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


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a whole number, 1 or more")


def _optimizer(name: str, model: nn.Module, lr: float | None) -> torch.optim.Optimizer:
    if name not in OPTIMIZERS:
        raise ValueError(
            f"optimizer={name!r} is not known; pass one of "
            + ", ".join(repr(n) for n in OPTIMIZERS)
        )
    lr = OPTIMIZERS[name] if lr is None else lr
    if not lr > 0:
        raise ValueError(f"lr={lr!r} must be a positive learning rate, e.g. 0.05")
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
    if schedule not in SCHEDULES:
        raise ValueError(
            f"schedule={schedule!r} is not known; pass one of "
            + ", ".join(repr(n) for n in SCHEDULES)
        )
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
) -> History:
    """Train a classifier with cross-entropy loss; the same loop on one device and
    on every rank of a DDP job.

    The model is moved to ``device`` (in place) and trained there. For DDP, wrap it
    (on its device) before calling, give the loader a ``DistributedSampler`` and call
    ``train`` on every rank: the sampler is reseeded each epoch
    (``set_epoch``), only rank 0 prints, and the History holds the whole job's
    figures.

    Args:
        model: a module (plain or DDP-wrapped) mapping inputs to class scores.
        loader: batches of (inputs, targets), e.g. from
            :func:`workshop.data.make_loader`.
        epochs: passes over the data.
        lr: learning rate; None takes the optimizer's default in :data:`OPTIMIZERS`
            (0.05 for SGD, 1e-3 for Adam).
        optimizer: "sgd" (with momentum 0.9) or "adam"; made anew at each call.
        schedule: "cosine" (the learning rate decays from ``lr`` to near 0 over the
            run: ``epochs`` passes, or ``max_steps`` if that ends it sooner) or
            "constant".
        device: see :func:`resolve_device`; None picks the rank's device, else a
            GPU if there is one, else the CPU.
        amp: None (float32), "bf16" (bfloat16 autocast, no scaler needed: it has
            float32's range) or "fp16" (float16 autocast with a GradScaler; GPU only).
        accumulate: micro-batches per optimizer step (gradient accumulation): the
            effective batch is ``accumulate`` times the loader's.
        channels_last: train with the channels-last memory format (faster
            convolutions on GPUs with tensor cores). With DDP, convert the model
            (``model.to(memory_format=torch.channels_last)``) before wrapping it,
            so DDP's gradient buckets match the weights' layout.
        eval_loader: if given, :func:`evaluate` on it after each epoch.
        max_steps: stop after this many optimizer steps in all, even mid-epoch.
        progress: True prints progress lines (rank 0 only), False prints nothing,
            or a :class:`workshop.progress.Progress` configured as you like.
        seed: if given, ``torch.manual_seed(seed)`` first, for dropout and random
            augmentations. The model's initial weights are drawn before ``train``:
            seed those yourself; the shuffling is seeded by ``make_loader``.

    Returns:
        A :class:`workshop.progress.History`.

    Raises:
        ValueError: a bad argument (unknown ``amp``, ``optimizer``, ``schedule``;
            "fp16" on a CPU; counts below 1) or a loader that yields nothing; the
            message says what to pass.

    Example:
        >>> torch.manual_seed(0)                                    # doctest: +SKIP
        >>> model = SmallCNN()                                      # doctest: +SKIP
        >>> history = train(model, make_loader(digits(), 64, shuffle=True),
        ...                 epochs=3, eval_loader=make_loader(digits("test"), 256,
        ...                 shuffle=False))                         # doctest: +SKIP
        >>> print(history.table())                                  # doctest: +SKIP
    """
    _positive("epochs", epochs)
    _positive("accumulate", accumulate)
    if max_steps is not None:
        _positive("max_steps", max_steps)
    device = resolve_device(device)
    _check_amp(amp, device)
    _check_bf16_gpu(amp, device)
    if seed is not None:
        torch.manual_seed(seed)
    model.to(device)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    opt = _optimizer(optimizer, model, lr)
    scaler = torch.amp.GradScaler(device.type) if amp == "fp16" else None
    if isinstance(progress, Progress):
        reporter = progress
    else:
        reporter = Progress(enabled=None if progress else False)
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
            for param_group in opt.param_groups:
                param_group["lr"] = base_lr * _lr_factor(
                    schedule, history.steps, planned
                )
            result = train_step(
                model, group, opt, amp=amp, scaler=scaler, channels_last=channels_last
            )
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
        loss_total, correct_total, samples_total = _sum_over_ranks(
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
