"""What mixed precision changes, measured: the memory autograd keeps for the backward
pass, and the time of a step.

Used by notebook 01, section 5::

    fp32 = saved_activation_bytes(model, x)
    bf16 = saved_activation_bytes(model, x, amp="bf16")
"""

from __future__ import annotations

from contextlib import nullcontext

__all__ = ["autocast", "saved_activation_bytes"]

_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def autocast(amp: str | None, device_type: str):
    """The autocast context for ``amp`` ("bf16", "fp16" or None for float32)."""
    import torch

    if amp is None:
        return nullcontext()
    if amp not in _DTYPES:
        raise ValueError(
            f"amp={amp!r} is not known; pass amp=None (float32), amp='bf16' or "
            "amp='fp16'"
        )
    return torch.autocast(device_type, dtype=getattr(torch, _DTYPES[amp]))


def saved_activation_bytes(model, x, amp: str | None = None) -> int:
    """Bytes of the tensors autograd keeps from ``model(x)`` for the backward pass.

    Activations, not weights, fill a GPU's memory during training; under autocast
    most of them are kept in 16 bits instead of 32. Each distinct tensor is counted
    once, whatever the number of operations that keep it.

    Args:
        model: the model (its parameters may stay in float32: autocast casts copies).
        x: a batch on the model's device.
        amp: None, "bf16" or "fp16".

    Returns:
        The bytes kept for backward.

    Example:
        >>> saved_activation_bytes(model, x, amp="bf16")   # doctest: +SKIP
        1572864
    """
    import torch

    seen: set[tuple[int, int, int]] = set()
    total = 0

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        key = (
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tensor.numel(),
        )
        if key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
        return tensor

    hooks = torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t)
    with hooks, autocast(amp, x.device.type):
        model(x)
    return total
