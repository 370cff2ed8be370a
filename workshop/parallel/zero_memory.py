"""What sharded data parallelism saves, as a formula and as a measurement.

ZeRO (Rajbhandari et al., 2020) cuts the three things every data-parallel rank keeps
between steps, the parameters, their gradients and the optimizer's state, into
``world_size`` shards, one stage at a time::

    stage     parameters  gradients  optimizer state   fp32 + Adam, per rank
    DDP (0)   full        full       full              16 Ψ
    1         full        full       1/N               4 Ψ + 4 Ψ + 8 Ψ / N
    2         full        1/N        1/N               4 Ψ + 12 Ψ / N
    3         1/N         1/N        1/N               16 Ψ / N

:func:`zero_bytes` is that table and :func:`held_bytes` counts what a rank really
holds. :func:`measure_fsdp_memory` measures PyTorch's own ZeRO-3 (FSDP2) with the
model and data the hand-written stages of :mod:`workshop.parallel.sharded` use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..checks import whole
from ..env import group_place, rank_device
from ..features import fsdp2_fully_shard
from ..planner.memory import zero_bytes
from ..training.models import held_bytes

__all__ = ["LR", "measure_fsdp_memory"]

#: Adam's learning rate in every run of this module and of ``sharded``.
LR = 1e-3
_BATCH = 16  # samples per rank and step


# --- shared by the runs here and in sharded.py ------------------------------
def build_mlp(width: int, depth: int, seed: int) -> nn.Sequential:
    """The same MLP on every rank: ``depth`` linear layers width x width, ReLU
    between them, initialised from ``seed`` without touching the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers: list[nn.Module] = []
        for i in range(depth):
            layers.append(nn.Linear(width, width))
            if i < depth - 1:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)


def rank_batch(seed: int, step: int, width: int, device: torch.device):
    """This rank's slice of step ``step``'s global batch (the same on every rank)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(world_size * _BATCH, width, generator=g)
    y = torch.randn(world_size * _BATCH, width, generator=g)
    mine = slice(rank * _BATCH, (rank + 1) * _BATCH)
    return x[mine].to(device), y[mine].to(device)


def check_mlp_run(caller: str, width: int, depth: int, steps: int, seed: int) -> None:
    """Refuse bad sizes, and a call outside the ranks, before any work starts."""
    fix = f"for example {caller}(width=256, depth=4, steps=2, seed=0)"
    for name, value in {"width": width, "depth": depth, "steps": steps}.items():
        whole(f"{caller}: {name}", value, fix=fix)
    whole(f"{caller}: seed", seed, 0, fix=fix)
    group_place(caller, f"workshop.launch({caller}, ..., world_size=2)")


def cuda_start(device: torch.device) -> int:
    """Bytes allocated on this rank's GPU before the run (0 on the CPU)."""
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def cuda_figures(device: torch.device, before: int) -> dict[str, int] | None:
    """What the run added on the GPU: still allocated ("held") and at most ("peak")."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return {
        "held": torch.cuda.memory_allocated(device) - before,
        "peak": torch.cuda.max_memory_allocated(device) - before,
    }


def adam_steps(model: nn.Module, steps: int, seed: int, width: int, device: Any):
    """Train ``model`` with Adam on this rank's batches: (losses, the optimizer)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        x, y = rank_batch(seed, step, width, device)
        optimizer.zero_grad()  # the last step's gradients stay, as they do in DDP
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, optimizer


def adam_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [
        t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)
    ]


def checksum(full: torch.Tensor) -> dict[str, float]:
    full = full.detach().double()
    return {"sum": float(full.sum()), "norm": float(full.norm())}


# --- PyTorch's own ZeRO-3 ------------------------------------------------------------
def measure_fsdp_memory(
    width: int = 256,
    depth: int = 4,
    steps: int = 2,
    seed: int = 0,
    *,
    return_parameters: bool = False,
) -> dict[str, Any]:
    """Train the MLP of :func:`~workshop.parallel.sharded.measure_zero_memory` with
    PyTorch's FSDP2 (``fully_shard`` on every linear layer, then the whole model)
    and Adam, and measure what this rank keeps, as for the hand-written stages.
    Run in every rank.

    Args:
        width, depth, steps, seed: as for ``measure_zero_memory``.
        return_parameters: also return the final parameters (a CPU tensor of Ψ).

    Returns:
        As :func:`~workshop.parallel.sharded.measure_zero_memory`'s (less
        ``stage``, ``name``, ``shard``, ``transient``, ``gradient_reduce``), plus
        ``"available": True, "why": "", "fully_shard"`` (where found); or
        ``{"available": False, "why", "rank", "world_size", "device"}`` where this
        torch has no ``fully_shard`` or it fails here.

    Raises:
        ValueError: a size below 1.
        RuntimeError: called outside a process group.

    Example:
        >>> r = launch(measure_fsdp_memory, world_size=2)           # doctest: +SKIP
        >>> rank0 = r.returns[0]                                    # doctest: +SKIP
        >>> rank0["measured"]["total"] < 16 * rank0["parameters"]   # doctest: +SKIP
        True
    """
    check_mlp_run("measure_fsdp_memory", width, depth, steps, seed)
    device = rank_device()
    where = {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "device": str(device),
    }
    fully_shard, found = fsdp2_fully_shard()
    if fully_shard is None:
        return {"available": False, "why": found, **where}
    try:
        result = _run_fsdp(fully_shard, device, width, depth, steps, seed)
    except Exception as exc:  # every rank fails alike: the same torch, the same call
        return {
            "available": False,
            "why": f"{found} failed on {device} with the {dist.get_backend()} "
            f"backend: {type(exc).__name__}: {exc}",
            **where,
        }
    final = result.pop("final")
    result.update(available=True, why="", fully_shard=found, **where)
    result["checksum"] = checksum(final)
    if return_parameters:
        result["final_parameters"] = final.cpu().clone()
    return result


def _run_fsdp(
    fully_shard: Callable, device: torch.device, width, depth, steps, seed
) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    before = cuda_start(device)
    model = build_mlp(width, depth, seed).to(device)
    size = sum(p.numel() for p in model.parameters())
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    # One FSDP unit per layer, so that only one layer's parameters are ever
    # gathered at a time, then the root for what is left (nothing, here).
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    losses, optimizer = adam_steps(model, steps, seed, width, device)
    measured = held_bytes(
        {
            "params": list(model.parameters()),
            "grads": [p.grad for p in model.parameters()],
            "optimizer": adam_state(optimizer),
        }
    )
    cuda = cuda_figures(device, before)
    # full_tensor() all-gathers each parameter: a collective every rank makes.
    final = torch.cat(
        [p.full_tensor().detach().reshape(-1) for p in model.parameters()]
    )
    return {
        "parameters": size,
        "measured": measured,
        "formula": zero_bytes(size, dist.get_world_size(), 3),
        "cuda": cuda,
        "loss": losses[-1],
        "losses": losses,
        "final": final,
    }
