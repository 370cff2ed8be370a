"""Tensor parallelism on real ranks, Megatron-style: each weight cut across ranks.

Each rank holds and multiplies 1/N of every weight. ``y = x @ W.T + b`` is cut by
output features (:class:`ColumnParallelLinear`: rows of ``W``, from the whole input)
or by input features (:class:`RowParallelLinear`: columns of ``W``; an all-reduce
sums the parts). :class:`TensorParallelMLP` chains the two, with the activation on
each rank's slice: one all-reduce forward, one backward, whatever N is. The talking
is three small autograd functions (:func:`copy_to_ranks`, :func:`reduce_from_ranks`,
:func:`gather_from_ranks`); :mod:`workshop.parallel.tensor_check` checks the cut
against the unsplit layer.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..checks import whole
from ..env import group_place

__all__ = [
    "ACTIVATIONS",
    "ColumnParallelLinear",
    "CopyToRanks",
    "GatherFromRanks",
    "ReduceFromRanks",
    "RowParallelLinear",
    "TensorParallelMLP",
    "copy_to_ranks",
    "gather_from_ranks",
    "per_rank",
    "reduce_from_ranks",
]

#: The activations :class:`TensorParallelMLP` takes: both act on each number alone,
#: so each rank can apply them to its own slice of the hidden features.
ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu}


# --- the three communication steps ---------------------------------------------------


def _group() -> tuple[int, int]:
    """(rank, world_size) of the default group; a clear error outside ranks."""
    return group_place("tensor parallelism", "workshop.launch(fn, world_size=N)")


class CopyToRanks(torch.autograd.Function):
    """Identity forward; all-reduce (sum) of the gradient backward: before a
    column-split layer, each rank's slice gives only its part of the input's grad."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        _group()
        return x.view_as(x)  # a new tensor object, so autograd records this step

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        # A copy: the all-reduce works in place, and autograd may still hold grad.
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromRanks(torch.autograd.Function):
    """All-reduce (sum) forward; identity backward: after a row-split layer, the
    sum's gradient reaches each rank's partial product unchanged."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        _group()
        total = x.contiguous().clone()  # the caller's partial product stays as it was
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class GatherFromRanks(torch.autograd.Function):
    """All-gather along the last dimension forward; this rank's slice backward
    (every rank holds the same whole gradient, so slice r of it is rank r's)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        rank, world_size = _group()
        ctx.rank, ctx.world_size = rank, world_size
        x = x.contiguous()
        # The list form: gloo runs it on every torch release (all_gather_into_tensor
        # is newer there).
        parts = [torch.empty_like(x) for _ in range(world_size)]
        dist.all_gather(parts, x)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.chunk(ctx.world_size, dim=-1)[ctx.rank].contiguous()


def copy_to_ranks(x: torch.Tensor) -> torch.Tensor:
    """``x`` unchanged forward; backward, its gradient summed over the ranks (only
    when ``x`` requires a gradient, as every hidden state in a network does).

    Raises:
        RuntimeError: no process group is initialised (not inside ranks).
    """
    return CopyToRanks.apply(x)


def reduce_from_ranks(x: torch.Tensor) -> torch.Tensor:
    """The sum of every rank's ``x`` forward (one all-reduce); the gradient
    unchanged backward.

    Raises:
        RuntimeError: no process group is initialised (not inside ranks).

    Example (inside a rank of 2, where rank r passes tensor([r + 1.])):
        >>> reduce_from_ranks(torch.tensor([rank + 1.0]))  # doctest: +SKIP
        tensor([3.])
    """
    return ReduceFromRanks.apply(x)


def gather_from_ranks(x: torch.Tensor) -> torch.Tensor:
    """Every rank's ``x`` joined along the last dimension in rank order forward (one
    all-gather; every rank's ``x`` must have the same shape); backward, this
    rank's slice of the gradient.

    Raises:
        RuntimeError: no process group is initialised (not inside ranks).

    Example (inside a rank of 2, where rank r passes tensor([r, r])):
        >>> gather_from_ranks(torch.tensor([rank, rank]))  # doctest: +SKIP
        tensor([0, 0, 1, 1])
    """
    return GatherFromRanks.apply(x)


# --- checks of what a layer is cut into ----------------------------------------------


def _check_place(rank: int, world_size: int, who: str) -> None:
    whole(
        f"{who}: world_size",
        world_size,
        1,
        fix="pass the number of ranks (dist.get_world_size() inside a rank)",
    )
    whole(
        f"{who}: rank",
        rank,
        0,
        world_size - 1,
        fix=f"one of the {world_size} ranks; pass this rank's number "
        "(dist.get_rank() inside a rank)",
    )
    if dist.is_available() and dist.is_initialized():
        found = (dist.get_rank(), dist.get_world_size())
        if (rank, world_size) != found:
            raise ValueError(
                f"{who}: rank={rank}, world_size={world_size} were passed, but this "
                f"process is rank {found[0]} of {found[1]}; pass rank=dist.get_rank(), "
                "world_size=dist.get_world_size(), or the slices will not fit together"
            )


def _check_linear(layer: Any, who: str, name: str) -> None:
    if not isinstance(layer, nn.Linear):
        raise ValueError(
            f"{who}: {name} is a {type(layer).__name__}, not a torch.nn.Linear; pass "
            "the whole (unsplit) nn.Linear layer whose weight is to be cut"
        )


def per_rank(n: int, world_size: int, who: str, what: str, layer: str) -> int:
    """``n / world_size``, or a clear error when the slices would differ in size."""
    if n % world_size:
        fits = [d for d in range(1, n + 1) if n % d == 0 and d <= 64]
        raise ValueError(
            f"{who}: {what}={n} is not divisible by world_size={world_size} "
            f"({n} = {n // world_size} x {world_size} + {n % world_size}), so the "
            f"ranks' slices would differ in size; use a world_size that divides {n} "
            f"({', '.join(map(str, fits))}) or a {layer} whose {what} is a multiple "
            f"of {world_size}"
        )
    return n // world_size


def _slice_of(tensor: torch.Tensor, dim: int, start: int, stop: int, device: Any):
    """A trainable copy of ``tensor[start:stop]`` along ``dim``, on ``device``."""
    part = tensor.detach().narrow(dim, start, stop - start)
    return nn.Parameter(part.clone().to(device))


# --- the layers ----------------------------------------------------------------------


class _ParallelLinear(nn.Module):
    """What both cuts share: the checks, this rank's place, a copy of its slice."""

    def _cut(self, full: nn.Linear, rank: int, world_size: int, dim: int, device: Any):
        who = type(self).__name__
        _check_linear(full, who, "full")
        _check_place(rank, world_size, who)
        what = ("out_features", "in_features")[dim]
        k = per_rank(getattr(full, what), world_size, who, what, "layer")
        self.rank, self.world_size = rank, world_size
        self.in_features, self.out_features = full.in_features, full.out_features
        span = (rank * k, (rank + 1) * k)
        device = full.weight.device if device is None else device
        self.weight = _slice_of(full.weight, dim, *span, device)
        # A row cut's bias is whole on every rank, added once after the sum.
        cut = (0, full.out_features) if dim else span
        bias = None if full.bias is None else _slice_of(full.bias, 0, *cut, device)
        self.register_parameter("bias", bias)
        return span

    def _where(self, name: str, span: tuple[int, int], of: int) -> str:
        return f"{name}={span} of {of}, rank={self.rank} of {self.world_size}"


class ColumnParallelLinear(_ParallelLinear):
    """This rank's slice of an ``nn.Linear`` cut by output features (Megatron's
    column-parallel linear).

    Rank r holds rows ``r*k:(r+1)*k`` of ``full.weight`` and ``full.bias``
    (``k = out_features / world_size``), copied so it can be checked against ``full``.
    Forward: :func:`copy_to_ranks` (all-reduce of the input's gradient backward),
    this rank's ``k`` output features, and with ``gather_output`` an all-gather.

    Args:
        full: the unsplit layer (left as it was).
        rank: this rank, 0 to ``world_size - 1``.
        world_size: the number of ranks the layer is cut across.
        gather_output: True: every rank returns the whole output (all-gather);
            False: this rank's ``k`` features (what a row-split layer takes next).
        device: where the slice lives; default ``full.weight``'s device (inside a
            rank, pass ``rank_device()`` or move ``full`` there first).

    Attributes:
        rows: (start, stop) of the rows of ``full.weight`` this rank holds; weight:
            shape ``(k, in_features)``; bias: shape ``(k,)`` or None.

    Raises:
        ValueError: ``out_features`` not divisible by ``world_size``; a rank out of
            range or not the process group's; ``full`` not an ``nn.Linear``.

    Example:
        >>> layer = ColumnParallelLinear(nn.Linear(4, 6), rank=1, world_size=2)
        >>> layer.rows, tuple(layer.weight.shape)
        ((3, 6), (3, 4))
    """

    def __init__(
        self,
        full: nn.Linear,
        rank: int,
        world_size: int,
        gather_output: bool = True,
        device: Any = None,
    ):
        super().__init__()
        self.rows = self._cut(full, rank, world_size, 0, device)
        self.gather_output = gather_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mine = F.linear(copy_to_ranks(x), self.weight, self.bias)
        return gather_from_ranks(mine) if self.gather_output else mine

    def extra_repr(self) -> str:
        return self._where("rows", self.rows, self.out_features)


class RowParallelLinear(_ParallelLinear):
    """This rank's slice of an ``nn.Linear`` cut by input features (Megatron's
    row-parallel linear).

    Rank r holds columns ``r*k:(r+1)*k`` of ``full.weight`` (``k = in_features /
    world_size``) and takes that slice of the input (as a ColumnParallelLinear with
    ``gather_output=False`` gives it). The partial products are summed by
    :func:`reduce_from_ranks` (one all-reduce); the bias, whole on every rank, is
    added once, after the sum (before, it would be counted ``world_size`` times).

    Args:
        full: the unsplit layer (left as it was).
        rank: this rank, 0 to ``world_size - 1``.
        world_size: the number of ranks the layer is cut across.
        device: where the slice lives; default ``full.weight``'s device.

    Attributes:
        columns: (start, stop) of the columns of ``full.weight`` (the input's
            features) this rank holds; weight: shape ``(out_features, k)``; bias:
            shape ``(out_features,)`` or None.

    Raises:
        ValueError: ``in_features`` not divisible by ``world_size``; a rank out of
            range or not the process group's; ``full`` not an ``nn.Linear``; in
            forward, an input whose last dimension is not ``k``.

    Example:
        >>> layer = RowParallelLinear(nn.Linear(6, 4), rank=0, world_size=3)
        >>> layer.columns, tuple(layer.weight.shape), tuple(layer.bias.shape)
        ((0, 2), (4, 2), (4,))
    """

    def __init__(self, full: nn.Linear, rank: int, world_size: int, device: Any = None):
        super().__init__()
        self.columns = self._cut(full, rank, world_size, 1, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start, stop = self.columns
        if x.shape[-1] != stop - start:
            raise ValueError(
                f"RowParallelLinear on rank {self.rank} takes its slice of "
                f"{stop - start} input features, but the input's last dimension is "
                f"{x.shape[-1]}; pass x[..., {start}:{stop}] of the whole input, or "
                "the output of a ColumnParallelLinear(..., gather_output=False)"
            )
        total = reduce_from_ranks(F.linear(x, self.weight))
        return total if self.bias is None else total + self.bias

    def extra_repr(self) -> str:
        return self._where("columns", self.columns, self.in_features)


class TensorParallelMLP(nn.Module):
    """An MLP block ``fc2(activation(fc1(x)))`` cut across ranks: fc1 by columns,
    the activation on this rank's hidden slice, fc2 by rows. One all-reduce forward,
    one backward; the hidden activations never leave their rank.

    Args:
        fc1: the unsplit first layer, ``d_model -> d_hidden``.
        fc2: the unsplit second layer, ``d_hidden -> d_model``.
        rank, world_size: this rank, and the number of ranks.
        activation: "gelu" (as in GPT's MLP) or "relu": each acts on each number
            alone, so the cut passes through it without communication.
        device: where the slices live; default fc1's device.

    Raises:
        ValueError: ``d_hidden`` not divisible by ``world_size``, fc1's outputs not
            fc2's inputs, an unknown activation, or a bad rank (see the layers).

    Example:
        >>> mlp = TensorParallelMLP(nn.Linear(4, 8), nn.Linear(8, 4), 1, 2)
        >>> mlp.fc1.rows, mlp.fc2.columns
        ((4, 8), (4, 8))
    """

    def __init__(
        self,
        fc1: nn.Linear,
        fc2: nn.Linear,
        rank: int,
        world_size: int,
        activation: str = "gelu",
        device: Any = None,
    ):
        super().__init__()
        who = "TensorParallelMLP"
        _check_linear(fc1, who, "fc1")
        _check_linear(fc2, who, "fc2")
        if fc1.out_features != fc2.in_features:
            raise ValueError(
                f"{who}: fc1 gives {fc1.out_features} features but fc2 takes "
                f"{fc2.in_features}; pass layers of one block, nn.Linear(d_model, "
                "d_hidden) and nn.Linear(d_hidden, d_model)"
            )
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"{who}: activation={activation!r} is not one of "
                f"{sorted(ACTIVATIONS)}; pass 'gelu' or 'relu' (each acts on each "
                "number alone)"
            )
        _check_place(rank, world_size, who)
        per_rank(fc1.out_features, world_size, who, "d_hidden", "block")
        device = fc1.weight.device if device is None else device
        self.activation = activation
        self.fc1 = ColumnParallelLinear(fc1, rank, world_size, False, device)
        self.fc2 = RowParallelLinear(fc2, rank, world_size, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(ACTIVATIONS[self.activation](self.fc1(x)))
