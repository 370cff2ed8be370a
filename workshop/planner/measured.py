"""The planner's estimate against a real run: 2 to 4 ranks train the same transformer.

:func:`measure_layout` runs on every rank of a :func:`workshop.launch`, splits the
planner's transformer with PyTorch's own tools (DDP or FSDP2, DTensor), trains a few
Adam steps and measures the bytes each rank holds and the step time, with what the
estimator needs to predict it here: the FLOP/s of the blocks alone and a small and a
large all-reduce (alpha and beta read off two points, not fitted, so a noisy machine
cannot bend a fit). :func:`layout_machine` turns them into GPU and Network records.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..env import group_place, rank_device
from ..features import fsdp2_fully_shard
from ..training.models import held_bytes
from .fake_rank import tensor_parallel
from .layout import GPU, Layout, Network, check_counts, model_shape
from .transformer import build_transformer

__all__ = ["layout_machine", "measure_layout", "measured_against_estimate"]

_SMALL, _LARGE = 1 << 10, 1 << 24  # bytes of the two timed all-reduces


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(call, device: torch.device, repeats: int) -> float:
    """The median of ``repeats`` timings of ``call()``, in seconds."""
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        call()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the logits this rank holds. Under tensor parallelism the head
    gives each rank a slice of the vocabulary; the targets are folded into it, a
    stand-in for a vocabulary-parallel loss with the same saved tensors."""
    return nn.functional.cross_entropy(
        logits.float().flatten(0, 1), targets.flatten() % logits.shape[-1]
    )


def _is_weight(t: torch.Tensor) -> bool:
    """A parameter, FSDP's gathered copy of one, or a view of either (``w.t()``)."""
    base = t._base if t._base is not None else t
    return isinstance(base, nn.Parameter) or (base.is_leaf and base.requires_grad)


def saved_bytes(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> int:
    """Bytes of the tensors one forward pass and its loss save for the backward,
    weights excepted (they are counted as parameters), each storage once."""
    seen: set[int] = set()
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        local = t.to_local() if hasattr(t, "to_local") else t
        # A tensor-parallel all-reduce's result arrives as a wrapper (functional
        # collectives) whose storage is reachable only after it is waited for.
        local = local.wait() if hasattr(local, "wait") else local
        if not _is_weight(t) and local.device.type != "meta":
            storage = local.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_loss(model(tokens), targets).backward()
    model.zero_grad(set_to_none=True)
    return total


def held_by(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds of parameters, gradients and optimizer state (each
    storage once; a sharded tensor by its local shard)."""
    state = [
        t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)
    ]
    params = list(model.parameters())
    held = held_bytes(
        {"params": params, "grads": [p.grad for p in params], "optimizer": state}
    )
    held.pop("total")
    return held


def _split(
    model: nn.Module, layout: Layout, device: torch.device
) -> tuple[nn.Module, str]:
    """Apply ``layout`` to ``model`` with PyTorch's own tools; return it and how."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(
        device.type, (layout.dp, layout.tp), mesh_dim_names=("dp", "tp")
    )
    how = []
    if layout.tp > 1:
        # The same split as the fake-backend check: Megatron's columns and rows in
        # every block, the embedding and the head by vocabulary.
        tensor_parallel(model, mesh["tp"], model.shape.tied, [])
        how.append(f"DTensor tensor parallelism over {layout.tp} ranks")
    if layout.zero == 3:
        fully_shard, found = fsdp2_fully_shard()
        if fully_shard is None:
            raise RuntimeError(found)
        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        how.append(f"FSDP2 fully_shard over {layout.dp} ranks")
    elif layout.dp > 1:
        # DDP over the data-parallel ranks; with tp=1 that is the whole world.
        model = nn.parallel.DistributedDataParallel(model)
        how.append(f"DDP over {layout.dp} ranks")
    return model, "; ".join(how) or "one rank, unsplit"


def measure_layout(
    model: str = "tiny",
    tp: int = 1,
    zero: int = 0,
    micro_batch: int = 4,
    steps: int = 4,
    seed: int = 0,
) -> dict[str, Any]:
    """Train ``model``, split as asked, on this group's ranks; measure memory and time.

    Run on every rank (``workshop.launch(measure_layout, "tiny", 2, 3, world_size=4)``);
    ``dp = world_size / tp``, in fp32 (compare with ``precision="fp32"``).

    Args:
        model: a transformer of :data:`~workshop.planner.layout.MODELS` small enough
            to train here ("tiny", or "gpt2-small" on a GPU).
        tp: tensor-parallel degree; must divide the world size.
        zero: 0 (DDP) or 3 (FSDP2).
        micro_batch: sequences per rank and step.
        steps: timed steps (after one warm-up step).
        seed: seeds the model and the data, the same on every rank.

    Returns:
        ``{"rank", "world_size", "device", "layout": Layout, "how", "held":
        {"params", "grads", "optimizer", "activations"}, "step_s", "alone_flops",
        "allreduce_s": {bytes: seconds}}``.

    Raises:
        ValueError: a module model, ``tp`` not dividing the world, a stage other
            than 0 or 3, or a size below 1.
        RuntimeError: outside a process group.
    """
    shape = model_shape(model)
    if shape.kind != "transformer":
        raise ValueError(
            f"measure_layout trains a transformer; {shape.name!r} is a module"
        )
    check_counts("measure_layout", tp=tp, micro_batch=micro_batch, steps=steps)
    if zero not in (0, 3):
        raise ValueError(
            f"zero={zero!r}: the real run compares DDP (0) and FSDP2 (3); stages 1 "
            "and 2 are measured by measure_zero_memory in notebook 04, section 4"
        )
    rank, world_size = group_place(
        "measure_layout", "workshop.launch(measure_layout, world_size=2)"
    )
    if world_size % tp:
        raise ValueError(
            f"tp={tp} does not divide the world of {world_size} ranks; the "
            "data-parallel degree is world_size / tp"
        )
    layout = Layout(
        dp=world_size // tp, tp=tp, zero=zero, micro_batch=micro_batch, precision="fp32"
    )
    layout.check_fits(shape)
    device = rank_device()

    torch.manual_seed(seed)
    whole = build_transformer(shape, device=device)
    whole.apply(
        lambda m: m.reset_parameters() if hasattr(m, "reset_parameters") else None
    )
    g = torch.Generator().manual_seed(seed + 1)
    tokens, targets = (
        torch.randint(0, shape.vocab, (micro_batch, shape.seq), generator=g).to(device)
        for _ in range(2)
    )

    # What one rank reaches alone, a whole training step of the unsplit model with
    # Adam: the estimator's "peak" on this machine.
    alone_optimizer = torch.optim.Adam(whole.parameters(), lr=1e-3)

    def alone_step() -> None:
        token_loss(whole(tokens), targets).backward()
        alone_optimizer.step()
        alone_optimizer.zero_grad(set_to_none=True)

    alone_step()  # warm-up: Adam makes its state
    alone = _timed(alone_step, device, 3)
    flops = micro_batch * shape.seq * shape.flops_per_token() / alone

    # alpha and beta from two all-reduces, every rank timing the same calls.
    allreduce = {}
    for nbytes in (_SMALL, _LARGE):
        x = torch.ones(nbytes // 4, device=device)
        dist.all_reduce(x)  # warm-up: the first call sets up the connections
        allreduce[nbytes] = _timed(lambda x=x: dist.all_reduce(x), device, 5)

    split, how = _split(whole, layout, device)
    optimizer = torch.optim.Adam(split.parameters(), lr=1e-3)

    def step() -> None:
        optimizer.zero_grad(set_to_none=False)
        token_loss(split(tokens), targets).backward()
        optimizer.step()

    step()  # warm-up: Adam makes its state, FSDP its buffers
    step_s = _timed(step, device, steps)
    held = held_by(split, optimizer)
    held["activations"] = saved_bytes(split, tokens, targets)
    return {
        "rank": rank,
        "model": shape.name,
        "world_size": world_size,
        "device": str(device),
        "layout": layout,
        "how": how,
        "held": held,
        "step_s": step_s,
        "alone_flops": flops,
        "allreduce_s": allreduce,
    }


def layout_machine(result: dict[str, Any]) -> tuple[GPU, Network]:
    """This machine as the estimator's records, from one rank's :func:`measure_layout`.

    The "GPU" reaches ``alone_flops`` (so ``mfu=1``); alpha is the small all-reduce
    over its ``2 (n - 1)`` messages, the bandwidth the large one's after alpha.

    Raises:
        ValueError: a result without those figures.
    """
    try:
        n, flops, times = (
            result["world_size"],
            result["alone_flops"],
            result["allreduce_s"],
        )
        small, large = times[_SMALL], times[_LARGE]
    except (KeyError, TypeError) as exc:
        raise ValueError(
            f"layout_machine needs one rank's result of measure_layout; missing {exc}"
        ) from None
    messages = max(2 * (n - 1), 1)
    alpha = small / messages
    # max(): on a loaded machine the large call can be no slower than the small one.
    beta_time = max(large - small, 1e-9)
    bandwidth = 2 * (n - 1) / n * _LARGE / beta_time if n > 1 else float("inf")
    tflops = flops / 1e12
    gpu = GPU(
        f"{result['device']} (measured)",
        memory_gb=0.0,
        bf16_tflops=tflops,
        fp32_tflops=tflops,
        source="measured by measure_layout on this machine",
    )
    net = Network(
        f"{result['device']} (measured)",
        bandwidth / 1e9,
        bandwidth / 1e9,
        alpha,
        alpha,
        "measured by measure_layout: two all-reduces",
    )
    return gpu, net


def measured_against_estimate(results: list[dict[str, Any]]) -> str:
    """The estimate of the run's layout beside what its ranks measured, as a table.

    The estimate is for this machine as :func:`layout_machine` describes it; memory
    is rank 0's, the step the slowest rank's.

    Raises:
        ValueError: no results, or results of :func:`measure_layout` missing a figure.
    """
    from .estimator import estimate

    if not results:
        raise ValueError(
            "measured_against_estimate needs the ranks' results of measure_layout"
        )
    first = results[0]
    gpu, network = layout_machine(first)
    layout = first["layout"]
    est = estimate(
        first.get("model", "tiny"),
        layout,
        gpu,
        network,
        gpus_per_node=first["world_size"],
        mfu=1.0,
    )
    rows = [
        (term, est.memory[key], first["held"][name])
        for term, key, name in (
            ("parameters", "parameters", "params"),
            ("gradients", "gradients", "grads"),
            ("optimizer state", "optimizer", "optimizer"),
            ("activations", "activations", "activations"),
        )
    ]
    lines = [
        f"{layout.describe()} on {first['world_size']} {first['device']} ranks",
        f"{'':<22}{'estimate':>14}{'measured':>14}{'measured/est':>14}",
    ]
    for term, guess, seen in rows:
        ratio = f"{seen / guess:.3f}" if guess else "-"
        lines.append(f"{term + ' (bytes)':<22}{guess:>14,.0f}{seen:>14,}{ratio:>14}")
    slowest = max(r["step_s"] for r in results)
    lines.append(
        f"{'step (ms)':<22}{est.step * 1e3:>14.1f}{slowest * 1e3:>14.1f}"
        f"{slowest / est.step:>14.2f}"
    )
    return "\n".join(lines)
