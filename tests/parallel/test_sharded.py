"""Sharded data parallelism: the ZeRO memory formula, the hand-written stages 1-3 on
real gloo ranks (the bytes each rank keeps, measured by walking its tensors, against
the formula), every stage and PyTorch's FSDP2 against torch's DistributedDataParallel
through check_sharded, the check notebook 04 runs, and a broken stage it catches."""

from __future__ import annotations

import pytest
import torch

from workshop import launch
from workshop.features import has_collective
from workshop.parallel import sharded, zero_memory
from workshop.parallel.sharded import STEP_TOLERANCE, check_sharded, measure_zero_memory
from workshop.parallel.zero_memory import measure_fsdp_memory
from workshop.planner.memory import stage_number, zero_bytes
from workshop.training.models import held_bytes

STAGES = ("ddp", 1, 2, 3)


# --- the formula -------------------------------------------------------------------
def test_fp32_adam_bytes_per_rank_follow_the_stage_table():
    psi, n = 1000, 4
    assert zero_bytes(psi, n, "ddp") == {
        "params": 4000,
        "grads": 4000,
        "optimizer": 8000,
        "total": 16000,
    }
    assert zero_bytes(psi, n, 1) == {  # 4 Ψ + 4 Ψ + 8 Ψ / N
        "params": 4000,
        "grads": 4000,
        "optimizer": 2000,
        "total": 10000,
    }
    assert zero_bytes(psi, n, 2)["total"] == 4000 + 12000 // 4
    assert zero_bytes(psi, n, "zero-3")["total"] == 16000 // 4
    assert zero_bytes(psi, 1, 3) == zero_bytes(psi, 1, 0)  # one rank: nothing to cut


def test_mixed_precision_bytes_reproduce_the_zero_papers_7_5b_model_on_64_gpus():
    # ZeRO paper, figure 1: Ψ = 7.5 B, N = 64 -> 120, 31.4, 16.6 and 1.9 GB.
    psi, n = 7_500_000_000, 64
    totals = [zero_bytes(psi, n, s, "mixed")["total"] / 1e9 for s in STAGES]
    assert totals == [120.0, 31.40625, 16.640625, 1.875]
    assert zero_bytes(psi, n, 1, "mixed") == {
        "params": 2 * psi,
        "grads": 2 * psi,
        "optimizer": 12 * psi // n,
        "total": 4 * psi + 12 * psi // n,
    }


def test_a_shard_that_does_not_divide_evenly_is_rounded_up_to_a_whole_byte():
    # Ψ = 10 on 3 ranks: 40/3 -> 14 bytes, 80/3 -> 27 bytes.
    assert zero_bytes(10, 3, 3) == {
        "params": 14,
        "grads": 14,
        "optimizer": 27,
        "total": 55,
    }


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: zero_bytes(1000, 4, 4), r"stage=4 is not a ZeRO stage; pass 'ddp'"),
        (lambda: zero_bytes(1000, 4, "zero-5"), r"stage='zero-5' is not a ZeRO"),
        (lambda: zero_bytes(1000, 4, True), r"stage=True is not a ZeRO stage"),
        (
            lambda: zero_bytes(1000, 4, 1, "bf16"),
            r"precision='bf16' is not known; pass one of 'fp32', 'mixed'",
        ),
        (
            lambda: zero_bytes(1000, 0, 1),
            r"world_size must be a whole "
            r"number, 1 or more, not 0; e\.g\. zero_",
        ),
        (
            lambda: zero_bytes(-5, 4, 1),
            r"parameters must be a whole "
            r"number, 1 or more, not -5",
        ),
        (
            lambda: measure_zero_memory(1, width=0),
            r"measure_zero_memory: width must be a whole number, 1 or more, not 0",
        ),
        (
            lambda: measure_fsdp_memory(steps=2.5),
            r"measure_fsdp_memory: steps must be a whole number, 1 or more, not 2.5",
        ),
        (lambda: measure_zero_memory("zero4"), r"stage='zero4' is not a ZeRO stage"),
        (
            lambda: check_sharded("fsdp3"),
            r"stage='fsdp3' is not a ZeRO stage; .*, or 'fsdp2' for PyTorch's",
        ),
        (
            lambda: check_sharded(2, depth=0),
            r"check_sharded: depth must be a whole number, 1 or more, not 0",
        ),
    ],
)
def test_bad_input_is_refused_with_what_was_wrong_and_what_to_pass(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_rank_function_called_outside_a_process_group_says_how_to_launch_it():
    with pytest.raises(RuntimeError, match=r"workshop.launch\(check_sharded"):
        check_sharded(1)


def test_stage_names_and_numbers_mean_the_same_stage():
    assert [stage_number(s) for s in ("DDP", 0, "1", "zero-2", "ZeRO3")] == [
        0,
        0,
        1,
        2,
        3,
    ]


def test_held_bytes_counts_a_storage_shared_by_views_once():
    flat = torch.zeros(100)  # 400 bytes
    state = torch.zeros(10)
    counted = held_bytes(
        {"params": [flat[:50], flat], "grads": [flat[50:], None], "optimizer": [state]}
    )
    assert counted == {"params": 400, "grads": 0, "optimizer": 40, "total": 440}
    assert held_bytes({"params": [torch.zeros(3, device="meta")]})["total"] == 0


# --- the hand-written stages on real ranks ------------------------------------------
def _every_stage(width: int, depth: int) -> dict:
    return {
        str(s): measure_zero_memory(s, width, depth, return_parameters=True)
        for s in STAGES
    }


# Ψ = 263,168 (the defaults) on 2 ranks; Ψ = 12,870 on 4 ranks, which pads.
@pytest.fixture(scope="module", params=[(2, 256, 4), (4, 65, 3)], ids=["2", "4"])
def every_stage(request):
    """Each rank's runs of DDP and stages 1-3, from one launch per world size."""
    world_size, width, depth = request.param
    result = launch(
        _every_stage, width, depth, world_size=world_size, backend="gloo", show="none"
    )
    return world_size, width, depth, result.returns


def test_each_stage_keeps_less_than_the_one_before_as_the_formula_says(every_stage):
    world_size, width, depth, ranks = every_stage
    psi = depth * (width * width + width)
    for rank, runs in enumerate(ranks):
        total = [runs[str(s)]["measured"]["total"] for s in STAGES]
        assert total[3] < total[2] < total[1] < total[0], (rank, total)
        for stage in STAGES:
            run = runs[str(stage)]
            assert run["parameters"] == psi
            assert run["formula"] == zero_bytes(psi, world_size, stage)
            for part in ("params", "grads", "optimizer", "total"):
                # Above the formula only by the padding (at most world_size - 1
                # values of each) and Adam's step counter (4 bytes).
                formula, measured = run["formula"][part], run["measured"][part]
                assert formula <= measured <= 1.02 * formula, (stage, part)


def test_only_stage_3_gathers_the_full_parameters_and_frees_them_after_the_step(
    every_stage,
):
    world_size, _, _, ranks = every_stage
    for runs in ranks:
        three = runs["3"]
        assert three["transient"]["full_params"] == 4 * three["shard"] * world_size
        assert three["measured"]["params"] == 4 * three["shard"]
        for stage in ("ddp", "1", "2"):
            assert runs[stage]["transient"]["full_params"] == 0


def test_every_rank_ends_with_the_same_parameters_and_training_moved_them(
    every_stage,
):
    _, width, depth, ranks = every_stage
    ddp = ranks[0]["ddp"]["final_parameters"]
    assert ddp.numel() == depth * (width * width + width)
    for runs in ranks:
        for stage in STAGES:
            assert runs[str(stage)]["checksum"] == ranks[0][str(stage)]["checksum"]
    # Adam's first step alone moves each parameter by about lr = 1e-3.
    model = sharded.build_mlp(width, depth, seed=0)
    start = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert (ddp - start).abs().max() > 1e-3


# --- every stage against the unsplit model: the check notebook 04 runs ---------------
SHARDINGS = (*STAGES, "fsdp2")


def _every_check(width: int, depth: int) -> dict:
    return {str(s): check_sharded(s, width=width, depth=depth) for s in SHARDINGS}


def _torch_has_fsdp2() -> bool:
    """Ask this torch: FSDP2's fully_shard exists, and gloo has the collectives it
    shards with."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard  # noqa: F401
        except ImportError:
            return False
    return has_collective("reduce_scatter") and has_collective("all_gather")


# Ψ = 263,168 (the notebook's MLP) on 3 ranks, which does not divide it; Ψ = 12,870
# on 4 ranks, which pads every shard.
@pytest.mark.parametrize(
    ("world_size", "width", "depth"), [(3, 256, 4), (4, 65, 3)], ids=["3", "4"]
)
def test_every_stage_and_fsdp2_give_the_unsplit_models_losses_and_weights(
    world_size, width, depth
):
    result = launch(
        _every_check, width, depth, world_size=world_size, backend="gloo", show="none"
    )
    psi = depth * (width * width + width)
    for checks in result.returns:
        for stage in SHARDINGS:
            check = checks[str(stage)]
            if stage == "fsdp2" and not _torch_has_fsdp2():
                assert check["available"] is False and "fully_shard" in check["why"]
                continue
            assert check["equal"] and check["losses_equal"], (stage, check)
            assert check["loss_diff"] <= check["tolerance"] == STEP_TOLERANCE
            assert check["max_abs_diff"] <= STEP_TOLERANCE
            assert check["parameters"] == psi and check["steps"] == 3
            assert check["unsplit"] == 16 * psi
            # The differences are the largest over all ranks: every rank says so.
            first = result.returns[0][str(stage)]
            assert (check["loss_diff"], check["max_abs_diff"]) == (
                first["loss_diff"],
                first["max_abs_diff"],
            )
        kept = [checks[str(s)]["kept"] for s in STAGES]
        assert kept[3] < kept[2] < kept[1] < kept[0] <= 1.01 * 16 * psi
        expected = "reduce_scatter" if has_collective("reduce_scatter") else "all_re"
        assert checks["2"]["gradient_reduce"].startswith(expected)
        names = [checks[k]["name"] for k in ("ddp", "1", "2", "3")]
        assert names == ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]


def _without_fsdp2() -> dict:
    # What a rank gets on a torch without FSDP2's fully_shard.
    zero_memory.fsdp2_fully_shard = lambda: (None, "this torch has no fully_shard")
    return check_sharded("fsdp2", width=8, depth=1)


def test_without_fsdp2_the_check_says_why_and_still_states_its_tolerance():
    result = launch(_without_fsdp2, world_size=2, show="none")
    for check in result.returns:
        assert check == {
            "name": "FSDP2",
            "available": False,
            "why": "this torch has no fully_shard",
            "steps": 3,
            "world_size": 2,
            "tolerance": STEP_TOLERANCE,
        }


def _unsummed_gradients() -> dict:
    # A broken stage: each rank keeps its shard of its own gradient, never summed
    # over the ranks (what forgetting the reduce-scatter does).
    def own_shard(self, grad):
        return grad[self.rank * self.shard : (self.rank + 1) * self.shard].clone()

    sharded._ZeroRank._my_gradient = own_shard
    return {str(s): check_sharded(s, width=64, depth=2) for s in (2, 3)}


def test_a_stage_that_does_not_sum_the_gradients_fails_the_check():
    result = launch(_unsummed_gradients, world_size=2, show="none")
    for checks in result.returns:
        for check in checks.values():
            assert not check["equal"], check
            assert not check["weights_equal"] and not check["losses_equal"]
            assert check["max_abs_diff"] > 100 * STEP_TOLERANCE


def _traced_stage_3() -> None:
    measure_zero_memory(3, width=16, depth=2, steps=2)


def test_stage_3_gathers_parameters_and_reduce_scatters_gradients_every_step():
    result = launch(_traced_stage_3, world_size=2, trace=True, show="none")
    shard = 2 * (16 * 16 + 16) // 2  # Ψ = 544 values, 272 a rank
    reduce = "reduce_scatter" if has_collective("reduce_scatter") else "all_reduce"
    for events in result.traces:
        # Two steps, then the gather of the final parameters for the checksum.
        assert [e.op for e in events] == [
            "all_gather",
            reduce,
            "all_gather",
            reduce,
            "all_gather",
        ]
        for event in events:
            if event.op != "all_reduce":
                # One shard of fp32 values per rank, in and out.
                assert event.shapes == [(shard,)] * 3, event.op
                assert event.dtype == "float32"


def _without_reduce_scatter() -> dict:
    # What a rank does on a torch whose gloo has no reduce_scatter.
    sharded._reduce_scatter_runs = lambda device: False
    return {
        "checks": {str(s): check_sharded(s, width=24, depth=2) for s in (2, 3)},
        "memory": measure_zero_memory(2, 24, 2),
    }


def test_without_reduce_scatter_all_reduce_then_slice_gives_the_same_shards():
    result = launch(_without_reduce_scatter, world_size=2, show="none")
    runs = result.returns[0]
    for check in runs["checks"].values():
        assert "this torch's gloo has no reduce_scatter" in check["gradient_reduce"]
        assert check["equal"], check
    # The kept gradient is still one shard, not the all-reduced whole.
    assert runs["memory"]["measured"]["grads"] == 4 * runs["memory"]["shard"]


# --- PyTorch's FSDP2 ------------------------------------------------------------------
def _fsdp_and_ddp() -> dict:
    return {
        "fsdp": measure_fsdp_memory(width=64, depth=3),
        "ddp": measure_zero_memory("ddp", 64, 3),
    }


def test_fsdp2_keeps_less_per_rank_than_ddp_or_says_why_it_cannot_run():
    result = launch(_fsdp_and_ddp, world_size=2, backend="gloo", show="none")
    for runs in result.returns:
        fsdp, ddp = runs["fsdp"], runs["ddp"]
        if not _torch_has_fsdp2():
            assert fsdp["available"] is False
            assert "fully_shard" in fsdp["why"], fsdp
            continue
        assert fsdp["available"], fsdp["why"]
        assert fsdp["measured"]["total"] < 0.6 * ddp["measured"]["total"]
        # FSDP2 pads each parameter's rows to a multiple of world_size, and keeps
        # one step counter per parameter: within a few percent of 16 Ψ / N.
        formula = fsdp["formula"]["total"]
        assert formula <= fsdp["measured"]["total"] <= 1.05 * formula
        assert fsdp["formula"] == zero_bytes(ddp["parameters"], 2, 3)
        assert len(fsdp["losses"]) == 2 and fsdp["loss"] == fsdp["losses"][-1]
