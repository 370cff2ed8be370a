"""The parameter server with its parameters sharded over several servers.

Notebook 04, section 5: with S servers, each holds 1/S of the parameters and
receives W / S gradients' worth of bytes per step, but every worker still moves a
whole gradient and a whole parameter vector. :func:`sharded_parameter_server` runs
it (S = 1 is :func:`~workshop.parallel.param_server.parameter_server`);
notebook 04 counts every rank's bytes per step from the run's traces.

Example::

    run = launch(sharded_parameter_server, servers=2, world_size=2 + 3)
    run.returns[2]["losses"]          # a worker's loss on all the data after each step
"""

from __future__ import annotations

from typing import Any

from ..checks import whole
from ..env import group_place, rank_device
from .param_server import (
    check_run,
    final_params,
    regression_gradient,
    regression_loss,
    shard_of,
)

__all__ = ["sharded_parameter_server"]


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

    Ranks 0..S-1 each hold one slice (``tensor_split``) and do
    :func:`~workshop.parallel.param_server.parameter_server`'s arithmetic on it;
    every worker sends each server its slice of the gradient and gathers the new
    slices back. The final parameters are the same as with one server (bit for bit
    with the same thread count, else within float32 rounding).

    Args:
        steps, lr, width, seed: as for
            :func:`~workshop.parallel.param_server.parameter_server`.
        servers: S, the number of server ranks, 1 to ``width``.

    Returns:
        On every rank: ``role``, ``rank``, ``servers``, ``workers``, ``slice``
        ([start, stop) of the parameters held; [0, width) for a worker), ``params``
        (a CPU copy) and ``checksum``. Workers add ``losses`` (after each step).

    Raises:
        ValueError: world_size < S + 1, servers out of range, or a bad
            steps/lr/width.
        RuntimeError: called outside a process group.

    Example:
        >>> run = launch(sharded_parameter_server, servers=2,      # doctest: +SKIP
        ...              world_size=4)
        >>> run.returns[2]["losses"][-1] < run.returns[2]["losses"][0]  # doctest: +SKIP
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
