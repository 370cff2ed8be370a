"""What mixed precision changes, measured: the memory autograd keeps for the backward
pass, and the time of a step.

Notebook 01, section 5, measures :func:`saved_activation_bytes` with and without
``amp="bf16"``, and shows what a gradient scaler is for with :func:`float_format`
and :func:`low_precision_loss`::

    (low_precision_loss(w, 1e-8) * 2.0**16).backward()   # w.grad / 2**16: 1e-8
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any

__all__ = [
    "RELATIVE_TOLERANCE",
    "autocast",
    "float_format",
    "low_precision_loss",
    "saved_activation_bytes",
]

_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
#: Differences allowed between a split run (a model cut across devices) and the whole
#: one, relative to the largest number compared (at least 1): a split adds the same
#: float32 numbers in another order (about 1e-7 relative), so not bit for bit.
RELATIVE_TOLERANCE = 1e-5


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
    """Bytes of the tensors autograd keeps from ``model(x)`` for the backward pass
    (under autocast, most in 16 bits), each distinct tensor once.

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


def float_format(dtype: Any) -> dict[str, Any]:
    """How a floating-point type splits its bits, and the range that follows.

    Args:
        dtype: a floating-point ``torch.dtype`` (``torch.float16``, ...).

    Returns:
        ``name`` ("float16"), ``bits``, ``exponent_bits``, ``fraction_bits``,
        ``max`` (largest finite value), ``smallest_normal`` and
        ``smallest_subnormal`` (the smallest value above 0; anything below half of
        it rounds to 0), all from ``torch.finfo``.

    Raises:
        ValueError: ``dtype`` is not a floating-point torch dtype.

    Example:
        >>> import torch
        >>> float_format(torch.float16)["smallest_subnormal"] == 2.0**-24
        True
    """
    import torch

    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(
            f"float_format needs a floating-point torch dtype, got {dtype!r}; pass "
            "e.g. torch.float16, torch.bfloat16 or torch.float32"
        )
    info = torch.finfo(dtype)
    fraction = round(-math.log2(info.eps))  # eps = 2**-fraction_bits
    return {
        "name": str(dtype).removeprefix("torch."),
        "bits": info.bits,
        "exponent_bits": info.bits - 1 - fraction,  # one bit for the sign
        "fraction_bits": fraction,
        "max": info.max,
        "smallest_normal": info.tiny,
        # Subnormals spend the fraction bits below the smallest normal.
        "smallest_subnormal": info.tiny * info.eps,
    }


def low_precision_loss(weights: Any, gradient: float, dtype: Any = None) -> Any:
    """A float32 loss whose backward pass runs in ``dtype`` and gives every weight
    the gradient ``gradient``.

    One layer's worth of mixed precision, without autocast (the same on every
    device): ``sum(w.to(dtype) * a) * b`` with ``a = b = sqrt(gradient)``; backward
    multiplies ``b`` (times any loss scale) by ``a`` in ``dtype``, where a small
    float16 gradient rounds to 0 and a large one overflows to inf.

    Args:
        weights: a float32 tensor with ``requires_grad``, on any device.
        gradient: the gradient each weight should get, above 0; ``sqrt(gradient)``
            must be a normal number of ``dtype``.
        dtype: ``torch.float16`` (the default) or ``torch.bfloat16``.

    Returns:
        A float32 scalar: call ``.backward()`` on it, or on it times a loss scale.

    Raises:
        ValueError: ``weights`` not a float32 tensor that requires grad, another
            ``dtype``, or a ``gradient`` out of range.

    Example:
        >>> import torch
        >>> w = torch.zeros(3, requires_grad=True)
        >>> low_precision_loss(w, 1e-8).backward()
        >>> w.grad      # 1e-8 is below float16's smallest value
        tensor([0., 0., 0.])
    """
    import torch

    dtype = torch.float16 if dtype is None else dtype
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(
            f"dtype={dtype!r}; pass torch.float16 or torch.bfloat16, the 16-bit "
            "types of mixed precision"
        )
    if (
        not isinstance(weights, torch.Tensor)
        or weights.dtype != torch.float32
        or not weights.requires_grad
    ):
        raise ValueError(
            "weights must be a float32 tensor with requires_grad=True, got "
            f"{type(weights).__name__} {getattr(weights, 'dtype', '')}; pass e.g. "
            "torch.zeros(4, requires_grad=True)"
        )
    info = torch.finfo(dtype)
    low, high = info.tiny**2, info.max**2
    if not isinstance(gradient, (int, float)) or not low <= gradient <= high:
        raise ValueError(
            f"gradient={gradient!r} is out of range for {dtype}: pass a number from "
            f"{low:.3g} to {high:.3g}, so that its square root is a normal "
            f"{str(dtype).removeprefix('torch.')} number"
        )
    factor = math.sqrt(gradient)
    a = torch.full_like(weights, factor, dtype=dtype)
    return (weights.to(dtype) * a).float().sum() * factor
