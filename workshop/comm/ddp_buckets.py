"""What DistributedDataParallel does inside a step, recorded from a real run.

DDP groups the gradients into *buckets* (about ``bucket_cap_mb`` each, last layer
first, as backward produces them) and starts one all-reduce per bucket as soon as it is
ready, while backward goes on. These run inside DDP's C++ reducer, where
``launch(..., trace=True)`` cannot see them, so this module listens through DDP's
public door: a *communication hook* that does DDP's default all-reduce and notes when
each bucket was handed over, when it finished and its bytes (optionally compressing it
to bfloat16 or float16 first). Notebook 02, section "Inside DDP"::

    run = timed_ddp_steps(ddp, batches, optimizer)      # inside every rank
    draw_rank_timeline(*ddp_timeline(result.returns))   # in the notebook
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import one_of, whole
from .bucket_plan import _positive_mb

__all__ = [
    "BucketRecord",
    "DDPSteps",
    "count_ddp_buckets",
    "ddp_timeline",
    "timed_ddp_steps",
    "watch_buckets",
]

_WIRE_DTYPES = {None: None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class BucketRecord:
    """One bucket's all-reduce in one step on one rank (times from ``time.time()``)."""

    rank: int
    step: int
    bucket: int
    parameters: int  # how many parameter tensors the bucket holds
    elements: int
    bytes: int  # bytes this rank handed to the all-reduce (after compression)
    dtype: str
    start: float  # the bucket was ready: DDP called the hook
    # Its all-reduce finished, as the host saw it. On CPU ranks (gloo) that is when
    # the data arrived; with NCCL it is when the GPU work was handed over and
    # ordered on the stream, so on GPUs the bars show when buckets were launched
    # rather than how long the transfer ran on the device.
    end: float = 0.0


@dataclass
class _HookState:
    rank: int
    world_size: int
    wire_dtype: torch.dtype | None
    step: int = 0
    records: list[BucketRecord] = field(default_factory=list)


# No annotations: DDP inspects a hook's annotations and rejects anything but the
# real classes, and this module's are strings (from __future__ import annotations).
def _recording_hook(state, bucket):
    import torch.distributed as dist

    grads = bucket.buffer()
    # Like DDP's default hook, divide before summing, so the result is the mean.
    wire = grads if state.wire_dtype is None else grads.to(state.wire_dtype)
    wire.div_(state.world_size)
    record = BucketRecord(
        rank=state.rank,
        step=state.step,
        bucket=bucket.index(),
        parameters=len(bucket.parameters()),
        elements=wire.numel(),
        bytes=wire.numel() * wire.element_size(),
        dtype=str(wire.dtype).removeprefix("torch."),
        start=time.time(),
    )
    state.records.append(record)
    future = dist.all_reduce(wire, async_op=True).get_future()

    def finished(done: torch.futures.Future) -> torch.Tensor:
        record.end = time.time()
        reduced = done.value()[0]
        if reduced.dtype != grads.dtype:  # decompress into DDP's own buffer
            grads.copy_(reduced)
            return grads
        return reduced

    return future.then(finished)


def watch_buckets(model: nn.Module, compress: str | None = None) -> list[BucketRecord]:
    """Record every bucket all-reduce of a DDP model from now on.

    Registers a communication hook (once per model; DDP allows one) that does DDP's
    averaging all-reduce and appends a :class:`BucketRecord` per bucket per step.

    Args:
        model: a ``DistributedDataParallel`` model, before its first step.
        compress: None (float32, as they are), "bf16" or "fp16": 2-byte floats on the
            wire, half the bytes at the cost of gradient precision.

    Returns:
        The list that fills with the records as training runs; ``records[i].step`` is
        advanced by :func:`timed_ddp_steps` (0 if you drive the steps yourself).

    Raises:
        TypeError: the model is not wrapped in ``DistributedDataParallel``.
        ValueError: an unknown ``compress``.

    Example:
        >>> records = watch_buckets(ddp_model)                      # doctest: +SKIP
    """
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        raise TypeError(
            f"watch_buckets needs a DistributedDataParallel model, got "
            f"{type(model).__name__}; wrap it first: DistributedDataParallel(model)"
        )
    if compress not in _WIRE_DTYPES:
        raise ValueError(f"compress={compress!r} is not one of None, 'bf16', 'fp16'")
    import torch.distributed as dist

    state = _HookState(dist.get_rank(), dist.get_world_size(), _WIRE_DTYPES[compress])
    model.register_comm_hook(state, _recording_hook)
    model._workshop_bucket_state = state  # so timed_ddp_steps can number the steps
    return state.records


@dataclass
class DDPSteps:
    """What :func:`timed_ddp_steps` saw on one rank: plain data, for drawing.

    ``phases`` are ``(rank, name, start, end)`` tuples (forward, backward, optimizer);
    ``buckets`` the bucket all-reduces; ``step_seconds`` each step's wall time.
    """

    rank: int
    phases: list[tuple[int, str, float, float]]
    buckets: list[BucketRecord]
    step_seconds: list[float]

    @property
    def buckets_per_step(self) -> int:
        """How many all-reduces one step started (from the last step recorded)."""
        last = max((b.step for b in self.buckets), default=0)
        return sum(1 for b in self.buckets if b.step == last)

    @property
    def bytes_per_step(self) -> int:
        """Bytes this rank handed to all-reduces in one step (the last recorded)."""
        last = max((b.step for b in self.buckets), default=0)
        return sum(b.bytes for b in self.buckets if b.step == last)

    @property
    def median_step(self) -> float:
        """Median seconds per step."""
        return statistics.median(self.step_seconds)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready plain data."""
        out = asdict(self)
        out["phases"] = [list(p) for p in self.phases]
        return out


def timed_ddp_steps(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    *,
    amp: str | None = None,
    compress: str | None = None,
    accumulate: int = 1,
) -> DDPSteps:
    """Train a DDP model on ``batches`` and record each phase and bucket in time.

    The clock (``time.time()``, as the hook's, so the bars line up) is read between
    forward, backward and the optimizer step. With ``accumulate`` > 1, the first
    micro-batches of a step run under ``no_sync()``: their backward starts no
    all-reduce.

    Args:
        model: a ``DistributedDataParallel`` model on this rank's device; its buckets
            are watched (:func:`watch_buckets`) unless they already are.
        batches: (inputs, targets) pairs; ``accumulate`` of them per step.
        optimizer: the optimizer over ``model.parameters()``.
        amp: None or "bf16": autocast the forward pass to bfloat16.
        compress: see :func:`watch_buckets` (only when not watched yet).
        accumulate: micro-batches per optimizer step.

    Returns:
        A :class:`DDPSteps` for this rank.

    Raises:
        TypeError: the model is not a ``DistributedDataParallel``.
        ValueError: an unknown ``amp`` or ``compress``, ``accumulate`` < 1, or fewer
            batches than one step needs.

    Example:
        >>> run = timed_ddp_steps(ddp, batches, optimizer)      # doctest: +SKIP
    """
    one_of("amp", amp, (None, "bf16"))
    whole("accumulate", accumulate)
    state = getattr(model, "_workshop_bucket_state", None)
    if state is None:
        watch_buckets(model, compress)
        state = model._workshop_bucket_state
    batches = list(batches)
    if len(batches) < accumulate:
        raise ValueError(
            f"got {len(batches)} batches but one step needs accumulate={accumulate}; "
            "pass more batches"
        )
    device = next(model.parameters()).device
    phases: list[tuple[int, str, float, float]] = []
    step_seconds: list[float] = []
    first_record = len(state.records)
    for first in range(0, len(batches) - accumulate + 1, accumulate):
        state.step += 1
        t_step = time.time()
        optimizer.zero_grad(set_to_none=True)
        for i, (inputs, targets) in enumerate(batches[first : first + accumulate]):
            inputs, targets = inputs.to(device), targets.to(device)
            last = i == accumulate - 1
            # no_sync: this backward only accumulates locally; the last one syncs.
            with nullcontext() if last else model.no_sync():
                t0 = time.time()
                with torch.autocast(
                    device.type, dtype=torch.bfloat16, enabled=amp == "bf16"
                ):
                    loss = F.cross_entropy(model(inputs), targets) / accumulate
                t1 = time.time()
                loss.backward()  # returns once every bucket's all-reduce is done
                _synchronize(device)
                t2 = time.time()
            phases += [
                (state.rank, "forward", t0, t1),
                (state.rank, "backward", t1, t2),
            ]
        optimizer.step()
        _synchronize(device)
        t3 = time.time()
        phases.append((state.rank, "optimizer", t2, t3))
        step_seconds.append(t3 - t_step)
    return DDPSteps(
        state.rank, phases, list(state.records[first_record:]), step_seconds
    )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ddp_timeline(
    runs: Sequence[DDPSteps], steps: Sequence[int] | None = None
) -> tuple[list[list[dict[str, Any]]], list[tuple[int, str, float, float]]]:
    """Every rank's :class:`DDPSteps` as what ``draw_rank_timeline`` takes.

    Args:
        runs: one :class:`DDPSteps` per rank, index = rank (``RunResult.returns``).
        steps: optimizer steps to show (1-based); default the last, whose buckets
            are those DDP settled on after step 1.

    Returns:
        ``(events_by_rank, phases)``: bucket all-reduces labelled "bucket i" and the
        compute phases of those steps.

    Raises:
        ValueError: no runs, or none of the chosen steps was recorded.

    Example:
        >>> draw_rank_timeline(*ddp_timeline(result.returns))   # doctest: +SKIP
    """
    if not runs:
        raise ValueError("no runs given; pass result.returns of a launch")
    recorded = sorted({b.step for r in runs for b in r.buckets})
    if steps is None:
        steps = recorded[-1:] if recorded else []
    wanted = set(steps)
    if not wanted & set(recorded):
        raise ValueError(
            f"steps {sorted(wanted)} were not recorded; recorded: {recorded}"
        )
    events = [
        [
            {"rank": b.rank, "op": "all_reduce", "label": f"bucket {b.bucket}"}
            | {"start": b.start, "end": b.end, "blocking": True}
            for b in r.buckets
            if b.step in wanted
        ]
        for r in runs
    ]
    phases = [
        phase
        for r in runs
        for step, step_phases in enumerate(_phases_by_step(r.phases), start=1)
        if step in wanted
        for phase in step_phases
    ]
    return events, phases


def _phases_by_step(
    phases: list[tuple[int, str, float, float]],
) -> list[list[tuple[int, str, float, float]]]:
    steps: list[list[tuple[int, str, float, float]]] = [[]]
    for p in phases:
        steps[-1].append(p)
        if p[1] == "optimizer":
            steps.append([])
    return [s for s in steps if s]


def count_ddp_buckets(
    model: nn.Module,
    inputs: torch.Tensor,
    bucket_cap_mb: float | None = None,
    steps: int = 2,
) -> list[int]:
    """Wrap ``model`` in a real DDP on this rank and count the buckets it all-reduces.

    Runs ``steps`` forward and backward passes with a recording hook: step 1 has one
    bucket of everything, then DDP rebuilds its buckets in the order the gradients came,
    so the last step shows those DDP keeps. Call it inside a rank; one is enough.

    Args:
        model: the model, on this rank's device; it is wrapped, not copied.
        inputs: one batch for the model.
        bucket_cap_mb: DDP's ``bucket_cap_mb``; None leaves DDP's default (and its
            1 MiB first bucket).
        steps: forward and backward passes, at least 2.

    Returns:
        The bytes of each bucket of the last step, in the order DDP sent them.

    Raises:
        RuntimeError: no process group (call it inside a rank).
        ValueError: ``steps`` below 2 or not whole, or a ``bucket_cap_mb`` that is
            not a number above 0.

    Example:
        >>> count_ddp_buckets(workshop.resnet("resnet50"),        # doctest: +SKIP
        ...                   torch.randn(2, 3, 64, 64))
        [8196000, 31502336, 26255360, 26550272, 9724160]
    """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    whole("steps", steps, least=2, fix="DDP settles its buckets after step 1")
    if bucket_cap_mb is not None:
        _positive_mb("bucket_cap_mb", bucket_cap_mb)
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "count_ddp_buckets needs a process group; run it inside a rank, e.g. "
            "workshop.launch(fn, world_size=1)"
        )
    device = next(model.parameters()).device
    options = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    gpu = [device.index] if device.type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=gpu, **options)
    records = watch_buckets(ddp)
    state = ddp._workshop_bucket_state
    inputs = inputs.to(device)
    for step in range(1, steps + 1):
        state.step = step
        ddp.zero_grad(set_to_none=True)
        ddp(inputs).float().sum().backward()
    return [r.bytes for r in records if r.step == steps]
