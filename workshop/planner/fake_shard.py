"""How one rank of the fake world splits its model: tensor, data and recompute.

For :mod:`workshop.planner.fake_step`, in the child process of
:func:`workshop.planner.fake_world.fake_run`. :func:`shard_model` builds the rank's
pipeline stage on the meta device, splits its matrices with DTensor tensor
parallelism (Megatron's column/row split) on the mesh's "tp" dimension, and for
``zero`` 2 and 3 shards it with FSDP2's ``fully_shard`` on "dp";
:func:`data_parallel` wraps the allocated model in DDP (``zero`` 0) or DDP with
``ZeroRedundancyOptimizer`` (``zero`` 1) and makes its optimizer.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .fake_record import _get
from .layout import Layout, ModelShape
from .transformer import build_transformer


def tensor_parallel(model: nn.Module, mesh: Any, tied: bool, notes: list[str]) -> None:
    """Split ``model``'s blocks over ``mesh`` the Megatron way (q, k, v, up and gate
    by columns, o and down by rows), and its embedding and head by vocabulary; a
    tied embedding stays whole (a note in ``notes`` says so). Used by the fake
    backend and by the real run alike, so both split the same way."""
    tp = importlib.import_module("torch.distributed.tensor.parallel")
    try:  # torch 2.5 and newer; 2.4 keeps the placements in _tensor
        placements = importlib.import_module("torch.distributed.tensor")
        placements.Replicate  # noqa: B018 - raises AttributeError on 2.4
    except (ImportError, AttributeError):
        placements = importlib.import_module("torch.distributed._tensor")
    col, row = tp.ColwiseParallel, tp.RowwiseParallel
    # Megatron's split: q, k, v and the MLP's up/gate by output columns (each rank
    # keeps heads / tp whole heads), o and down by input rows, one all-reduce after.
    plan = {
        "attn.q": col(),
        "attn.k": col(),
        "attn.v": col(),
        "attn.o": row(),
        "mlp.up": col(),
        "mlp.down": row(),
    }
    for block in model.blocks:
        tp.parallelize_module(
            block,
            mesh,
            dict(plan, **({"mlp.gate": col()} if hasattr(block.mlp, "gate") else {})),
        )
    outer: dict[str, Any] = {}
    if model.embed is not None and not tied:
        outer["embed"] = row(input_layouts=placements.Replicate())
    if model.head is not None:
        outer["head"] = col(output_layouts=placements.Shard(-1))
    if outer:
        tp.parallelize_module(model, mesh, outer)
    if tied:
        notes.append("tied embedding: not split by tp (the head uses its matrix)")


def shard_model(
    shape: ModelShape, layout: Layout, mesh: Any, stage: int, notes: list[str]
) -> tuple[nn.Module, str]:
    """This rank's stage on meta, split by tp then sharded on dp as ``layout`` says.

    Returns the module (on meta for FSDP, to be allocated) and the wrapper's name."""
    model = build_transformer(shape, stage=stage, stages=layout.pp)
    if layout.tp > 1:
        tensor_parallel(model, mesh["tp"], shape.tied, notes)
    if layout.checkpointing == "full":
        for block in model.blocks:
            _recompute(block)
        notes.append(
            "checkpointing full: each block's forward is run again in its "
            "backward (torch.utils.checkpoint), its collectives with it"
        )
    elif layout.checkpointing == "selective":
        notes.append(
            "checkpointing selective: not applied (recomputing attention "
            "changes activations only, not what is held or sent)"
        )
    if layout.dp == 1 or layout.zero < 2:
        return model, "none" if layout.dp == 1 else "later"
    fully_shard = _get("fully_shard")
    kwargs: dict[str, Any] = {"mesh": mesh["dp"]}
    if layout.precision == "bf16":
        policy = _get("fully_shard", "MixedPrecisionPolicy")
        # fp32 reduction stated, not left to the default: torch 2.15 reduces in the
        # gradients' own dtype (fp32 here), earlier releases in param_dtype (bf16).
        # torchtitan's default is fp32 too.
        kwargs["mp_policy"] = policy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    if layout.zero == 2:
        kwargs["reshard_after_forward"] = False
    for block in model.blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    name = "FSDP2 fully_shard" + (", reshard_after_forward=False" * (layout.zero == 2))
    return model, name


def _recompute(block: nn.Module) -> None:
    """Full activation checkpointing of one block: its forward runs under
    ``torch.utils.checkpoint``; the module and its hooks stay as they are."""
    from torch.utils.checkpoint import checkpoint

    forward = block.forward

    def recomputed(*args: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False)

    block.forward = recomputed


def data_parallel(
    model: nn.Module, layout: Layout, mesh: Any
) -> tuple[nn.Module, Any, str]:
    """DDP (and ZeRO-1's optimizer) for zero 0 and 1; Adam for the rest."""
    if layout.dp == 1 or layout.zero >= 2:
        return model, torch.optim.Adam(model.parameters(), lr=1e-3), ""
    from torch.nn.parallel import DistributedDataParallel

    group = mesh["dp"].get_group()
    try:
        model = DistributedDataParallel(model, process_group=group)
    except Exception as e:
        raise ValueError(
            f"zero={layout.zero} with tp={layout.tp}: PyTorch's DDP did not take the "
            f"tensor-parallel shards ({type(e).__name__}: {str(e)[:120]}); use zero=2 "
            "or 3 (FSDP2 shards DTensors), as torchtitan does for 2-D layouts"
        ) from e
    model.register_comm_hook(group, _allreduce_bucket)
    if layout.zero == 0:
        return model, torch.optim.Adam(model.parameters(), lr=1e-3), "DDP"
    from torch.distributed.optim import ZeroRedundancyOptimizer

    optimizer = ZeroRedundancyOptimizer(
        model.parameters(), torch.optim.Adam, process_group=group, lr=1e-3
    )
    return model, optimizer, "DDP + ZeroRedundancyOptimizer"


def _allreduce_bucket(group: Any, bucket: Any) -> Any:
    """DDP's own all-reduce of a gradient bucket, averaged. Its default hook hands
    back the collective's future, which on the fake backend holds no tensor (a C++
    assertion then fails), so this hook issues the same all-reduce and returns the
    bucket itself."""
    buffer = bucket.buffer()
    dist.all_reduce(buffer, group=group)
    buffer.div_(dist.get_world_size(group))
    done: torch.futures.Future = torch.futures.Future()
    done.set_result(buffer)
    return done


# DDP checks the hook's annotations as objects, not the strings this module's
# ``from __future__ import annotations`` would leave.
_allreduce_bucket.__annotations__ = {
    "group": object,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}
