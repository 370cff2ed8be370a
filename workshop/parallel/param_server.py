"""The parameter server against all-reduce, synchronous and asynchronous, on real ranks.

The problem: linear regression on seeded synthetic data, ``width`` float32
parameters, ``SAMPLES_PER_WORKER`` rows per worker. :func:`parameter_server`'s rank 0
receives W gradients and sends W copies each step, so its traffic grows with W;
:func:`allreduce_baseline` sends about 2(N-1)/N gradients per rank, flat in N;
:func:`async_parameter_server` applies each gradient as it arrives, some of them
*stale*. Notebook 04 counts every rank's bytes per step from the runs' traces
(:func:`workshop.comm.traffic.bytes_per_step`).

Example::

    run = launch(parameter_server, world_size=3, backend="gloo", trace=True)
    run.returns[0]["losses"]          # the loss on all the data after each step
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from ..checks import message, positive_number, whole
from ..env import group_place, rank_device

__all__ = [
    "SAMPLES_PER_WORKER",
    "allreduce_baseline",
    "async_parameter_server",
    "parameter_server",
]

#: Rows of data in each worker's shard.
SAMPLES_PER_WORKER = 256


# ------------------------------------------------------------------ the problem
def check_run(steps: int, lr: float, width: int, slow_rank_seconds: float = 0) -> None:
    """Refuse bad arguments before any rank talks to another."""
    whole("steps", steps, fix="e.g. steps=5")
    whole("width", width, fix="e.g. width=1000")
    positive_number("lr", lr, fix="pass a learning rate such as lr=0.1")
    seconds = slow_rank_seconds
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        allowed = "a number of seconds, 0 or more"
        fix = "0 for no slow worker, or e.g. 0.2 to make the last worker lag"
        raise ValueError(message("slow_rank_seconds", allowed, seconds, fix))


def _group(name: str, least: int) -> tuple[int, int]:
    """(rank, world_size) of the default group, checked for ``name``."""
    rank, world_size = group_place(
        name, f"workshop.launch({name}, world_size={max(least, 2)})"
    )
    if world_size < least:
        raise ValueError(
            f"{name} needs world_size >= {least} (rank 0 the server, ranks 1.. the "
            f"workers), got world_size={world_size}; launch it with world_size=W + 1 "
            "for W workers, e.g. world_size=3 for 2 workers"
        )
    return rank, world_size


def shard_of(seed: int, index: int, width: int, device: Any) -> tuple[Any, Any]:
    """Shard ``index`` of the data: (X, y) with y = X·w_true + a little noise.

    Made on the CPU from the seed and moved to ``device``, so a GPU node trains on
    the same numbers; the same shard whichever rank (or how many) makes it.
    """
    import torch

    w_true = torch.randn(width, generator=torch.Generator().manual_seed(seed))
    w_true /= math.sqrt(width)  # the targets' variance is then about 1
    g = torch.Generator().manual_seed(seed * 100_003 + index + 1)
    x = torch.randn(SAMPLES_PER_WORKER, width, generator=g)
    y = x @ w_true + 0.01 * torch.randn(SAMPLES_PER_WORKER, generator=g)
    return x.to(device), y.to(device)


def regression_loss(params: Any, data: Sequence[tuple[Any, Any]]) -> float:
    """Half the mean squared error over every row of ``data`` (equal shards)."""
    return sum(0.5 * float(((x @ params - y) ** 2).mean()) for x, y in data) / len(data)


def regression_gradient(params: Any, x: Any, y: Any) -> Any:
    """The gradient of :func:`regression_loss` on one shard: Xᵀ(Xw - y) / rows."""
    return x.T @ (x @ params - y) / x.shape[0]


def final_params(params: Any) -> dict[str, Any]:
    """The final parameters as plain data: a checksum and a CPU copy."""
    cpu = params.detach().to("cpu").clone()
    return {"checksum": float(cpu.double().sum()), "params": cpu}


# ------------------------------------------------------------------ synchronous
def parameter_server(
    steps: int = 5, lr: float = 0.1, width: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """Synchronous parameter server; run it in every rank, world_size = W + 1.

    Each step the workers (ranks 1..W) send their gradients to rank 0, which
    averages them in rank order, takes an SGD step and sends the parameters back.

    Args:
        steps: training steps, 1 or more.
        lr: learning rate, above 0.
        width: number of parameters (float32), 1 or more.
        seed: seed of the synthetic data.

    Returns:
        On every rank: ``role`` ("server" or "worker"), ``rank``, ``workers`` (W),
        ``losses`` (on all W shards after each step), ``checksum`` (sum of the final
        parameters) and ``params`` (a CPU tensor). Workers add ``shard_losses``
        (their own shard's, at the parameters each gradient was computed on).

    Raises:
        ValueError: world_size < 2, steps < 1, lr <= 0 or width < 1.
        RuntimeError: called outside a process group.

    Example:
        >>> run = launch(parameter_server, world_size=3)           # doctest: +SKIP
        >>> run.returns[0]["losses"][-1] < run.returns[0]["losses"][0]  # doctest: +SKIP
        True
    """
    import torch
    import torch.distributed as dist

    check_run(steps, lr, width)
    rank, world_size = _group("parameter_server", 2)
    workers, device = world_size - 1, rank_device()
    data = [shard_of(seed, i, width, device) for i in range(workers)]
    params = torch.zeros(width, device=device)
    buffer = torch.empty(width, device=device)
    losses, shard_losses = [], []
    for _ in range(steps):
        if rank == 0:
            total = torch.zeros(width, device=device)
            for worker in range(1, world_size):  # rank order: the same sum each run
                dist.recv(buffer, src=worker)
                total += buffer
            params -= lr * total / workers
            for worker in range(1, world_size):
                dist.send(params, dst=worker)
        else:
            x, y = data[rank - 1]
            shard_losses.append(regression_loss(params, [(x, y)]))
            dist.send(regression_gradient(params, x, y), dst=0)
            dist.recv(params, src=0)
        losses.append(regression_loss(params, data))
    out = {"role": "server" if rank == 0 else "worker", "rank": rank}
    out.update(workers=workers, losses=losses, **final_params(params))
    if rank:
        out["shard_losses"] = shard_losses
    return out


def allreduce_baseline(
    steps: int = 5, lr: float = 0.1, width: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """The same training with all-reduce; run it in every rank, world_size = W.

    Every rank sums its gradient with everyone's and takes the same SGD step, so it
    ends with :func:`parameter_server`'s parameters (up to float32 rounding).

    Args:
        steps, lr, width, seed: as for :func:`parameter_server`.

    Returns:
        On every rank: ``role`` ("worker"), ``rank``, ``workers`` (W), ``losses``
        (the loss on all W shards after each step), ``shard_losses``, ``checksum``
        and ``params``, as :func:`parameter_server`'s workers return them.

    Raises:
        ValueError: steps < 1, lr <= 0 or width < 1.
        RuntimeError: called outside a process group.

    Example:
        >>> run = launch(allreduce_baseline, world_size=2)         # doctest: +SKIP
        >>> run.returns[0]["checksum"] == run.returns[1]["checksum"]  # doctest: +SKIP
        True
    """
    import torch
    import torch.distributed as dist

    check_run(steps, lr, width)
    rank, world_size = _group("allreduce_baseline", 1)
    device = rank_device()
    data = [shard_of(seed, i, width, device) for i in range(world_size)]
    x, y = data[rank]
    params = torch.zeros(width, device=device)
    losses, shard_losses = [], []
    for _ in range(steps):
        shard_losses.append(regression_loss(params, [(x, y)]))
        grad = regression_gradient(params, x, y)
        # SUM then divide: ReduceOp.AVG exists for NCCL only, not for gloo.
        dist.all_reduce(grad)
        params -= lr * grad / world_size
        losses.append(regression_loss(params, data))
    out = {"role": "worker", "rank": rank, "workers": world_size, "losses": losses}
    out.update(shard_losses=shard_losses, **final_params(params))
    return out


# ------------------------------------------------------------------ asynchronous
def async_parameter_server(
    steps: int = 20,
    lr: float = 0.05,
    width: int = 1000,
    seed: int = 0,
    slow_rank_seconds: float = 0.0,
) -> dict[str, Any]:
    """Asynchronous parameter server; run it in every rank, world_size = W + 1.

    Each step a worker sends ``[version, gradient]`` to rank 0 and waits for
    ``[version, parameters]``; the server applies each in arrival order and answers
    that worker alone. An update's *staleness* is the versions that slipped in
    between; the arrival order is not deterministic. With ``slow_rank_seconds`` the
    last worker sleeps before each gradient, so its updates arrive stale. The server
    also runs the synchronous training alone, for comparison.

    Args:
        steps, lr, width, seed: as for :func:`parameter_server` (steps: gradients
            each worker sends; lr: of every single update).
        slow_rank_seconds: seconds the last worker sleeps before each gradient.

    Returns:
        The server: ``role``, ``rank``, ``workers``, ``updates`` (dicts
        ``worker``, ``computed_on``, ``applied_at``, ``staleness``, as applied),
        ``staleness``, ``initial_loss``, ``losses`` (after each update),
        ``sync_losses`` (the synchronous run after each step), ``matched_losses``
        (this run after k * W updates), ``version``, ``checksum`` and ``params``.
        A worker: ``role``, ``rank``, ``slow``, ``computed_on`` (each gradient's
        version), ``version`` (the last received) and ``checksum``.

    Raises:
        ValueError: as :func:`parameter_server`, or slow_rank_seconds < 0.
        RuntimeError: called outside a process group.

    Example:
        >>> run = launch(async_parameter_server, world_size=3,      # doctest: +SKIP
        ...              slow_rank_seconds=0.1)
        >>> max(run.returns[0]["staleness"]) >= 1  # doctest: +SKIP
        True
    """
    import torch
    import torch.distributed as dist

    check_run(steps, lr, width, slow_rank_seconds)
    rank, world_size = _group("async_parameter_server", 2)
    workers, device = world_size - 1, rank_device()
    # NCCL cannot receive from "any source": the messages are CPU tensors and go by
    # gloo, which the workshop's NCCL group has beside it ("cpu:gloo,cuda:nccl").
    gloo = "gloo" in str(dist.get_backend())
    group = None if gloo else dist.new_group(backend="gloo")
    # One packet, [version, vector]: the version cannot be separated from its
    # gradient by another worker's packet. float32 holds versions exactly to 2**24.
    packet = torch.empty(width + 1)
    params, version = torch.zeros(width, device=device), 0
    if rank == 0:
        data = [shard_of(seed, i, width, device) for i in range(workers)]
        updates, losses = [], []
        initial = regression_loss(params, data)
        for _ in range(steps * workers):
            sender = dist.recv(packet, src=None, group=group)
            computed_on = int(packet[0])
            params -= lr * packet[1:].to(device)
            keys = ("worker", "computed_on", "applied_at", "staleness")
            figures = (sender, computed_on, version, version - computed_on)
            updates.append(dict(zip(keys, figures, strict=True)))
            version += 1
            losses.append(regression_loss(params, data))
            packet[0], packet[1:] = version, params.cpu()
            dist.send(packet, dst=sender, group=group)
        sync, sync_losses = torch.zeros(width, device=device), []
        for _ in range(steps):
            sync -= lr * sum(regression_gradient(sync, x, y) for x, y in data) / workers
            sync_losses.append(regression_loss(sync, data))
        out = {"role": "server", "rank": 0, "workers": workers, "updates": updates}
        out.update(
            staleness=[u["staleness"] for u in updates],
            initial_loss=initial,
            losses=losses,
            sync_losses=sync_losses,
            matched_losses=losses[workers - 1 :: workers],
            version=version,
            **final_params(params),
        )
        return out
    x, y = shard_of(seed, rank - 1, width, device)
    slow = rank == world_size - 1 and slow_rank_seconds > 0
    computed_on = []
    for _ in range(steps):
        if slow:
            time.sleep(slow_rank_seconds)
        computed_on.append(version)
        packet[0], packet[1:] = version, regression_gradient(params, x, y).cpu()
        dist.send(packet, dst=0, group=group)
        dist.recv(packet, src=0, group=group)
        version, params = int(packet[0]), packet[1:].to(device)
    out = {"role": "worker", "rank": rank, "slow": slow, "computed_on": computed_on}
    out.update(version=version, checksum=float(params.double().sum()))
    return out
