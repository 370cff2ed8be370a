"""workshop.features: what the installed torch's gloo can do, asked without running
gloo in this process; and notebook 02's all_to_all cell where gloo lacks it."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from conftest import ROOT

import workshop
import workshop.features as features
from workshop.features import COLLECTIVES, has_collective


def _try_for_real(name):
    # Each collective with a tensor per rank on 2 real gloo ranks: does it run?
    rank, size = dist.get_rank(), dist.get_world_size()
    one = torch.ones(1)
    calls = {
        "broadcast": lambda: dist.broadcast(one, src=0),
        "all_reduce": lambda: dist.all_reduce(one),
        "reduce": lambda: dist.reduce(one, dst=0),
        "all_gather": lambda: dist.all_gather(
            [torch.zeros(1) for _ in range(size)], one
        ),
        "gather": lambda: dist.gather(
            one, [torch.zeros(1) for _ in range(size)] if rank == 0 else None, dst=0
        ),
        "scatter": lambda: dist.scatter(
            one, [torch.ones(1) for _ in range(size)] if rank == 0 else None, src=0
        ),
        "reduce_scatter": lambda: dist.reduce_scatter(
            one, [torch.ones(1) for _ in range(size)]
        ),
        "all_to_all": lambda: dist.all_to_all(
            [torch.zeros(1) for _ in range(size)], [torch.ones(1) for _ in range(size)]
        ),
        "all_to_all_single": lambda: dist.all_to_all_single(
            torch.zeros(size), torch.ones(size)
        ),
    }
    try:
        calls[name]()
    except RuntimeError as exc:
        if "does not support" in str(exc):
            return False
        raise
    return True


@pytest.mark.parametrize("name", COLLECTIVES)
def test_the_answer_matches_what_real_ranks_can_do(name):
    real = workshop.launch(
        _try_for_real, name, world_size=2, backend="gloo", timeout=60
    )
    assert real.returns == [has_collective(name)] * 2


def test_each_answer_is_kept(monkeypatch):
    monkeypatch.setattr(features, "_ANSWERS", {})
    asked = []
    real = features._answer_in_child
    monkeypatch.setattr(
        features, "_answer_in_child", lambda name: asked.append(name) or real(name)
    )
    first = has_collective("all_gather")
    assert has_collective("all_gather") is first
    assert asked == ["all_gather"]


def test_a_missing_collective_is_reported_missing(monkeypatch):
    # The forked child inherits the patched question: gloo "answers" as torch
    # 2.11's does for all_to_all.
    def old_gloo(pg):
        raise RuntimeError("Backend gloo does not support alltoall")

    monkeypatch.setattr(features, "_ANSWERS", {})
    monkeypatch.setattr(
        features, "_one_rank_calls", lambda: dict.fromkeys(COLLECTIVES, old_gloo)
    )
    assert has_collective("all_to_all") is False


def test_a_question_that_breaks_does_not_hide_the_collective(monkeypatch):
    def broken(pg):
        raise OSError("no network device")

    monkeypatch.setattr(features, "_ANSWERS", {})
    monkeypatch.setattr(
        features, "_one_rank_calls", lambda: dict.fromkeys(COLLECTIVES, broken)
    )
    assert has_collective("all_to_all") is True  # the lesson's own call will say


def test_nccl_runs_every_collective_and_bad_names_are_explained():
    assert all(has_collective(name, "nccl") for name in COLLECTIVES)
    with pytest.raises(ValueError, match=r"unknown collective 'alltoall'; ask about"):
        has_collective("alltoall")
    with pytest.raises(ValueError, match=r"backend='mpi': ask about 'gloo' or 'nccl'"):
        has_collective("all_reduce", "mpi")


def _notebook_02_cell(marker: str) -> str:
    notebook = json.loads(
        (ROOT / "notebooks" / "02_distributed_data_parallel.ipynb").read_text()
    )
    cells = [
        "".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"
    ]
    (cell,) = [c for c in cells if marker in c]
    return cell


def _drawn_by_cell(marker: str, collective: str, gloo_has_it: bool, monkeypatch):
    """Run notebook 02's cell holding ``marker`` with gloo answering
    ``gloo_has_it`` about ``collective``; the events of the call it drew. Skipped
    where this torch's gloo lacks the collective the cell would then call."""
    if gloo_has_it and not has_collective(collective):
        pytest.skip(f"gloo in torch {torch.__version__} has no {collective} to draw")
    monkeypatch.setattr(workshop, "has_collective", lambda name: gloo_has_it)
    drawn = []

    def show(fn, world_size=4):  # the notebook's own, with the drawn call kept
        result = workshop.launch(
            fn, world_size=world_size, trace=True, show="none", backend="gloo"
        )
        call = workshop.comm.collectives(result.traces)[0]
        drawn.append(call)
        return workshop.draw.draw_collective(call)

    cell = _notebook_02_cell(marker)
    exec(cell, {"workshop": workshop, "torch": torch, "dist": dist, "show": show})
    (call,) = drawn
    return call


@pytest.mark.parametrize("gloo_has_it", [True, False])
def test_notebook_02s_all_to_all_cell_runs_on_every_torch(
    gloo_has_it, monkeypatch, capsys
):
    # The cell as the notebook has it, with gloo answering as torch 2.15 and as
    # torch 2.11: either way the same exchange is drawn, and an old torch says why.
    call = _drawn_by_cell(
        "dist.all_to_all(incoming, outgoing)", "all_to_all", gloo_has_it, monkeypatch
    )
    expected_op = "all_to_all" if gloo_has_it else "all_to_all_single"
    assert [e.op for e in call] == [expected_op] * 4
    after = [[float(v) for v in torch.tensor(e.after).flatten()] for e in call]
    assert after == [[10.0 * r + rank for r in range(4)] for rank in range(4)]
    said = capsys.readouterr().out
    if gloo_has_it:
        assert said == ""
    else:
        assert said == (
            f"gloo in torch {torch.__version__} has no all_to_all (the list form); "
            "here is the same exchange with all_to_all_single\n"
        )


@pytest.mark.parametrize("gloo_has_it", [True, False])
def test_notebook_02s_reduce_scatter_cell_runs_on_every_torch(
    gloo_has_it, monkeypatch, capsys
):
    # As torch 2.15 and as torch 2.4, whose gloo has no reduce_scatter: the same
    # sums arrive, and the old torch says how.
    call = _drawn_by_cell(
        "dist.reduce_scatter(mine, pieces)", "reduce_scatter", gloo_has_it, monkeypatch
    )
    sums = [sum(q + 10.0 * r for q in range(4)) for r in range(4)]
    said = capsys.readouterr().out
    if gloo_has_it:
        assert [e.op for e in call] == ["reduce_scatter"] * 4
        assert [e.after for e in call] == [[sums[rank]] for rank in range(4)]
        assert said == ""
    else:
        assert [e.op for e in call] == ["all_reduce"] * 4
        assert all(e.after == sums for e in call)  # each keeps its own slice of it
        assert said == (
            f"gloo in torch {torch.__version__} has no reduce_scatter; here is the "
            "same result from an all_reduce, of which each rank keeps its own slice\n"
        )
