"""Tensor parallelism checked against the unsplit computation, inside real ranks.

Each check runs in every rank: it builds the same layers and input from ``seed``,
runs the unsplit computation locally and the split one across the ranks, and
returns plain data: how far apart the two are, and what slice this rank holds.
:func:`tensor_parallel_bytes` is plain arithmetic: what tensor and data parallelism
each send per step. Under ``launch(..., trace=True)`` the trace shows the
collectives the split made::

    from workshop import launch
    from workshop.parallel.tensor_check import check_tensor_parallel

    result = launch(check_tensor_parallel, world_size=4, trace=True)
    result.returns[0]["max_abs_diff"]          # all near 1e-7
    [e.op for e in result.traces[0]]            # ['all_reduce', 'all_reduce']
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..checks import whole
from ..comm.costmodel import bus_factor
from ..env import group_place, rank_device

# The split sums the same float32 products in another order (the all-reduce adds
# the ranks' partial sums), so the results agree within RELATIVE_TOLERANCE.
from ..training.precision import RELATIVE_TOLERANCE
from .tensor import (
    ACTIVATIONS,
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallelMLP,
    gather_from_ranks,
    per_rank,
)

__all__ = [
    "check_parallel_linear",
    "check_tensor_parallel",
    "column_parallel_demo",
    "tensor_parallel_bytes",
]


def _check_sizes(who: str, **sizes: int) -> None:
    for name, value in sizes.items():
        whole(f"{who}: {name}", value)


def _linear(d_in: int, d_out: int, g: torch.Generator, bias: bool = True):
    """nn.Linear's own initial range, drawn from ``g``: every rank builds the same."""
    layer = nn.Linear(d_in, d_out, bias=bias)
    bound = 1 / math.sqrt(d_in)
    with torch.no_grad():
        layer.weight.copy_((torch.rand(d_out, d_in, generator=g) * 2 - 1) * bound)
        if bias:
            layer.bias.copy_((torch.rand(d_out, generator=g) * 2 - 1) * bound)
    return layer


def _loss(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    # A sum over output features: with a column split whose output stays in slices,
    # the whole loss is the sum of the ranks' own losses, so each rank's gradients
    # are the whole loss's gradients of its slice.
    return 0.5 * ((y - target) ** 2).sum()


def _compare(pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
    """Max abs difference of each (split, unsplit) pair, the tolerance, and ok."""
    diffs = {
        name: (split.detach() - whole.detach()).abs().max().item()
        for name, (split, whole) in pairs.items()
    }
    largest = max(whole.detach().abs().max().item() for _, whole in pairs.values())
    tolerance = RELATIVE_TOLERANCE * max(1.0, largest)
    return {
        "max_abs_diff": diffs,
        "tolerance": tolerance,
        "ok": all(d <= tolerance for d in diffs.values()),
    }


def check_parallel_linear(
    split: str = "column",
    gather_output: bool = True,
    batch: int = 8,
    d_in: int = 16,
    d_out: int = 32,
    seed: int = 0,
) -> dict[str, Any]:
    """In every rank: one ``nn.Linear(d_in, d_out)`` cut across the ranks, against
    the whole layer, forward and backward through ``0.5 * sum((y - target)**2)``.

    Args:
        split: "column" or "row".
        gather_output: column split only: gather the output on every rank.
        batch, d_in, d_out: the input's rows and the layer's sizes.
        seed: the seed every rank builds the layer, input and target from.

    Returns:
        A dict: ``split``, ``gather_output``, ``rank``, ``world_size``,
        ``max_abs_diff`` (``output``, ``input_grad``, ``weight.grad``,
        ``bias.grad`` against the unsplit slice), ``tolerance``, ``ok``, ``slice``
        ([start, stop) of the weight's rows or columns held) and ``shapes``.

    Raises:
        ValueError: an unknown split, a size below 1, or a size the ranks cannot
            share evenly (``d_out`` for a column split, ``d_in`` for a row split).
        RuntimeError: called outside ranks.

    Example (a cell)::

        launch(check_parallel_linear, "row", world_size=2).returns[0]["ok"]  # True
    """
    if split not in ("column", "row"):
        raise ValueError(
            f"check_parallel_linear: split={split!r}; pass 'column' (cut by output "
            "features) or 'row' (cut by input features)"
        )
    _check_sizes("check_parallel_linear", batch=batch, d_in=d_in, d_out=d_out)
    rank, world_size = group_place("check_parallel_linear")
    device = rank_device()
    g = torch.Generator().manual_seed(seed)
    full = _linear(d_in, d_out, g).to(device)
    x = torch.randn(batch, d_in, generator=g).to(device)
    target = torch.randn(batch, d_out, generator=g).to(device)
    column = split == "column"
    if column:
        layer = ColumnParallelLinear(full, rank, world_size, gather_output, device)
        start, stop = layer.rows
    else:
        layer = RowParallelLinear(full, rank, world_size, device)
        start, stop = layer.columns
    # A column split cuts the weight's rows (outputs), a row split its columns
    # (inputs); the uncut side of each is whole.
    rows = slice(start, stop) if column else slice(None)
    cols = slice(None) if column else slice(start, stop)
    x_split = x[:, cols].clone().requires_grad_()
    # The unsplit layer, on this rank alone.
    x_whole = x.clone().requires_grad_()
    y_whole = full(x_whole)
    _loss(y_whole, target).backward()
    # The split layer, across the ranks.
    y_split = layer(x_split)
    sliced = column and not gather_output
    _loss(y_split, target[:, rows] if sliced else target).backward()
    pairs = {
        "output": (y_split, y_whole[:, rows] if sliced else y_whole),
        "input_grad": (x_split.grad, x_whole.grad[:, cols]),
        "weight.grad": (layer.weight.grad, full.weight.grad[rows, cols]),
        "bias.grad": (layer.bias.grad, full.bias.grad[rows]),
    }
    return {
        "split": split,
        "gather_output": gather_output if column else None,
        "rank": rank,
        "world_size": world_size,
        **_compare(pairs),
        "slice": [start, stop],
        "shapes": {
            "weight": list(layer.weight.shape),
            "bias": list(layer.bias.shape),
            "input": list(x_split.shape),
            "output": list(y_split.shape),
        },
    }


def check_tensor_parallel(
    batch: int = 8,
    d_model: int = 16,
    d_hidden: int = 64,
    seed: int = 0,
    activation: str = "gelu",
) -> dict[str, Any]:
    """In every rank: an MLP block ``fc2(gelu(fc1(x)))`` cut across the ranks
    (:class:`~workshop.parallel.tensor.TensorParallelMLP`), against the whole block,
    forward and backward; a trace holds just its two all-reduces.

    Args:
        batch: rows of the input.
        d_model: the block's input and output features.
        d_hidden: its hidden features; a multiple of the world size.
        seed: the seed every rank builds the layers, input and target from.
        activation: "gelu" or "relu".

    Returns:
        A dict: ``rank``, ``world_size``, ``activation``, ``max_abs_diff`` (of
        ``output``, ``input_grad`` and each slice's gradient against the unsplit
        one's), ``tolerance``, ``ok``, ``loss``, ``loss_unsplit``, ``hidden_slice``
        ([start, stop) of the hidden features held), and ``shapes`` of what this
        rank holds beside ``full_shapes``.

    Raises:
        ValueError: a size below 1, ``d_hidden`` not divisible by the world size, or
            an unknown activation.
        RuntimeError: called outside ranks.

    Example (a cell)::

        launch(check_tensor_parallel, world_size=4).returns[0]["ok"]  # True
    """
    _check_sizes(
        "check_tensor_parallel", batch=batch, d_model=d_model, d_hidden=d_hidden
    )
    rank, world_size = group_place("check_tensor_parallel")
    device = rank_device()
    g = torch.Generator().manual_seed(seed)
    fc1 = _linear(d_model, d_hidden, g).to(device)
    fc2 = _linear(d_hidden, d_model, g).to(device)
    x = torch.randn(batch, d_model, generator=g).to(device)
    target = torch.randn(batch, d_model, generator=g).to(device)
    mlp = TensorParallelMLP(fc1, fc2, rank, world_size, activation, device)
    # The unsplit block, on this rank alone (no communication).
    x_whole = x.clone().requires_grad_()
    y_whole = fc2(ACTIVATIONS[activation](fc1(x_whole)))
    loss_whole = _loss(y_whole, target)
    loss_whole.backward()
    # The split block: one all-reduce forward, one backward.
    x_split = x.clone().requires_grad_()
    y_split = mlp(x_split)
    loss_split = _loss(y_split, target)
    loss_split.backward()
    start, stop = mlp.fc1.rows
    pairs = {
        "output": (y_split, y_whole),
        "input_grad": (x_split.grad, x_whole.grad),
        "fc1.weight.grad": (mlp.fc1.weight.grad, fc1.weight.grad[start:stop]),
        "fc1.bias.grad": (mlp.fc1.bias.grad, fc1.bias.grad[start:stop]),
        "fc2.weight.grad": (mlp.fc2.weight.grad, fc2.weight.grad[:, start:stop]),
        "fc2.bias.grad": (mlp.fc2.bias.grad, fc2.bias.grad),
    }
    held = {"fc1": (mlp.fc1, fc1), "fc2": (mlp.fc2, fc2)}
    shapes = {
        f"{layer}.{p}": (list(getattr(mine, p).shape), list(getattr(full, p).shape))
        for layer, (mine, full) in held.items()
        for p in ("weight", "bias")
    }
    return {
        "rank": rank,
        "world_size": world_size,
        "activation": activation,
        **_compare(pairs),
        "loss": loss_split.item(),
        "loss_unsplit": loss_whole.item(),
        "hidden_slice": [start, stop],
        "shapes": {name: mine for name, (mine, _) in shapes.items()},
        "full_shapes": {name: full for name, (_, full) in shapes.items()},
    }


def column_parallel_demo(
    d_in: int = 4, d_out: int = 4, seed: int = 0
) -> dict[str, Any]:
    """In every rank: a small layer without bias cut by columns, in whole numbers to
    read off a picture: this rank's slices, and the output gathered from every rank.

    Args:
        d_in: input features.
        d_out: output features; a multiple of the world size.
        seed: the seed every rank builds the weight (whole numbers -2 to 2) and the
            input (whole numbers -3 to 3) from.

    Returns:
        A dict of lists: ``rank``, ``world_size``, ``rows`` ([start, stop) of the
        weight's rows this rank holds), ``weight`` (the whole ``d_out x d_in``),
        ``weight_slice``, ``input`` (``d_in`` numbers), ``output_slice``,
        ``gathered_output`` and ``full_output`` (``d_out`` numbers each).

    Raises:
        ValueError: a size below 1, or ``d_out`` not divisible by the world size.
        RuntimeError: called outside ranks.

    Example (a cell)::

        launch(column_parallel_demo, world_size=2).returns[1]["rows"]  # [2, 4]
    """
    _check_sizes("column_parallel_demo", d_in=d_in, d_out=d_out)
    rank, world_size = group_place("column_parallel_demo")
    device = rank_device()
    g = torch.Generator().manual_seed(seed)
    full = nn.Linear(d_in, d_out, bias=False)
    with torch.no_grad():
        full.weight.copy_(torch.randint(-2, 3, (d_out, d_in), generator=g).float())
    full = full.to(device)
    x = torch.randint(-3, 4, (d_in,), generator=g).float().to(device)
    layer = ColumnParallelLinear(full, rank, world_size, False, device)
    with torch.no_grad():
        mine = layer(x)
        gathered = gather_from_ranks(mine)
        whole = full(x)
    return {
        "rank": rank,
        "world_size": world_size,
        "rows": list(layer.rows),
        "weight": full.weight.detach().cpu().tolist(),
        "weight_slice": layer.weight.detach().cpu().tolist(),
        "input": x.cpu().tolist(),
        "output_slice": mine.cpu().tolist(),
        "gathered_output": gathered.cpu().tolist(),
        "full_output": whole.cpu().tolist(),
    }


# --- what each way moves -------------------------------------------------------------


def tensor_parallel_bytes(
    d_model: int, d_hidden: int, batch: int, world_size: int, dtype_bytes: int = 4
) -> dict[str, Any]:
    """Bytes each rank sends per training step for one MLP block
    (``d_model -> d_hidden -> d_model``, with biases), tensor against data parallel.

    Tensor parallel: two ring all-reduces of the activations (``batch x d_model``);
    data parallel: one of every gradient, however large the batch. So tensor
    parallelism moves less about while ``batch < d_hidden`` (``batch``: every sample
    or token through the block in one step).

    Args:
        d_model: the block's input and output features.
        d_hidden: its hidden features.
        batch: samples (tokens) through the block per step.
        world_size: ranks, N.
        dtype_bytes: bytes per number (4 for float32, 2 for bfloat16).

    Returns:
        A dict: ``parameters``, ``parameters_per_rank`` (tensor parallel),
        ``activation_bytes`` (one all-reduce's), ``ring_factor`` (2(N-1)/N),
        ``tensor_parallel`` and ``data_parallel`` (bytes sent per rank per step),
        ``tensor_parallel_all_reduces``, ``data_parallel_all_reduces``,
        ``break_even_batch`` and ``less`` ("tensor", "data" or "equal").

    Raises:
        ValueError: a size below 1, or ``d_hidden`` not divisible by ``world_size``.

    Example:
        >>> b = tensor_parallel_bytes(16, 64, batch=8, world_size=4)
        >>> b["tensor_parallel"], b["data_parallel"], b["less"]
        (1536.0, 12768.0, 'tensor')
    """
    who = "tensor_parallel_bytes"
    sizes = {"d_model": d_model, "d_hidden": d_hidden, "batch": batch}
    _check_sizes(who, **sizes, world_size=world_size, dtype_bytes=dtype_bytes)
    per_rank(d_hidden, world_size, who, "d_hidden", "block")
    parameters = 2 * d_model * d_hidden + d_hidden + d_model
    ring = bus_factor(world_size)
    activation = batch * d_model * dtype_bytes
    tensor = 2 * ring * activation
    data = ring * parameters * dtype_bytes
    less = "equal" if tensor == data else "tensor" if tensor < data else "data"
    return {
        "parameters": parameters,
        # fc1's weight and bias and fc2's weight are cut; fc2's bias is on every rank.
        "parameters_per_rank": (parameters - d_model) // world_size + d_model,
        "activation_bytes": activation,
        "ring_factor": ring,
        "tensor_parallel": tensor,
        "data_parallel": data,
        "tensor_parallel_all_reduces": 2,
        "data_parallel_all_reduces": 1,
        "break_even_batch": parameters / (2 * d_model),
        "less": less,
    }
