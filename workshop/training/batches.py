"""Splitting a global batch among ranks.

Under DDP the global batch is ``per-rank batch x world_size``, so one that does not
divide by ``world_size`` must be rounded; TensorFlow's Estimator refused it outright
(W. Guan's SHARCNET slides, document 004 of the workshop's sources). Notebook 02,
section 6, prints the split with :func:`per_rank_batch`.
"""

from __future__ import annotations

from ..checks import whole

__all__ = ["per_rank_batch"]


def per_rank_batch(global_batch: int, world_size: int, *, exact: bool = True) -> int:
    """The batch each rank's loader should use so that the ranks make ``global_batch``.

    Args:
        global_batch: samples per optimizer step, over all ranks together.
        world_size: number of ranks.
        exact: refuse a global batch that does not divide by ``world_size``;
            False rounds the per-rank batch down (fewer samples per step).

    Returns:
        ``global_batch // world_size``.

    Raises:
        ValueError: a count below 1, more ranks than samples, or (with ``exact``)
            a global batch that does not divide (the nearest that do are named).

    Example:
        >>> per_rank_batch(256, 4)
        64
        >>> per_rank_batch(256, 6, exact=False)   # 6 x 42 = 252 samples per step
        42
    """
    example = "e.g. per_rank_batch(256, world_size=4)"
    global_batch = whole("global_batch", global_batch, fix=example)
    world_size = whole("world_size", world_size, fix=example)
    per_rank, left = divmod(global_batch, world_size)
    if per_rank == 0:
        raise ValueError(
            f"global_batch={global_batch} is smaller than world_size={world_size}: "
            "some ranks would get no sample; use fewer ranks or a larger batch"
        )
    if left and exact:
        below, above = per_rank * world_size, (per_rank + 1) * world_size
        raise ValueError(
            f"global_batch={global_batch} does not divide by world_size={world_size} "
            f"({left} left over); use a global batch of {below} or {above}, or pass "
            f"exact=False to train on {below} samples per step"
        )
    return per_rank
