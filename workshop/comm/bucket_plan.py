"""How many gradient buckets DistributedDataParallel makes, planned and counted.

:func:`plan_buckets` does DDP's arithmetic on plain byte counts;
:func:`~workshop.comm.ddp_buckets.count_ddp_buckets` counts the buckets a real DDP
all-reduces inside a rank. Notebook 02, section "Inside DDP", prints both::

    plan_buckets(gradient_bytes(model))            # DDP's defaults: 1 MiB, then 25 MiB
    count_ddp_buckets(model, inputs)               # inside a rank: DDP's own buckets
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from ..checks import positive_number, whole

__all__ = ["DEFAULT_BUCKET_CAP_MB", "first_bucket_mb", "gradient_bytes", "plan_buckets"]

#: DDP's ``bucket_cap_mb`` when none is given (mebibytes, as DDP counts them).
DEFAULT_BUCKET_CAP_MB = 25.0
_MIB = 1024 * 1024


def first_bucket_mb() -> float:
    """DDP's cap on its first bucket, in MiB, as the installed torch sets it.

    Returns:
        ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`` in MiB (1.0 on torch 2.4
        to 2.15), or 1.0 where torch.distributed is not built in.

    Example:
        >>> first_bucket_mb()
        1.0
    """
    import torch.distributed as dist

    return getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", _MIB) / _MIB


def gradient_bytes(model: nn.Module) -> list[int]:
    """Bytes of each gradient DDP will bucket, in the order backward produces them:
    the reverse of ``model.parameters()`` (DDP's guess before the first step, and the
    order it then sees for a chain of layers). Frozen parameters are left out; a shared
    one counts once.

    Args:
        model: any module, wrapped in DDP or not.

    Returns:
        One byte count per trainable parameter, last layer first.

    Raises:
        ValueError: the model has no trainable parameter.

    Example:
        >>> gradient_bytes(nn.Linear(4, 2))          # bias (2 floats), then weight
        [8, 32]
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(
            f"{type(model).__name__} has no trainable parameter, so DDP has no "
            "gradient to bucket; pass a model with requires_grad parameters"
        )
    return [p.numel() * p.element_size() for p in reversed(params)]


def _positive_mb(name: str, value: object) -> int:
    mib = positive_number(name, value, what="a number of MiB", fix="e.g. 25")
    return int(mib * _MIB)


def plan_buckets(
    sizes: Sequence[int],
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
    first_cap_mb: float | None = None,
) -> list[int]:
    """Cut gradients into buckets the way DDP does, and return each bucket's bytes.

    Each gradient joins the open bucket, which closes once it holds at least its cap.
    The first bucket closes at ``first_cap_mb``, so that the last layers' gradients go
    on the wire early; every later one at ``bucket_cap_mb``. (DDP also splits by dtype
    and device; give one dtype's sizes.)

    Args:
        sizes: bytes of each gradient, in the order backward produces them
            (:func:`gradient_bytes`).
        bucket_cap_mb: the cap of every bucket after the first, in MiB (DDP's).
        first_cap_mb: None: :func:`first_bucket_mb`, which DDP uses when
            ``bucket_cap_mb`` is left at its default. Recent torch gives the first
            bucket ``bucket_cap_mb`` too when you set it; pass it here to plan that.

    Returns:
        The bytes of each bucket, in the order DDP all-reduces them.

    Raises:
        ValueError: no sizes, a size that is not a whole number above 0, or a cap
            that is not a number above 0.

    Example:
        >>> plan_buckets([3 * 2**20, 2**20, 20 * 2**20, 10 * 2**20])
        [3145728, 32505856]
        >>> plan_buckets([3 * 2**20, 2**20, 20 * 2**20, 10 * 2**20], first_cap_mb=25)
        [35651584]
    """
    cap = _positive_mb("bucket_cap_mb", bucket_cap_mb)
    first = _positive_mb(
        "first_cap_mb", first_bucket_mb() if first_cap_mb is None else first_cap_mb
    )
    sizes = list(sizes)
    if not sizes:
        raise ValueError("no gradient sizes given; pass gradient_bytes(model)")
    for i, size in enumerate(sizes):
        whole(f"sizes[{i}]", size, fix="see gradient_bytes(model)")
    buckets: list[int] = []
    filling = 0
    for size in sizes:
        filling += size
        if filling >= (first if not buckets else cap):
            buckets.append(filling)
            filling = 0
    if filling:
        buckets.append(filling)
    return buckets
