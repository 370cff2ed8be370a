"""The gallery: every communication diagram written as PNG from example data, by a
command that runs without torch."""

from __future__ import annotations

import pytest

from workshop.gallery import example_events, example_phases, main


@pytest.mark.parametrize("where", ["under a file", "a file"])
def test_a_folder_that_cannot_be_made_is_one_line_before_drawing(
    where, tmp_path, capsys
):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    outdir, why = {
        "under a file": (blocker / "gallery", f"{blocker} is a file, not a folder"),
        "a file": (blocker, "it is a file, not a folder"),
    }[where]
    with pytest.raises(SystemExit) as exit_info:
        main([str(outdir)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (
        f"python -m workshop.gallery: error: argument outdir: cannot write into "
        f"{outdir}: {why}; e.g. python -m workshop.gallery /tmp/comm_diagrams"
    )


def test_the_example_is_consistent():
    events = example_events()
    assert len(events) == 4
    # The collectives line up: the same op at the same place on every rank.
    assert {lane[0]["op"] for lane in events} == {"broadcast"}
    assert {lane[-1]["op"] for lane in events} == {"all_reduce"}
    assert [lane[-1]["before"] for lane in events] == [[0.0], [1.0], [2.0], [3.0]]
    assert {tuple(lane[-1]["after"]) for lane in events} == {(6.0,)}
    assert {tuple(lane[0]["after"]) for lane in events} == {
        tuple(events[1][0]["before"])
    }
    sends = [
        (e["rank"], e["peer"]) for lane in events for e in lane if e["op"] == "send"
    ]
    recvs = [
        (e["peer"], e["rank"]) for lane in events for e in lane if e["op"] == "recv"
    ]
    assert sends == recvs == [(0, 1), (2, 3)]
    # Every call ends after it starts, and the all-reduce ends together.
    assert all(e["end"] > e["start"] for lane in events for e in lane)
    assert len({lane[-1]["end"] for lane in events}) == 1
    # The optimizer waits for the all-reduce; the all-reduce starts in the backward.
    phases = {(r, name): (start, end) for r, name, start, end in example_phases()}
    for r, lane in enumerate(events):
        assert phases[r, "optimizer"][0] >= lane[-1]["end"]
        backward = phases[r, "backward"]
        assert backward[0] < lane[-1]["start"] < backward[1]


def test_the_ddp_example_labels_buckets_inside_backward_and_before_the_optimizer():
    from workshop.draw.timeline_diagram import draw_rank_timeline
    from workshop.gallery import _bucket_phases, example_buckets

    buckets, phases = example_buckets(), _bucket_phases()
    for rank, lane in enumerate(buckets):
        mine = {name: (start, end) for r, name, start, end in phases if r == rank}
        first, second = lane
        assert mine["backward"][0] < first["start"] < first["end"] < mine["backward"][1]
        assert second["start"] == mine["backward"][1]
        assert second["end"] <= mine["optimizer"][0]
    fig = draw_rank_timeline(buckets, phases, title="One DDP step")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("bucket 0") == texts.count("bucket 1") == 4
