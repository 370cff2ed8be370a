"""The check at full scale: one rank of a 1,024-rank layout on PyTorch's fake backend,
its shards and collectives against what the sharding must give, and the estimate
beside it. All runs of the module share one child process (its imports, a few
seconds, are paid once); each run is a fork of it."""

from __future__ import annotations

import math
import os
import re
import time

import pytest
import torch

from workshop.planner import fake_compare, fake_record, fake_world
from workshop.planner.fake_compare import ComparedTerm
from workshop.planner.fake_world import fake_features, fake_run, fake_runs
from workshop.planner.layout import Layout

pytestmark = pytest.mark.skipif(
    fake_features()["missing"] is not None, reason="this torch lacks the fake world"
)


def test_a_row_ratio():
    assert ComparedTerm("x", 0, 0).ratio == 1 and math.isinf(
        ComparedTerm("x", 0, 1).ratio
    )
    assert ComparedTerm("x", 2, 1).ratio == 0.5


# --- bad input, features, processes ---------------------------------------------------
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: fake_run("tiny", Layout(dp=4), rank=4), r"rank must .* 0 to 3, not 4"),
        (lambda: fake_run("tiny", Layout(tp=3)), "tp=3 does not divide"),
        (lambda: fake_run("tiny", Layout(pp=3)), "pp=3 does not divide"),
        (lambda: fake_run("resnet50", Layout(dp=2)), "is a module"),
        (lambda: fake_run("tiny", Layout(), batch_tokens=40), "batch_tokens=40"),
        (lambda: fake_run("tiny", Layout(), layers_in_step=0), "layers_in_step must"),
        (lambda: fake_run("transformer-70b", Layout(dp=8, zero=1)), "would hold about"),
        (lambda: fake_run("nope", Layout()), "not one the planner knows"),
        (lambda: fake_run("tiny", Layout(dp=2, tp=2, zero=1)), "use zero=2 or 3"),
    ],
)
def test_bad_input_is_refused_before_any_process_starts(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def _our_children() -> list[int]:
    mine = f"WORKSHOP_FAKE_PARENT={os.getpid()}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if mine in f.read().split(b"\0"):
                        found.append(int(pid))
            except OSError:
                continue
    return found


def test_a_timeout_stops_the_child_and_leaves_no_process_behind():
    with pytest.raises(RuntimeError, match=r"ran past timeout=0\.5 s and was stopped"):
        fake_run("tiny", Layout(dp=2, zero=3), timeout=0.5)
    deadline = time.monotonic() + 5
    while _our_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _our_children() == []


def test_features_name_where_each_piece_lives_and_what_is_missing(monkeypatch):
    found = fake_features()
    assert found["missing"] is None
    assert found["fully_shard"] in (
        "torch.distributed.fsdp",
        "torch.distributed._composable.fsdp",
    )
    assert found["comm_debug_mode"] in (
        "torch.distributed.tensor.debug",
        "torch.distributed._tensor.debug",
    )
    monkeypatch.setitem(
        fake_record._PLACES,
        "fully_shard",
        (("torch.distributed.no_such_fsdp", "fully_shard"),),
    )
    gone = fake_features()
    assert gone["fully_shard"] is None
    assert re.search(r"lacks fully_shard.*torch 2\.4 or newer", gone["missing"])
    assert torch.__version__ in gone["missing"]


def test_runs_must_be_tuples_with_known_options():
    with pytest.raises(ValueError, match="unknown options"):
        fake_runs([("tiny", Layout(), 0, {"layers": 1})])
    with pytest.raises(ValueError, match=r"give \(model, layout, rank\)"):
        fake_runs([("tiny", Layout())])


def test_the_module_exports_its_public_names():
    # Each module lists what it defines: the report's class is fake_world's, and
    # compare's module lists only its own names.
    assert set(fake_world.__all__) == {
        "FakeReport",
        "fake_features",
        "fake_run",
        "fake_runs",
    }
    assert "FakeReport" not in fake_compare.__all__
