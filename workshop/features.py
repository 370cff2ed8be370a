"""What the installed torch can do, found by trying it, not by reading its version.

The workshop runs on torch 2.4 to 2.15, and on a cluster's own torch module. Some
collectives exist in one release's gloo and not in another's: gloo learned
``all_to_all`` (the list form) only in 2026, so torch 2.11's gloo answers "Backend
gloo does not support alltoall". A lesson asks :func:`has_collective` first, and
where the answer is no, shows the same idea another way and says why.

The question is put to a one-rank gloo group in a forked child, so the asking
process (a notebook kernel) never runs gloo's threads itself and stays safe to fork
ranks from. One question costs about 20 ms, and each answer is kept.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ._procs import answer_in_child

__all__ = ["COLLECTIVES", "has_collective", "torch_release"]

_YES, _NO, _BROKEN = 0, 3, 4


def torch_release(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of the installed torch, or of ``version``.

    For the few differences that cannot be found by trying (a deadlock, a log line
    printed before an error). Example: ``torch_release("2.4.1+cu121") == (2, 4)``.
    """
    if version is None:
        import torch

        version = torch.__version__
    major, minor = version.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def _one_rank_calls() -> dict[str, Callable]:
    """For each collective, a call of it on a one-rank gloo backend object."""
    import torch

    def t() -> torch.Tensor:
        return torch.ones(1)

    return {
        "broadcast": lambda pg: pg.broadcast([t()]),
        "all_reduce": lambda pg: pg.allreduce([t()]),
        "reduce": lambda pg: pg.reduce([t()]),
        "all_gather": lambda pg: pg.allgather([[t()]], [t()]),
        "gather": lambda pg: pg.gather([[t()]], [t()]),
        "scatter": lambda pg: pg.scatter([t()], [[t()]]),
        "reduce_scatter": lambda pg: pg.reduce_scatter([t()], [[t()]]),
        "all_to_all": lambda pg: pg.alltoall([t()], [t()]),
        "all_to_all_single": lambda pg: pg.alltoall_base(t(), t(), [], []),
    }


#: The collectives :func:`has_collective` knows how to ask about.
COLLECTIVES = (
    "broadcast",
    "all_reduce",
    "reduce",
    "all_gather",
    "gather",
    "scatter",
    "reduce_scatter",
    "all_to_all",
    "all_to_all_single",
)

_ANSWERS: dict[str, bool] = {}


def _ask_gloo(name: str) -> int:
    """In this (forked) process: run ``name`` on a one-rank gloo group."""
    from datetime import timedelta

    import torch.distributed as dist

    try:
        group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=10))
        _one_rank_calls()[name](group).wait()
    except RuntimeError as exc:
        return _NO if "does not support" in str(exc) else _BROKEN
    except Exception:
        return _BROKEN
    return _YES


def _answer_in_child(name: str, timeout: float = 20.0) -> int:
    answer = answer_in_child(lambda: _ask_gloo(name), timeout, failed=_BROKEN)
    return _BROKEN if answer is None else answer


def has_collective(name: str, backend: str = "gloo") -> bool:
    """Whether ``backend`` in the installed torch runs the collective ``name``.

    Args:
        name: a ``torch.distributed`` collective, one of :data:`COLLECTIVES`.
        backend: "gloo" (the backend of CPU tensors, also inside an NCCL group) or
            "nccl" (which runs every collective listed).

    Returns:
        True when the collective runs. gloo is asked for real, on a private
        one-rank group in a forked child; where that cannot be done (no fork, or
        the question itself fails) the answer is True, and the lesson's own call
        will say what is wrong.

    Raises:
        ValueError: an unknown collective or backend.

    Example:
        >>> has_collective("all_reduce")
        True
    """
    if name not in COLLECTIVES:
        raise ValueError(
            f"unknown collective {name!r}; ask about one of " + ", ".join(COLLECTIVES)
        )
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend={backend!r}: ask about 'gloo' or 'nccl'")
    if backend == "nccl":
        return True
    if name not in _ANSWERS:
        if not hasattr(os, "fork"):
            return True
        _ANSWERS[name] = _answer_in_child(name) != _NO
    return _ANSWERS[name]


def fsdp2_fully_shard() -> tuple[Callable | None, str]:
    """FSDP2's ``fully_shard`` and where it was found, or None and why not."""
    import torch

    try:  # public from torch 2.6
        from torch.distributed.fsdp import fully_shard

        return fully_shard, "torch.distributed.fsdp.fully_shard"
    except ImportError:
        pass
    try:  # torch 2.4 and 2.5
        from torch.distributed._composable.fsdp import fully_shard

        return fully_shard, "torch.distributed._composable.fsdp.fully_shard"
    except ImportError as exc:
        return None, (
            f"torch {torch.__version__} has no FSDP2 fully_shard ({exc}); it came "
            "with torch 2.4 (as torch.distributed._composable.fsdp) and is public "
            "from 2.6: install torch 2.4 or later"
        )
