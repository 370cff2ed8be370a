"""A pipeline whose stages are ranks: GPipe and 1F1B over real sends and receives.

Each rank keeps one stage and runs the order
:mod:`~workshop.parallel.pipeline_schedules` gives it, checks its gradients against
the unsplit model and times every step, so a notebook can draw the bubble::

    result = workshop.launch(run_pipeline, "1f1b", micro_batches=8, world_size=4)
    events = [e for r in result.returns for e in r["events"]]
    draw_timeline(events, "1F1B, 4 stages, 8 micro-batches")
    idle_fraction([r["events"] for r in result.returns])["overall"]
"""

from __future__ import annotations

import copy
import time
from typing import Any

from ..checks import message, whole
from ..env import group_place, rank_device

# A stage's gradients against the unsplit model's: cutting the batch changes the
# order in which float32 sums are taken, which moves the last bits only (about 1e-8
# here), well within RELATIVE_TOLERANCE.
from ..training.precision import RELATIVE_TOLERANCE
from .pipeline_schedules import schedule_order

__all__ = ["run_pipeline"]


def run_pipeline(
    schedule: str = "gpipe",
    micro_batches: int = 4,
    batch: int = 32,
    width: int = 64,
    seed: int = 0,
    stage_seconds: float = 0.0,
) -> dict[str, Any]:
    """One training step of a model cut into ``world_size`` stages, one per rank.

    Every rank builds the same model from ``seed`` (``world_size`` blocks of
    Linear(width, width) + Tanh, then Linear(width, 1)), keeps block ``rank`` and
    runs ``schedule`` over ``micro_batches`` pieces of a seeded batch; activations
    go to ``rank + 1`` and their gradients back by ``isend``/``recv``. Each piece's
    loss is divided by ``micro_batches``, so the gradients add up to the full
    batch's. Times are ``perf_counter()`` from a shared barrier: compare them across
    ranks to a few milliseconds. ``stage_seconds`` stands in for a bigger stage
    (each forward sleeps that long, each backward twice): on fewer cores than ranks
    real compute would hide the bubble, and sleeping ranks share no core.

    Args:
        schedule: "gpipe" (all forwards, then all backwards) or "1f1b".
        micro_batches: pieces the batch is cut into, dividing ``batch``.
        batch, width: samples in the batch; features of every hidden layer.
        seed: seeds the model, the inputs and the targets (the same on every rank).
        stage_seconds: seconds added to each forward (twice to each backward).

    Returns:
        A dict of plain data: ``rank``, ``world_size``, ``schedule``,
        ``micro_batches``; ``order`` (this rank's [phase, micro-batch] pairs as run);
        ``events`` (``device``, ``phase``, ``micro_batch``, ``start``, ``end`` per
        forward and backward, for ``draw_timeline``); ``peak_stored`` (the most
        micro-batches' activations held at once); ``loss`` (last rank; else None)
        and ``reference_loss`` (the unsplit model's); ``max_abs_grad_diff`` (this
        stage's gradients against the unsplit model's), ``max_abs_grad`` and
        ``tolerance`` (``RELATIVE_TOLERANCE`` x max(1, max_abs_grad)).

    Raises:
        ValueError: an unknown schedule, a count below 1, ``batch`` not divisible
            by ``micro_batches``, a negative ``stage_seconds`` or one rank alone.
        RuntimeError: called outside a rank (no process group).

    Example:
        >>> r = workshop.launch(run_pipeline, "1f1b", 8, world_size=2)  # doctest: +SKIP
        >>> [x["peak_stored"] for x in r.returns]  # doctest: +SKIP
        [2, 1]
    """
    _check_settings(schedule, micro_batches, batch, width, stage_seconds)
    import torch.distributed as dist

    rank, world_size = group_place("run_pipeline")
    if world_size < 2:
        raise ValueError(
            f"a pipeline needs 2 or more stages, one per rank, but world_size="
            f"{world_size}; launch it with world_size=2 or more"
        )
    order = schedule_order(schedule, rank, world_size, micro_batches)
    device = rank_device()
    full, x, target = _model_and_data(world_size, batch, width, seed)
    stage = _stage(full, rank, world_size).to(device)
    reference_loss, reference = _reference(full, x, target, device, rank)

    run = _Run(stage, rank, world_size, device, micro_batches, stage_seconds)
    xs = x.to(device).chunk(micro_batches)
    targets = target.to(device).chunk(micro_batches)
    _warm_up_autograd()
    # Every rank leaves the barrier at about the same moment: the common zero of the
    # ranks' clocks (the only alignment they get).
    dist.barrier()
    run.zero = time.perf_counter()
    for phase, k in order:
        if phase == "forward":
            run.forward(k, xs[k], targets[k])
        else:
            run.backward(k)
    # Keep every send's work until it is done: its tensor must live until it has
    # gone, and with gloo a receive was seen to hang when the work of a send still
    # on its way was dropped.
    for work in run.sends:
        work.wait()

    diff, largest = 0.0, 0.0
    for name, param in stage.named_parameters():
        want = reference[name]
        largest = max(largest, float(want.abs().max()))
        diff = max(diff, float((param.grad.detach().cpu() - want).abs().max()))
    return {
        "rank": rank,
        "world_size": world_size,
        "schedule": schedule.lower(),
        "micro_batches": micro_batches,
        "order": [[phase, k] for phase, k in order],
        "events": run.events,
        "peak_stored": run.peak,
        "loss": sum(run.losses) if rank == world_size - 1 else None,
        "reference_loss": reference_loss,
        "max_abs_grad_diff": diff,
        "max_abs_grad": largest,
        "tolerance": RELATIVE_TOLERANCE * max(1.0, largest),
    }


class _Run:
    """One rank's stage, its messages, its clock and its count of stored work."""

    def __init__(
        self,
        stage: Any,
        rank: int,
        world_size: int,
        device: Any,
        micro_batches: int,
        stage_seconds: float,
    ) -> None:
        self.stage, self.rank, self.device = stage, rank, device
        self.first, self.last = rank == 0, rank == world_size - 1
        self.micro_batches, self.stage_seconds = micro_batches, stage_seconds
        self.zero = 0.0
        self.saved: dict[int, tuple[Any, Any]] = {}  # micro-batch: (input, output)
        self.peak = 0
        self.sends: list[Any] = []
        self.events: list[dict[str, Any]] = []
        self.losses: list[float] = []

    def forward(self, k: int, x: Any, target: Any) -> None:
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F

        if self.first:
            inp = x
        else:
            # Every hidden activation has the input's shape: (batch / m, width).
            inp = torch.empty_like(x)
            dist.recv(inp, src=self.rank - 1)
            # A leaf that wants its gradient: what goes back to the previous rank.
            inp.requires_grad_(True)
        start = self._now()
        out = self.stage(inp)
        if self.last:
            out = F.mse_loss(out, target) / self.micro_batches
        self._pause(self.stage_seconds)
        self._record("forward", k, start)
        self.saved[k] = (inp, out)
        self.peak = max(self.peak, len(self.saved))
        if self.last:
            self.losses.append(float(out.detach()))
        else:
            # isend, not send: under 1F1B this rank sends an activation forward while
            # the next rank sends a gradient back, and gloo's send waits for the
            # receive to be posted; two blocking sends would wait for each other.
            # The work is kept and waited for at the end.
            self.sends.append(dist.isend(out.detach(), dst=self.rank + 1))

    def backward(self, k: int) -> None:
        import torch
        import torch.distributed as dist

        inp, out = self.saved[k]
        grad = None
        if not self.last:
            grad = torch.empty_like(out)
            dist.recv(grad, src=self.rank + 1)
        start = self._now()
        out.backward(grad)
        self._pause(2 * self.stage_seconds)
        self._record("backward", k, start)
        del self.saved[k]  # this micro-batch's activations are freed
        if not self.first:
            self.sends.append(dist.isend(inp.grad, dst=self.rank - 1))

    def _now(self) -> float:
        # On a GPU the work is queued, not done, when the call returns: wait for it,
        # so the times are those of the work (and a received tensor has arrived).
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)
        return time.perf_counter() - self.zero

    def _pause(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def _record(self, phase: str, k: int, start: float) -> None:
        self.events.append(
            {
                "device": self.rank,
                "phase": phase,
                "micro_batch": k,
                "start": start,
                "end": self._now(),
            }
        )


def _check_settings(
    schedule: Any, micro_batches: Any, batch: Any, width: Any, stage_seconds: Any
) -> None:
    """Refuse bad settings before any message is sent (every rank refuses alike)."""
    schedule_order(schedule, 0, 1, micro_batches)  # the schedule and micro_batches
    whole("batch", batch, fix="e.g. batch=32")
    whole("width", width, fix="e.g. width=64")
    if batch % micro_batches:
        raise ValueError(
            f"batch={batch} does not divide into micro_batches={micro_batches} equal "
            f"pieces; pass a batch that is a multiple of {micro_batches} (e.g. "
            f"{micro_batches * max(1, batch // micro_batches)}) or a micro_batches "
            f"that divides {batch}"
        )
    seconds = stage_seconds
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        allowed, fix = "a number of seconds, 0 or more", "0 for no added time"
        raise ValueError(message("stage_seconds", allowed, seconds, fix))


def _warm_up_autograd() -> None:
    """One tiny backward given a gradient, before the clock: the first imports
    sympy (0.4 s on a 2-core machine) and would look like a slow stage."""
    import torch

    x = torch.ones(1, requires_grad=True)
    (x * 2).backward(torch.ones(1))


def _model_and_data(world_size: int, batch: int, width: int, seed: int) -> tuple:
    """The whole model, inputs and targets, the same on every rank (on the CPU)."""
    import torch
    from torch import nn

    # fork_rng: the seed sets this model, not the rest of the caller's random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        blocks = [
            nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(world_size)
        ]
        full = nn.Sequential(*blocks, nn.Linear(width, 1))
        x = torch.randn(batch, width)
        target = torch.randn(batch, 1)
    return full, x, target


def _stage(full: Any, rank: int, world_size: int) -> Any:
    """Rank ``rank``'s part of ``full``, copied (the original stays whole)."""
    from torch import nn

    parts = list(full[rank])
    if rank == world_size - 1:
        parts.append(full[world_size])  # the final Linear(width, 1)
    return copy.deepcopy(nn.Sequential(*parts))


def _reference(
    full: Any, x: Any, target: Any, device: Any, rank: int
) -> tuple[float, dict[str, Any]]:
    """The unsplit model on the whole batch: its loss, and the gradients of rank
    ``rank``'s parameters (on the CPU) under the names they have in its stage."""
    import torch.nn.functional as F

    model = copy.deepcopy(full).to(device)
    loss = F.mse_loss(model(x.to(device)), target.to(device))
    loss.backward()
    world_size = len(full) - 1
    mine = list(model[rank].parameters())
    if rank == world_size - 1:
        mine += list(model[world_size].parameters())
    names = [n for n, _ in _stage(full, rank, world_size).named_parameters()]
    grads = {n: p.grad.detach().cpu() for n, p in zip(names, mine, strict=True)}
    return float(loss.detach()), grads
