"""The lab where a rank never joins a collective (notebook 05): the short form of a
launch's error, and each rank's flight record. Ranks are pinned to gloo, whose
behaviour the lab shows on every machine."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import workshop
from workshop.lessons.notebook05_stuck import flight_record, summarize_error


def _mismatched():
    t = torch.ones(4 if dist.get_rank() == 0 else 5)
    dist.all_reduce(t)


def _skips_the_third():
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.barrier()
    if dist.get_rank() == 0:
        dist.all_reduce(t, async_op=True)
    return flight_record()


def test_summarize_keeps_what_differs_in_lines_that_fit(monkeypatch):
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    with pytest.raises(workshop.LaunchError) as info:
        workshop.launch(_mismatched, world_size=2, backend="gloo", show="none")
    full, short = str(info.value), summarize_error(info.value)
    assert "TensorOptions(" in full and "Traceback" in full
    assert "TensorOptions(" not in short and "Traceback" not in short
    assert "Detected mismatch between" in short
    assert "TensorShape=[4]" in short and "TensorShape=[5]" in short
    assert "Rank 0 is running collective: (SequenceNumber=0" in short
    assert max(map(len, short.splitlines())) <= 88
    assert max(map(len, summarize_error(info.value, width=50).splitlines())) <= 50


def test_summarize_refuses_what_it_cannot_read():
    with pytest.raises(TypeError, match=r"takes the LaunchError .* got a ValueError"):
        summarize_error(ValueError("x"))
    error = workshop.LaunchError("rank 0 failed", None)
    with pytest.raises(ValueError, match="width=10 is too narrow to read"):
        summarize_error(error, width=10)


def test_flight_records_show_which_rank_skipped_a_collective():
    run = workshop.launch(_skips_the_third, world_size=2, backend="gloo", show="none")
    first, second = run.returns
    has_recorder = hasattr(torch._C._distributed_c10d, "_dump_fr_trace")
    if first is None:  # this torch keeps no record of gloo's collectives
        assert second is None
        return
    assert has_recorder
    assert [(seq, op) for seq, op, _ in first] == [
        (1, "gloo:all_reduce"),
        (2, "gloo:barrier"),
        (3, "gloo:all_reduce"),
    ]
    assert [seq for seq, _, _ in second] == [1, 2]
    assert first[0][2] == [[4]]  # the input sizes
