"""One optimizer step and one evaluation: the building blocks of the training loop.

For lessons that write their own loop (notebook 02's resumable loop);
:func:`workshop.training.loop.train` is the loop built from them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..env import visible_gpu_count

__all__ = ["AMP_MODES", "StepResult", "evaluate", "resolve_device", "train_step"]

#: Values of ``amp``: None (float32), "bf16" or "fp16" autocast.
AMP_MODES = (None, "bf16", "fp16")

_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class StepResult:
    """What one :func:`train_step` did, as tensors on the training device (so a loop
    adds them up without making the CPU wait for the GPU).

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
    """The device to train on; None picks this rank's device inside a job
    (:func:`workshop.env.rank_device`), else a GPU if there is one, else the CPU.

    Args:
        device: a device, a name such as "cuda:1" or "cpu", or None.

    Returns:
        A ``torch.device``.

    Raises:
        ValueError: not a device, or a CUDA device where no GPU is visible.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    import torch.distributed as dist

    if device is not None:
        try:
            chosen = torch.device(device)
        except (RuntimeError, TypeError):  # torch lists twenty device types
            raise ValueError(
                f"device={device!r} is not a device; pass 'cpu', 'cuda', 'cuda:1', "
                "or None to pick what is there"
            ) from None
        if chosen.type == "cuda" and visible_gpu_count() == 0:
            raise ValueError(
                f"device={str(chosen)!r} but no CUDA GPU is visible here; pass "
                "device='cpu', or device=None to pick what is there"
            )
        return chosen
    if dist.is_available() and dist.is_initialized():
        from ..env import rank_device

        return rank_device(dist.get_backend())
    # NVML's count, not torch.cuda.is_available(): looking must not start the CUDA
    # driver, or a notebook kernel could no longer fork ranks.
    return torch.device("cuda" if visible_gpu_count() > 0 else "cpu")


def check_amp(amp: str | None, device: torch.device) -> None:
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


def check_bf16_gpu(amp: str | None, device: torch.device) -> None:
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

    Each micro-batch's loss is weighted by its share of the step's samples, so the
    gradient is that of one batch holding all of them (BatchNorm aside). Under DDP
    all but the last run under ``no_sync()``: gradients cross the network once.

    Args:
        model: the model (plain or DDP-wrapped), on its device; its mode is kept.
        micro_batches: (inputs, targets) pairs; one pair for plain training.
        optimizer: steps the model's parameters.
        amp: None, "bf16" or "fp16" autocast for the forward pass.
        scaler: a ``torch.amp.GradScaler``; required with "fp16".
        channels_last: convert 4-D inputs to the channels-last memory format.

    Returns:
        A :class:`StepResult` (loss sum, correct count, samples).

    Raises:
        ValueError: no micro-batches, an unknown ``amp``, or "fp16" without scaler.
        TypeError: micro-batches that are not (inputs, targets) pairs, or an
            optimizer that is not one.

    Example:
        >>> model = SmallCNN()                                      # doctest: +SKIP
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.05)      # doctest: +SKIP
        >>> for batch in loader:                                    # doctest: +SKIP
        ...     train_step(model, [batch], opt)
    """
    if isinstance(micro_batches, torch.Tensor) or not all(
        isinstance(pair, (tuple, list)) and len(pair) == 2 for pair in micro_batches
    ):  # (inputs, targets) itself, without the list around it, for one
        raise TypeError(
            "micro_batches must be a list of (inputs, targets) pairs; for one batch "
            "pass [(inputs, targets)]"
        )
    if not micro_batches:
        raise ValueError("micro_batches is empty; pass a list of (inputs, targets)")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim optimizer, got {optimizer!r}; e.g. "
            "torch.optim.SGD(model.parameters(), lr=0.05)"
        )
    device = next(model.parameters()).device
    check_amp(amp, device)
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


def sum_over_ranks(values: list[torch.Tensor | float], device: torch.device) -> list:
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
    """Accuracy of ``model`` on the (inputs, targets) batches of ``loader``, in eval
    mode (then restored). In a job every rank must call it: counts are summed.

    Args:
        model: the model, plain or DDP-wrapped.
        loader: batches of (inputs, targets).
        device: see :func:`resolve_device`; the model is moved there.

    Returns:
        The fraction of samples classified right, 0..1.

    Raises:
        ValueError: the loader yielded no samples.
        TypeError: a loader that gives no batches (None, a number).

    Example:
        >>> test = make_loader(digits("test"), 256, shuffle=False)  # doctest: +SKIP
        >>> evaluate(model, test)                                   # doctest: +SKIP
        0.9861
    """
    if not isinstance(loader, Iterable):
        raise TypeError(
            f"loader must give batches of (inputs, targets), got "
            f"{type(loader).__name__}; e.g. make_loader(digits('test'), 256, "
            "shuffle=False)"
        )
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
    correct_total, samples_total = sum_over_ranks([correct, samples], device)
    if samples_total == 0:
        raise ValueError("the loader yielded no samples to evaluate on")
    return correct_total / samples_total
