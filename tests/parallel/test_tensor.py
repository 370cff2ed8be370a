"""Tensor parallelism on real ranks: column, row and MLP splits give the unsplit layer's
output and gradients, with exactly the collectives Megatron's design needs, and the
byte counts the lesson quotes."""

from __future__ import annotations

import doctest

import pytest
import torch
import torch.distributed as dist
from torch import nn

import workshop.parallel.tensor
import workshop.parallel.tensor_check
from workshop import launch
from workshop.comm.costmodel import bus_factor
from workshop.parallel.tensor import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallelMLP,
    copy_to_ranks,
)
from workshop.parallel.tensor_check import (
    check_parallel_linear,
    check_tensor_parallel,
    column_parallel_demo,
    tensor_parallel_bytes,
)
from workshop.training.precision import RELATIVE_TOLERANCE

# The checks allow RELATIVE_TOLERANCE (1e-5) of the largest number compared; the
# numbers here stay below 20, so no difference may pass 2e-4.
LARGEST_TOLERANCE = 2e-4


def _every_split():
    """In each rank: every split checked by the package, and an MLP on a 3-D input
    compared here by hand (torch's own init, the same seed on every rank)."""
    results = {
        "column, gathered": check_parallel_linear("column", True),
        "column, sliced": check_parallel_linear("column", False),
        "row": check_parallel_linear("row"),
        "mlp, gelu": check_tensor_parallel(),
        "mlp, relu": check_tensor_parallel(batch=4, d_hidden=32, activation="relu"),
    }
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
    fc1, fc2 = nn.Linear(12, 8 * world_size), nn.Linear(8 * world_size, 12)
    x = torch.randn(3, 5, 12)
    mlp = TensorParallelMLP(fc1, fc2, rank, world_size)
    x_whole, x_split = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_whole = fc2(torch.nn.functional.gelu(fc1(x_whole)))
    y_split = mlp(x_split)
    y_whole.square().sum().backward()
    y_split.square().sum().backward()
    rows = slice(*mlp.fc1.rows)
    pairs = [
        (y_split, y_whole),
        (x_split.grad, x_whole.grad),
        (mlp.fc1.weight.grad, fc1.weight.grad[rows]),
        (mlp.fc2.weight.grad, fc2.weight.grad[:, rows]),
        (mlp.fc2.bias.grad, fc2.bias.grad),
    ]
    results["by hand"] = [torch.allclose(a, b, atol=1e-5) for a, b in pairs]
    return results


@pytest.fixture(scope="module", params=[2, 4])
def splits(request):
    world_size = request.param
    result = launch(_every_split, world_size=world_size, backend="gloo", show="none")
    return world_size, result.returns


@pytest.mark.parametrize(
    "name", ["column, gathered", "column, sliced", "row", "mlp, gelu", "mlp, relu"]
)
def test_every_split_gives_the_unsplit_outputs_and_gradients(splits, name):
    world_size, returns = splits
    for rank, found in enumerate(returns):
        check = found[name]
        assert (check["rank"], check["world_size"]) == (rank, world_size)
        assert check["tolerance"] <= LARGEST_TOLERANCE
        assert check["tolerance"] >= RELATIVE_TOLERANCE
        assert all(d <= check["tolerance"] for d in check["max_abs_diff"].values())
        assert check["ok"]


def test_an_mlp_on_a_3d_input_matches_the_unsplit_block_by_hand(splits):
    _, returns = splits
    assert [found["by hand"] for found in returns] == [[True] * 5] * len(returns)


def test_each_rank_holds_its_slice_and_only_that(splits):
    world_size, returns = splits
    k = 64 // world_size  # check_tensor_parallel: d_model 16, d_hidden 64
    for rank, found in enumerate(returns):
        mlp = found["mlp, gelu"]
        assert mlp["hidden_slice"] == [rank * k, (rank + 1) * k]
        assert mlp["shapes"] == {
            "fc1.weight": [k, 16],
            "fc1.bias": [k],
            "fc2.weight": [16, k],
            "fc2.bias": [16],  # whole: added once, after the all-reduce
        }
        assert mlp["loss"] == pytest.approx(mlp["loss_unsplit"], rel=1e-5)
        column = found["column, sliced"]  # d_in 16, d_out 32
        assert column["shapes"]["output"] == [8, 32 // world_size]
        assert found["column, gathered"]["shapes"]["output"] == [8, 32]
        row = found["row"]
        assert row["shapes"]["input"] == [8, 16 // world_size]
        assert row["shapes"]["weight"] == [32, 16 // world_size]


# --- the calls the trace records ------------------------------------------------------


def _traced_splits():
    check_tensor_parallel(batch=5, d_model=6, d_hidden=12)
    check_parallel_linear("column", True, batch=5, d_in=6, d_out=12)
    check_parallel_linear("column", False, batch=5, d_in=6, d_out=12)
    check_parallel_linear("row", batch=5, d_in=6, d_out=12)


def test_the_trace_holds_one_all_reduce_forward_and_one_backward_per_mlp_step():
    world_size = 3
    result = launch(
        _traced_splits, world_size=world_size, backend="gloo", trace=True, show="none"
    )
    for events in result.traces:
        calls = [(e.op, e.shapes, e.nbytes) for e in events]
        assert calls == [
            # The MLP: fc2's partial outputs forward, the input's gradient backward,
            # each 5 x 6 float32 numbers.
            ("all_reduce", [(5, 6)], 120),
            ("all_reduce", [(5, 6)], 120),
            # Column, gathered: the output's slices (5 x 4 each) gathered forward,
            # the input's gradient summed backward.
            ("all_gather", [(5, 4)] * 4, 4 * 80),
            ("all_reduce", [(5, 6)], 120),
            # Column, sliced: only the backward all-reduce.
            ("all_reduce", [(5, 6)], 120),
            # Row: the partial outputs (5 x 12) summed forward; nothing backward.
            ("all_reduce", [(5, 12)], 240),
        ]
        assert {e.reduce_op for e in events if e.op == "all_reduce"} == {"sum"}
        assert events[0].end <= events[1].start  # forward, then backward
    # The byte count the lesson quotes is built from the same two calls.
    counted = tensor_parallel_bytes(6, 12, batch=5, world_size=world_size)
    mlp_calls = result.traces[0][:2]
    assert counted["activation_bytes"] == mlp_calls[0].nbytes
    assert counted["tensor_parallel"] == pytest.approx(
        bus_factor(world_size) * sum(e.nbytes for e in mlp_calls)
    )


# --- the small demo for the picture ---------------------------------------------------


def test_the_demo_gathers_the_whole_layers_output_from_its_slices():
    result = launch(column_parallel_demo, world_size=2, backend="gloo", show="none")
    first, second = result.returns
    weight, x = first["weight"], first["input"]
    by_hand = [sum(w * v for w, v in zip(row, x, strict=True)) for row in weight]
    assert first["full_output"] == by_hand
    assert (first["rows"], second["rows"]) == ([0, 2], [2, 4])
    for demo in result.returns:
        assert demo["weight_slice"] == weight[slice(*demo["rows"])]
        assert demo["output_slice"] == by_hand[slice(*demo["rows"])]
        assert demo["gathered_output"] == by_hand
    assert all(v == int(v) for v in by_hand)  # whole numbers, to read off a picture


# --- the byte counts ------------------------------------------------------------------


def test_the_byte_counts_match_numbers_worked_by_hand():
    # A GPT-like block: d_model 1024, d_hidden 4096, 8 tokens a step, 4 ranks, fp32.
    b = tensor_parallel_bytes(1024, 4096, batch=8, world_size=4)
    parameters = 2 * 1024 * 4096 + 4096 + 1024  # 8,393,728
    assert b["parameters"] == parameters == 8_393_728
    assert b["parameters_per_rank"] == 2_098_176 + 1024  # a quarter, fc2.bias whole
    assert b["ring_factor"] == 1.5
    assert b["activation_bytes"] == 8 * 1024 * 4 == 32_768
    assert b["tensor_parallel"] == 2 * 1.5 * 32_768 == 98_304
    assert b["data_parallel"] == 1.5 * parameters * 4 == 50_362_368
    assert b["break_even_batch"] == parameters / 2048 == 4098.5
    assert b["less"] == "tensor"
    assert (b["tensor_parallel_all_reduces"], b["data_parallel_all_reduces"]) == (2, 1)
    # 8192 tokens a step: the activations now outweigh the gradients.
    big = tensor_parallel_bytes(1024, 4096, batch=8192, world_size=4)
    assert big["tensor_parallel"] == 3 * 8192 * 1024 * 4 == 100_663_296
    assert big["less"] == "data"
    # bfloat16 halves both; one rank sends nothing either way.
    half = tensor_parallel_bytes(1024, 4096, batch=8, world_size=4, dtype_bytes=2)
    assert (half["tensor_parallel"], half["data_parallel"]) == (49_152, 25_181_184)
    alone = tensor_parallel_bytes(16, 64, batch=8, world_size=1)
    assert (alone["tensor_parallel"], alone["data_parallel"], alone["less"]) == (
        0,
        0,
        "equal",
    )


def test_bad_byte_count_arguments_are_explained():
    with pytest.raises(
        ValueError,
        match=r"tensor_parallel_bytes: batch must be a whole number, 1 or more, not 0",
    ):
        tensor_parallel_bytes(16, 64, batch=0, world_size=2)
    with pytest.raises(
        ValueError, match=r"d_hidden=10 is not divisible by world_size=4"
    ):
        tensor_parallel_bytes(16, 10, batch=8, world_size=4)


# --- errors ---------------------------------------------------------------------------


def test_an_uneven_split_is_refused_with_the_sizes_that_would_work():
    with pytest.raises(
        ValueError,
        match=r"ColumnParallelLinear: out_features=10 is not divisible by "
        r"world_size=4 \(10 = 2 x 4 \+ 2\), so the ranks' slices would differ in "
        r"size; use a world_size that divides 10 \(1, 2, 5, 10\) or a layer whose "
        r"out_features is a multiple of 4",
    ):
        ColumnParallelLinear(nn.Linear(4, 10), rank=0, world_size=4)
    with pytest.raises(
        ValueError,
        match=r"RowParallelLinear: in_features=6 is not divisible by world_size=4 "
        r"\(6 = 1 x 4 \+ 2\).*divides 6 \(1, 2, 3, 6\)",
    ):
        RowParallelLinear(nn.Linear(6, 4), rank=0, world_size=4)
    with pytest.raises(
        ValueError,
        match=r"TensorParallelMLP: d_hidden=6 is not divisible by world_size=4.*"
        r"a block whose d_hidden is a multiple of 4",
    ):
        TensorParallelMLP(nn.Linear(8, 6), nn.Linear(6, 8), rank=0, world_size=4)


def test_other_bad_layers_are_explained():
    with pytest.raises(
        ValueError,
        match=r"rank must be a whole number from 0 to 1, "
        r"not 2; one of the 2",
    ):
        ColumnParallelLinear(nn.Linear(4, 4), rank=2, world_size=2)
    with pytest.raises(
        ValueError,
        match=r"world_size must be a whole number, "
        r"1 or more, not 0; pass the",
    ):
        RowParallelLinear(nn.Linear(4, 4), rank=0, world_size=0)
    with pytest.raises(ValueError, match=r"full is a Conv1d, not a torch.nn.Linear"):
        ColumnParallelLinear(nn.Conv1d(4, 4, 1), rank=0, world_size=2)
    with pytest.raises(
        ValueError, match=r"fc1 gives 8 features but fc2 takes 6; pass layers of one"
    ):
        TensorParallelMLP(nn.Linear(4, 8), nn.Linear(6, 4), rank=0, world_size=2)
    with pytest.raises(ValueError, match=r"activation='tanh' is not one of"):
        TensorParallelMLP(nn.Linear(4, 8), nn.Linear(8, 4), 0, 2, activation="tanh")
    row = RowParallelLinear(nn.Linear(8, 4), rank=1, world_size=2)
    with pytest.raises(
        ValueError,
        match=r"RowParallelLinear on rank 1 takes its slice of 4 input features, but "
        r"the input's last dimension is 8; pass x\[\.\.\., 4:8\]",
    ):
        row(torch.ones(2, 8))
    with pytest.raises(RuntimeError, match=r"no process group is initialised"):
        copy_to_ranks(torch.ones(2))


def _mistakes_in_a_rank():
    """The messages a rank gets: a slice for another rank, and an uneven check."""
    found = []
    try:
        ColumnParallelLinear(nn.Linear(4, 4), rank=0, world_size=dist.get_world_size())
    except ValueError as exc:
        found.append(str(exc))
    try:
        check_tensor_parallel(d_hidden=9)
    except ValueError as exc:
        found.append(str(exc))
    return found


def test_inside_ranks_a_wrong_rank_and_an_uneven_check_are_explained():
    result = launch(_mistakes_in_a_rank, world_size=2, backend="gloo", show="none")
    first, second = result.returns
    uneven = (
        "TensorParallelMLP: d_hidden=9 is not divisible by world_size=2 "
        "(9 = 4 x 2 + 1), so the ranks' slices would differ in size; use a "
        "world_size that divides 9 (1, 3, 9) or a block whose d_hidden is a "
        "multiple of 2"
    )
    assert first == [uneven]  # rank 0 passed its own rank: no complaint there
    assert second == [
        "ColumnParallelLinear: rank=0, world_size=2 were passed, but this process "
        "is rank 1 of 2; pass rank=dist.get_rank(), world_size=dist.get_world_size(), "
        "or the slices will not fit together",
        uneven,
    ]


def test_the_docstring_examples_run():
    for module in (workshop.parallel.tensor, workshop.parallel.tensor_check):
        assert doctest.testmod(module).failed == 0, module.__name__
