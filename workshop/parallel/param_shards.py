"""The parameter server with its parameters sharded over several servers.

Used by notebook 04, section 5: with W workers and S servers, server ``s`` holds the
``s``-th of S slices of the parameter vector; every step each worker pushes each
server the slice of its gradient that server holds and pulls the updated slice back.
A server then receives W / S gradients' worth of bytes per step, and sends as many:
more servers, less traffic through each, but every worker still moves a whole
gradient and a whole parameter vector.

* :func:`sharded_parameter_server` (world_size S + W): ranks 0..S-1 the servers,
  ranks S..S+W-1 the workers, on the problem of
  :func:`~workshop.parallel.param_server.parameter_server` (which is S = 1).
* :func:`server_traffic`: runs it traced for several S and counts every rank's
  bytes per step with :func:`workshop.comm.traffic.bytes_per_step`.

Example::

    run = launch(sharded_parameter_server, servers=2, world_size=2 + 3)
    run.returns[2]["losses"]          # a worker's loss on all the data after each step
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..checks import whole, whole_list
from ..comm.traffic import bytes_per_step
from ..env import group_place, rank_device
from ..ranks.launcher import launch
from .param_server import (
    check_run,
    final_params,
    regression_gradient,
    regression_loss,
    shard_of,
)

__all__ = ["server_traffic", "sharded_parameter_server"]


def _check_servers(servers: Any, width: int) -> None:
    fix = "pass servers=1 for one server, 2 to split the parameters in two"
    whole("servers", servers, fix=fix)
    if servers > width:
        raise ValueError(
            f"servers={servers} for width={width} parameters leaves some server "
            f"nothing to hold; pass servers={width} or fewer"
        )


def sharded_parameter_server(
    steps: int = 5, lr: float = 0.1, width: int = 1000, seed: int = 0, servers: int = 2
) -> dict[str, Any]:
    """Synchronous parameter server sharded over ``servers`` ranks; run it in every
    rank, world_size = S + W.

    The parameter vector is cut into S slices (``tensor_split``: sizes differ by at
    most one). Each step every worker (rank S + k, data shard k) computes its
    gradient and ``dist.send``\\ s slice ``s`` of it to server ``s``, for every s;
    each server receives its slice from every worker in rank order, averages, takes
    the SGD step on its slice, and sends the new slice to every worker, which puts
    the S slices back together. The arithmetic is that of
    :func:`~workshop.parallel.param_server.parameter_server`, slice by slice, so the
    final parameters are the same: bit for bit where both runs' ranks compute with
    the same number of threads, within float32 rounding otherwise (a matrix product
    split over another number of threads adds in another order).

    Args:
        steps: training steps, 1 or more.
        lr: learning rate, above 0.
        width: number of parameters (float32), at least ``servers``.
        seed: seed of the synthetic data.
        servers: S, the number of server ranks, 1 or more.

    Returns:
        On every rank: ``role`` ("server" or "worker"), ``rank``, ``servers`` (S),
        ``workers`` (W), ``slice`` ([start, stop) of the parameters a server holds;
        [0, width) for a worker), ``params`` (a CPU copy of those) and
        ``checksum`` (their sum). Workers add ``losses``: the loss on all W data
        shards after each step.

    Raises:
        ValueError: world_size < S + 1, servers < 1 or > width, steps < 1,
            lr <= 0 or width < 1.
        RuntimeError: called outside a process group.

    Example:
        >>> run = launch(sharded_parameter_server, servers=2,      # doctest: +SKIP
        ...              world_size=4)
        >>> run.returns[2]["losses"][-1] < run.returns[2]["losses"][0]
        True
    """
    import torch
    import torch.distributed as dist

    check_run(steps, lr, width)
    _check_servers(servers, width)
    rank, world_size = group_place(
        "sharded_parameter_server",
        f"workshop.launch(sharded_parameter_server, servers={servers}, "
        f"world_size={servers + 2})",
    )
    if world_size < servers + 1:
        raise ValueError(
            f"sharded_parameter_server with servers={servers} needs world_size >= "
            f"{servers + 1} (ranks 0..{servers - 1} the servers, then the workers), "
            f"got world_size={world_size}; launch it with world_size=servers + W for "
            "W workers"
        )
    workers, device = world_size - servers, rank_device()
    sizes = [len(part) for part in torch.arange(width).tensor_split(servers)]
    starts = [sum(sizes[:s]) for s in range(servers)]
    params = torch.zeros(width, device=device)
    slices = list(params.tensor_split(servers))  # views: writing one fills params
    out: dict[str, Any] = {"rank": rank, "servers": servers, "workers": workers}
    if rank < servers:
        mine, buffer = slices[rank], torch.empty(sizes[rank], device=device)
        for _ in range(steps):
            total = torch.zeros(sizes[rank], device=device)
            for worker in range(servers, world_size):  # rank order: a fixed sum
                dist.recv(buffer, src=worker)
                total += buffer
            mine -= lr * total / workers
            for worker in range(servers, world_size):
                dist.send(mine, dst=worker)
        start = starts[rank]
        out.update(role="server", slice=[start, start + sizes[rank]])
        return out | final_params(mine)
    data = [shard_of(seed, i, width, device) for i in range(workers)]
    x, y = data[rank - servers]
    losses = []
    for _ in range(steps):
        pieces = regression_gradient(params, x, y).tensor_split(servers)
        for server in range(servers):
            dist.send(pieces[server].contiguous(), dst=server)
        for server in range(servers):
            dist.recv(slices[server], src=server)
        losses.append(regression_loss(params, data))
    out.update(role="worker", slice=[0, width], losses=losses)
    return out | final_params(params)


def server_traffic(
    workers: int = 4,
    servers: Sequence[int] = (1, 2),
    steps: int = 2,
    width: int = 1000,
    seed: int = 0,
    backend: str = "auto",
) -> list[dict[str, Any]]:
    """Bytes per step through each server and each worker, counted from traces, for
    each number of servers S. Call it from a notebook cell (not a rank).

    Launches :func:`sharded_parameter_server` traced (world_size S + W) for each S
    and counts with :func:`workshop.comm.traffic.bytes_per_step`.

    Args:
        workers: W, the number of workers, 1 or more.
        servers: the numbers of servers S to run, each 1 or more.
        steps, width, seed: as for :func:`sharded_parameter_server`.
        backend: for :func:`~workshop.ranks.launcher.launch`.

    Returns:
        One dict per S: ``servers``, ``workers``, ``gradient_bytes`` (4 * width),
        ``server_received`` and ``server_sent`` (bytes per step of the busiest
        server), ``worker_sent`` and ``worker_received`` (of the busiest worker),
        and ``per_server``: (received, sent) per step of each server.

    Raises:
        ValueError: W below 1, an S below 1 or above ``width``, or bad
            steps/width.

    Example:
        >>> [r["server_received"] for r in server_traffic(4, (1, 2))]  # doctest: +SKIP
        [16000.0, 8000.0]
    """
    check_run(steps, 1.0, width)
    whole("workers", workers, fix="e.g. workers=4")
    whole_list("servers", servers, fix="e.g. servers=(1, 2)")
    for s in servers:
        _check_servers(s, width)
    rows = []
    for s in servers:
        run = launch(
            sharded_parameter_server,
            steps,
            0.1,
            width,
            seed,
            s,
            world_size=s + workers,
            backend=backend,
            trace=True,
            show="none",
        )
        counts = bytes_per_step(run.traces, steps)
        on_servers, on_workers = counts[:s], counts[s:]
        rows.append(
            {
                "servers": s,
                "workers": workers,
                "gradient_bytes": 4 * width,
                "server_received": max(c["received"] for c in on_servers),
                "server_sent": max(c["sent"] for c in on_servers),
                "worker_sent": max(c["sent"] for c in on_workers),
                "worker_received": max(c["received"] for c in on_workers),
                "per_server": [(c["received"], c["sent"]) for c in on_servers],
            }
        )
    return rows
