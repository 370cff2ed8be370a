"""Sharded data parallelism on real ranks: ZeRO stages 1, 2 and 3 written by hand,
PyTorch's FSDP2 beside them, and the memory each rank really keeps, measured next to
the formula of :mod:`workshop.parallel.zero_memory`; :func:`check_sharded` trains each
of them beside PyTorch's DDP and compares the losses and the weights.

Run in every rank, for example from a notebook cell::

    from workshop import launch
    from workshop.parallel.sharded import measure_zero_memory
    result = launch(measure_zero_memory, 3, world_size=4, backend="gloo")
    result.returns[0]["measured"]["total"], result.returns[0]["formula"]["total"]

Every rank copies the same MLP's parameters into one flat vector and runs the module
on views of it (``torch.func.functional_call``). Stage 1 shards Adam's state (the
gradient is reduce-scattered, the updated shards all-gathered), stage 2 also keeps
only this rank's shard of the gradient, stage 3 only its shard of the parameters,
all-gathered for each pass. Two simplifications change the peak, not what a rank
keeps between steps: the whole gradient exists before its reduce-scatter, and stage
3 gathers the whole model at once (DeepSpeed and FSDP go bucket by bucket).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..env import rank_device
from ..features import has_collective
from ..planner.memory import STAGE_NAMES, stage_number, zero_bytes
from ..training.models import held_bytes
from .zero_memory import (
    LR,
    adam_state,
    adam_steps,
    build_mlp,
    check_mlp_run,
    checksum,
    cuda_figures,
    cuda_start,
    measure_fsdp_memory,
    rank_batch,
)

__all__ = ["check_sharded", "measure_zero_memory"]

# A sharded run sums the gradients in another order than DDP, so float32 rounds
# them differently: measured on 2 to 4 ranks, weights apart by up to 6e-7, losses
# by 1.2e-7. Adam can grow such a rounding for a gradient near 0, so the tolerance
# is a hundredth of one Adam step (lr = 1e-3); a real mistake (gradients not summed
# over the ranks) moves the weights by 6e-3 in three steps.
STEP_TOLERANCE = 1e-5


def _reduce_scatter_runs(device: torch.device) -> bool:
    # NCCL runs every collective; gloo learned reduce_scatter only in some releases.
    return has_collective("reduce_scatter", "nccl" if device.type == "cuda" else "gloo")


class _ZeroRank:
    """What one rank keeps between steps under a stage, and the step that uses it:
    ``params`` is the full flat vector (this rank's shard at stage 3), ``update``
    what Adam updates (a view into ``params``: this rank's shard, or all for DDP)."""

    def __init__(self, stage: int, module: nn.Module, device: torch.device, rs: bool):
        self.stage, self.reduce_scatter = stage, rs
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.layout = [(n, p.shape, p.numel()) for n, p in module.named_parameters()]
        self.size = sum(numel for _, _, numel in self.layout)  # Ψ
        # Pad Ψ up to N equal shards (DDP needs no shards, so no padding).
        self.shard = -(-self.size // self.world_size) if stage else self.size
        full = torch.zeros(
            self.shard * (self.world_size if stage else 1), device=device
        )
        full[: self.size] = torch.cat(
            [p.detach().reshape(-1) for p in module.parameters()]
        )
        self.module = module.to("meta")  # shapes only; the values live in ``full``
        mine = slice(self.rank * self.shard, (self.rank + 1) * self.shard)
        if stage == 3:
            self.params = full[mine].clone()  # the rest of ``full`` is freed here
            self.update = self.params
        else:
            self.params, self.update = full, full[mine] if stage else full
        self.grads: torch.Tensor | None = None
        self.optimizer = torch.optim.Adam([self.update], lr=LR)
        self.transient = {"full_params": 0, "full_grads": 0}

    def _note(self, part: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.untyped_storage().nbytes()
        self.transient[part] = max(self.transient[part], nbytes)

    def _gather(self) -> torch.Tensor:
        """Stage 3: the full (padded) parameter vector, from every rank's shard."""
        full = torch.empty(self.shard * self.world_size, device=self.params.device)
        dist.all_gather(list(full.chunk(self.world_size)), self.params)
        return full

    def _loss_and_grad(self, full: torch.Tensor, x, y) -> tuple[float, torch.Tensor]:
        leaf = full.detach().requires_grad_()
        params, at = {}, 0
        for name, shape, numel in self.layout:
            params[name] = leaf[at : at + numel].view(shape)
            at += numel
        out = torch.func.functional_call(self.module, params, (x,))
        loss = nn.functional.mse_loss(out, y)
        loss.backward()
        return loss.item(), leaf.grad  # padding gets a gradient of 0

    def _my_gradient(self, grad: torch.Tensor) -> torch.Tensor:
        """This rank's shard of the gradient summed over the ranks."""
        if self.reduce_scatter:
            mine = torch.empty(self.shard, device=grad.device)
            dist.reduce_scatter(mine, list(grad.chunk(self.world_size)))
            return mine
        # Older gloo: sum everything, keep the slice (2x the traffic, same values).
        dist.all_reduce(grad)
        return grad[self.rank * self.shard : (self.rank + 1) * self.shard]

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One training step on this rank's batch; returns this rank's loss."""
        if self.stage == 3:
            full = self._gather()
            self._note("full_params", full)
        else:
            full = self.params
        loss, grad = self._loss_and_grad(full, x, y)
        del full  # stage 3: the gathered parameters are freed here
        grad.div_(self.world_size)  # average by dividing first, as DDP does
        if self.stage == 0:
            dist.all_reduce(grad)
            self.grads = self.update.grad = grad
        elif self.stage == 1:
            # Keeps the full gradient buffer, as DDP does; only this rank's slice of
            # it is averaged over the ranks (the rest is this rank's own gradient,
            # which nothing reads after the reduce-scatter).
            mine = self._my_gradient(grad)
            shard = grad[self.rank * self.shard : (self.rank + 1) * self.shard]
            if mine.data_ptr() != shard.data_ptr():
                shard.copy_(mine)
            self.grads, self.update.grad = grad, shard
        else:  # keeps only its shard of the gradient
            self._note("full_grads", grad)
            mine = self._my_gradient(grad)
            self.grads = self.update.grad = (
                mine if self.reduce_scatter else mine.clone()
            )
        del grad
        self.optimizer.step()
        if self.stage in (1, 2):  # everyone's updated shard, into the full vector
            dist.all_gather(
                list(self.params.chunk(self.world_size)), self.update.clone()
            )
        return loss

    def held(self) -> dict[str, int]:
        """Bytes this rank keeps between steps, by walking its tensors."""
        return held_bytes(
            {
                "params": [
                    self.params,
                    *self.module.parameters(),
                    *self.module.buffers(),
                ],
                "grads": [self.grads, self.update.grad],
                "optimizer": adam_state(self.optimizer),
            }
        )

    def full_parameters(self) -> torch.Tensor:
        """The model's Ψ parameters, gathered from the shards for stage 3."""
        full = self._gather() if self.stage == 3 else self.params
        return full[: self.size]


def _reduce_name(stage: int, reduce_scatter: bool) -> str:
    if stage == 0:
        return "all_reduce"
    if reduce_scatter:
        return "reduce_scatter"
    return (
        "all_reduce, then keep this rank's slice "
        "(this torch's gloo has no reduce_scatter)"
    )


def measure_zero_memory(
    stage: int | str,
    width: int = 256,
    depth: int = 4,
    steps: int = 2,
    seed: int = 0,
    *,
    return_parameters: bool = False,
) -> dict[str, Any]:
    """Train an MLP with Adam under DDP or ZeRO ``stage``, and measure what this rank
    keeps after the last step (each storage once,
    :func:`~workshop.parallel.zero_memory.held_bytes`), beside the fp32 formula
    (:func:`~workshop.parallel.zero_memory.zero_bytes`). Run in every rank.

    Args:
        stage: "ddp" (or 0), 1, 2 or 3.
        width: features of every linear layer.
        depth: linear layers; Ψ = depth * (width² + width).
        steps: training steps (batches of 16 samples per rank).
        seed: seed of the model's initial values and of the data.
        return_parameters: also return the final parameters (a CPU tensor of Ψ).

    Returns:
        ``{"stage", "name", "rank", "world_size", "device", "parameters": Ψ,
        "shard", "measured": {"params", "grads", "optimizer", "total"} in bytes,
        "formula": the same from zero_bytes, "transient": the largest full-size
        buffers within a step, "cuda": None, or {"held", "peak"} on a GPU,
        "gradient_reduce", "loss", "losses", "checksum": {"sum", "norm"}}``, and
        "final_parameters" when asked for.

    Raises:
        ValueError: an unknown stage, or a size below 1.
        RuntimeError: called outside a process group.

    Example:
        >>> r = launch(measure_zero_memory, 3, world_size=2)       # doctest: +SKIP
        >>> r.returns[0]["measured"]["total"]  # about 16 Ψ / 2   # doctest: +SKIP
    """
    number = stage_number(stage)
    check_mlp_run("measure_zero_memory", width, depth, steps, seed)
    device = rank_device()
    world_size = dist.get_world_size()
    before = cuda_start(device)
    reduce_scatter = bool(number) and _reduce_scatter_runs(device)
    zero = _ZeroRank(number, build_mlp(width, depth, seed), device, reduce_scatter)
    losses = [
        zero.step(*rank_batch(seed, step, width, device)) for step in range(steps)
    ]
    measured = zero.held()
    cuda = cuda_figures(device, before)
    final = zero.full_parameters()
    result: dict[str, Any] = {
        "stage": number,
        "name": STAGE_NAMES[number],
        "rank": dist.get_rank(),
        "world_size": world_size,
        "device": str(device),
        "parameters": zero.size,
        "shard": zero.shard,
        "measured": measured,
        "formula": zero_bytes(zero.size, world_size, number),
        "transient": dict(zero.transient),
        "cuda": cuda,
        "gradient_reduce": _reduce_name(number, reduce_scatter),
        "loss": losses[-1],
        "losses": losses,
        "checksum": checksum(final),
    }
    if return_parameters:
        result["final_parameters"] = final.detach().cpu().clone()
    return result


def check_sharded(
    stage: int | str, steps: int = 3, seed: int = 0, *, width: int = 256, depth: int = 4
) -> dict[str, Any]:
    """A sharded run (:func:`measure_zero_memory`, or
    :func:`~workshop.parallel.zero_memory.measure_fsdp_memory` for "fsdp2") against
    PyTorch's DistributedDataParallel from the same seed and data. Run in every rank.

    Args:
        stage: "ddp" (or 0), 1, 2 or 3, written by hand, or "fsdp2" for PyTorch's
            ``fully_shard``.
        steps: training steps of each.
        seed: seed of the model and the data.
        width, depth: the MLP's size, as in :func:`measure_zero_memory`.

    Returns:
        ``{"name", "available" (False only where FSDP2 cannot run: then just
        "why", "steps", "world_size", "tolerance"), "why", "steps", "world_size",
        "parameters": Ψ, "kept": bytes kept between steps, "unsplit": 16 Ψ,
        "loss_diff", "max_abs_diff" (over all ranks and steps), "tolerance",
        "losses_equal", "weights_equal", "equal", "gradient_reduce"}``.

    Raises:
        ValueError: an unknown stage, or a size below 1.
        RuntimeError: called outside a process group.

    Example:
        >>> r = launch(check_sharded, 2, world_size=2)              # doctest: +SKIP
        >>> rank0 = r.returns[0]                                    # doctest: +SKIP
        >>> rank0["equal"], rank0["kept"] < rank0["unsplit"]        # doctest: +SKIP
        (True, True)
    """
    fsdp = isinstance(stage, str) and stage.strip().lower() in ("fsdp", "fsdp2")
    try:
        number = 3 if fsdp else stage_number(stage)
    except ValueError as exc:
        raise ValueError(f"{exc}, or 'fsdp2' for PyTorch's fully_shard") from exc
    check_mlp_run("check_sharded", width, depth, steps, seed)
    world_size = dist.get_world_size()
    if fsdp:
        run = measure_fsdp_memory(width, depth, steps, seed, return_parameters=True)
        if not run["available"]:  # every rank alike: the same torch, the same call
            return {
                "name": "FSDP2",
                "available": False,
                "why": run["why"],
                "steps": steps,
                "world_size": world_size,
                "tolerance": STEP_TOLERANCE,
            }
        name, reduce = "FSDP2", "reduce_scatter (FSDP2's own)"
    else:
        run = measure_zero_memory(
            number, width, depth, steps, seed, return_parameters=True
        )
        name, reduce = run["name"], run["gradient_reduce"]
    losses, weights = _unsplit_run(width, depth, steps, seed, rank_device())
    diffs = torch.tensor(
        [
            max(abs(a - b) for a, b in zip(run["losses"], losses, strict=True)),
            float((run["final_parameters"] - weights).abs().max()),
        ],
        device=rank_device(),
    )
    dist.all_reduce(diffs, op=dist.ReduceOp.MAX)
    loss_diff, max_abs_diff = diffs.tolist()
    return {
        "name": name,
        "available": True,
        "why": "",
        "steps": steps,
        "world_size": world_size,
        "parameters": run["parameters"],
        "kept": run["measured"]["total"],
        "unsplit": zero_bytes(run["parameters"], world_size, 0)["total"],
        "loss_diff": loss_diff,
        "max_abs_diff": max_abs_diff,
        "tolerance": STEP_TOLERANCE,
        "losses_equal": loss_diff <= STEP_TOLERANCE,
        "weights_equal": max_abs_diff <= STEP_TOLERANCE,
        "equal": loss_diff <= STEP_TOLERANCE and max_abs_diff <= STEP_TOLERANCE,
        "gradient_reduce": reduce,
    }


def _unsplit_run(
    width: int, depth: int, steps: int, seed: int, device: torch.device
) -> tuple[list[float], torch.Tensor]:
    """PyTorch's DDP with full Adam: this rank's loss at every step, and the final
    parameters as one flat CPU vector."""
    from torch.nn.parallel import DistributedDataParallel

    model = build_mlp(width, depth, seed).to(device)
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )
    losses, optimizer = adam_steps(ddp, steps, seed, width, device)
    del ddp, optimizer
    return losses, torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
