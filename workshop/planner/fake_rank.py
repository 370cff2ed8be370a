"""Inside the fake world: one rank of a big layout, sharded and stepped for real.

Runs in the child :func:`workshop.planner.fake_world.fake_run` starts, never in a
kernel: it joins the "fake" process group, builds this rank's stage on the meta
device, splits it (:func:`tensor_parallel`, :func:`shard_model`,
:func:`data_parallel`), allocates only the local shards and runs one step while
:class:`~workshop.planner.fake_record.Collectives` writes down every collective.
"""

from __future__ import annotations

import importlib
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..training.models import held_bytes
from .fake_record import Collectives, _get, find_features, group_names, no_arithmetic
from .layout import Layout, ModelShape
from .transformer import build_transformer


# --- how the rank splits its model ----------------------------------------------------
def tensor_parallel(model: nn.Module, mesh: Any, tied: bool, notes: list[str]) -> None:
    """Split ``model`` over ``mesh`` the Megatron way, embedding and head by
    vocabulary (a tied one stays whole, noted in ``notes``); the fake backend and
    the real runs share it, so both split the same way."""
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


# --- what the rank holds --------------------------------------------------------------
def local_parameters(model: nn.Module) -> tuple[int, int]:
    """(values, bytes) of this rank's parameter shards, unpadded, meta or not."""
    values = nbytes = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        values += local.numel()
        nbytes += local.numel() * local.element_size()
    return values, nbytes


def shards(model: nn.Module) -> dict[str, tuple[list[int], list[int]]]:
    """Global and local shapes of the root's and the first block's parameters."""
    out: dict[str, tuple[list[int], list[int]]] = {}
    for name, p in model.named_parameters():
        if ".blocks." in f".{name}" and not name.startswith("blocks.0."):
            continue
        local = p.to_local() if hasattr(p, "to_local") else p
        out[
            name.replace("_fsdp_wrapped_module.", "").replace("module.", "", 1)
            if name.startswith("module.")
            else name
        ] = (list(p.shape), list(local.shape))
    return out


def held(model: nn.Module, optimizer: Any) -> dict[str, int]:
    """Bytes of parameter shards, gradients and optimizer state, each storage once."""
    params = list(model.parameters())
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's own
    state = [
        t
        for s in inner.state.values()
        for t in s.values()
        if isinstance(t, torch.Tensor)
    ]
    grads = [p.grad for p in params]
    return held_bytes({"parameters": params, "gradients": grads, "optimizer": state})


def run_step(
    model: nn.Module,
    optimizer: Any,
    shape: ModelShape,
    layout: Layout,
    stage: int,
    tokens: tuple[int, int],
    recorder: Collectives,
    blocks: int | None,
) -> dict[str, tuple[int, int]]:
    """One forward and backward of ``tokens`` = (batch, seq) through ``blocks`` of the
    stage's blocks (all if None), recorded. Returns what was recorded in it."""
    inner = getattr(model, "module", model)
    kept = inner.blocks
    if blocks is not None:
        inner.blocks = nn.ModuleList(list(kept)[:blocks])
    batch, seq = tokens
    dtype = torch.bfloat16 if layout.precision == "bf16" else torch.float32
    if stage == 0:
        x = torch.randint(0, shape.vocab, (batch, seq))
    else:  # the activation the previous stage would send
        x = torch.zeros(batch, seq, shape.hidden, dtype=dtype, requires_grad=True)
    autocast = layout.precision == "bf16" and "FSDP" not in str(type(model))
    before = recorder.snapshot()
    try:
        with recorder.mode, torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            out = model(x)
            if hasattr(out, "to_local"):
                out = out.to_local()
            if stage == layout.pp - 1:
                # A stand-in for the loss: a vocabulary-parallel cross-entropy adds
                # three all-reduces over tp of one value per token (Megatron).
                out.float().sum().backward()
            else:  # the gradient the next stage would send back
                out.backward(torch.zeros_like(out))
    finally:
        inner.blocks = kept
    after = recorder.snapshot()
    return {
        k: (v[0] - before.get(k, (0, 0))[0], v[1] - before.get(k, (0, 0))[1])
        for k, v in after.items()
        if v != before.get(k, (0, 0))
    }


# --- one run ------------------------------------------------------------------------
#: Gathered bytes (bf16 or fp32 parameters, one rank) a step may touch before it
#: runs fewer blocks than the stage holds and scales the per-block collectives.
STEP_BUDGET = 2 * 2**30
#: Largest local state (parameter shards + gradients + Adam, one rank) allocated.
MAX_BYTES = 4 * 2**30


def _minus(a: dict, b: dict) -> dict[str, tuple[int, int]]:
    keys = set(a) | set(b)
    out = {
        k: (
            a.get(k, (0, 0))[0] - b.get(k, (0, 0))[0],
            a.get(k, (0, 0))[1] - b.get(k, (0, 0))[1],
        )
        for k in keys
    }
    return {k: v for k, v in sorted(out.items()) if v != (0, 0)}


def _to_step(
    per_mb: dict,
    layout: Layout,
    shape: ModelShape,
    tokens: int,
    stage: int,
    notes: list[str],
) -> dict[str, tuple[int, int]]:
    """One micro-batch's collectives -> one step's: times micro_batches, tp traffic
    scaled to the layout's tokens, the pipeline's sends counted from the split."""
    layout_tokens = layout.micro_batch * shape.seq
    out: dict[str, tuple[int, int]] = {}
    for key, (n, b) in per_mb.items():
        if key.endswith(" tp"):
            b = b * layout_tokens // tokens
            if tokens != layout_tokens:
                notes.append(
                    f"{key}: activations, so bytes scale with tokens; the step ran "
                    f"{tokens}, scaled to micro_batch x seq = {layout_tokens}"
                )
        out[key] = (n * layout.micro_batches, b * layout.micro_batches)
    if layout.pp > 1:
        width = 2 if layout.precision == "bf16" else 4
        one = layout_tokens * shape.hidden * width
        sends = (stage < layout.pp - 1) + (stage > 0)
        out["send_recv pp"] = (
            sends * layout.micro_batches,
            sends * layout.micro_batches * one,
        )
        notes.append(
            "send_recv pp: counted from the split, not run: per micro-batch this stage "
            f"sends {sends} activation(s)/gradient(s) of micro_batch x seq x hidden "
            f"x {width} B ({one:,} B); receives are not counted (they are the "
            "neighbours' sends)"
        )
    return dict(sorted(out.items()))


#: The start of a line on stderr saying which phase run ``number`` has reached, so
#: that a parent that stops the child on a timeout can say where it was.
PHASE_MARK = "FAKE-WORLD-PHASE "


def _phase(number: int, name: str) -> None:
    print(f"{PHASE_MARK}{number} {name}", file=sys.stderr, flush=True)


def run_job(job: dict[str, Any], number: int = 0) -> dict[str, Any]:
    """Everything one fake run does, in this (child) process; plain data back. Each
    phase is announced on stderr (:data:`PHASE_MARK`) as it starts."""
    times: dict[str, float] = {}
    found = find_features()
    if None in found.values():
        gone = [k for k, v in found.items() if v is None]
        raise RuntimeError(
            f"torch {torch.__version__} lacks {', '.join(gone)}; "
            "the fake-world check needs torch 2.4 or newer"
        )
    shape, layout, rank = (
        ModelShape(**job["model"]),
        Layout(**job["layout"]),
        job["rank"],
    )
    coords = layout.coordinates(rank)
    stage, notes = coords["pp"], []
    t = time.perf_counter()
    _phase(number, "mesh")
    dist.init_process_group(
        "fake", store=_get("fake_pg")(), rank=rank, world_size=layout.world_size
    )
    try:
        mesh = _get("device_mesh")(
            "cpu", (layout.pp, layout.dp, layout.tp), mesh_dim_names=("pp", "dp", "tp")
        )
        times["init"] = time.perf_counter() - t
        t = time.perf_counter()
        _phase(number, "shard")
        model, wrapper = shard_model(shape, layout, mesh, stage, notes)
        values, nbytes = local_parameters(model)
        if 4 * nbytes > MAX_BYTES:
            raise ValueError(
                f"rank {rank} of {layout.describe()} would hold {nbytes / 1e9:.1f} GB "
                f"of parameter shards, about {4 * nbytes / 1e9:.1f} GB with gradients "
                f"and Adam: over this check's {MAX_BYTES / 1e9:.1f} GB; use more "
                "ranks (dp with zero=3, tp, pp) or a smaller model"
            )
        times["shard"] = time.perf_counter() - t
        t = time.perf_counter()
        _phase(number, "allocate")
        model.to_empty(device="cpu")
        with torch.no_grad():
            for p in model.parameters():
                (p.to_local() if hasattr(p, "to_local") else p).zero_()
        model, optimizer, ddp = data_parallel(model, layout, mesh)
        wrapper = ddp or (
            wrapper
            if wrapper not in ("none", "later")
            else "none (dp=1: nothing to shard or reduce)"
        )
        times["allocate"] = time.perf_counter() - t
        recorder = Collectives(group_names(mesh))
        blocks = len(getattr(model, "module", model).blocks)
        batch_tokens = job["batch_tokens"] or 16
        seq = min(batch_tokens, shape.seq)
        tokens = (batch_tokens // seq, seq)
        run = blocks
        if "FSDP" in wrapper or wrapper.startswith("none"):
            width = 2 if layout.precision == "bf16" else 4
            per_block = shape.layer_parameters() // layout.tp * width
            run = job["layers_in_step"] or max(1, STEP_BUDGET // per_block)
            run = min(run, blocks)
        cdm = _get("comm_debug_mode")()
        measured: dict[str, tuple[int, int]] = {}
        t = time.perf_counter()
        _phase(number, "step")
        if job["step"] and "DDP" in wrapper:
            # DDP reduces everything in one bucket in its first step, and rebuilds
            # its buckets (in the order the gradients became ready, sending their
            # indices) in the second: the step recorded is the third, as every
            # later one is.
            with no_arithmetic():
                for _ in range(2):
                    blank = Collectives({})
                    run_step(model, optimizer, shape, layout, stage, tokens, blank, run)
            notes.append(
                "DDP: the third step is recorded (the first reduces all "
                "gradients in one bucket, the second rebuilds the buckets)"
            )
        counted: dict[str, int] = {}

        def add_counts(mode) -> None:
            for k, v in mode.get_comm_counts().items():
                counted[str(k)] = counted.get(str(k), 0) + v

        if job["step"]:
            with cdm, no_arithmetic():
                measured = run_step(
                    model, optimizer, shape, layout, stage, tokens, recorder, run
                )
            add_counts(cdm)
            per_mb = measured
            if run < blocks:
                # In a CommDebugMode of its own: torch 2.11's adds a module's hook
                # each time the module runs in it, and a module run in two steps
                # (the last norm) then leaves its stack twice and fails.
                cdm = _get("comm_debug_mode")()
                with cdm, no_arithmetic():
                    root = run_step(
                        model, optimizer, shape, layout, stage, tokens, recorder, 0
                    )
                add_counts(cdm)
                each = _minus(measured, root)
                whole = {
                    k: (
                        root.get(k, (0, 0))[0] + blocks * n // run,
                        root.get(k, (0, 0))[1] + blocks * b // run,
                    )
                    for k, (n, b) in each.items()
                }
                per_mb = dict(sorted({**root, **whole}.items()))
                notes.append(
                    f"step ran {run} of the stage's {blocks} blocks (and once "
                    "none, for the root's share); per-block collectives scaled to "
                    f"{blocks} blocks"
                )
        times["step"] = time.perf_counter() - t
        t = time.perf_counter()
        _phase(number, "optimizer")
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        before = recorder.snapshot()
        cdm = _get("comm_debug_mode")()  # entering it again would clear its counts
        with cdm, recorder.mode:
            optimizer.step()
        add_counts(cdm)
        in_optimizer = _minus(recorder.snapshot(), before)
        times["optimizer"] = time.perf_counter() - t
        collectives = (
            _to_step(per_mb, layout, shape, tokens[0] * tokens[1], stage, notes)
            if job["step"]
            else {}
        )
        for k, (n, b) in in_optimizer.items():
            old = collectives.get(k, (0, 0))
            collectives[k] = (old[0] + n, old[1] + b)
        return {
            "model": shape.name,
            "layout": layout.describe(),
            "rank": rank,
            "world_size": layout.world_size,
            "coordinates": coords,
            "stage_layers": [stage * blocks, (stage + 1) * blocks],
            "wrapper": wrapper,
            "held": held(getattr(model, "module", model), optimizer),
            "local_parameters": values,
            "shards": shards(getattr(model, "module", model)),
            "collectives": dict(sorted(collectives.items())),
            "measured": measured,
            "group_sizes": {d: mesh[d].size() for d in ("pp", "dp", "tp")},
            "comm_debug": counted,
            "tokens": tokens[0] * tokens[1],
            "layout_tokens": layout.micro_batch * shape.seq,
            "layers_in_step": run if job["step"] else 0,
            "times": times,
            "notes": notes,
            "torch_version": torch.__version__,
        }
    finally:
        dist.destroy_process_group()
