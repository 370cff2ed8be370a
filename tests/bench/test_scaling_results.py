"""Reading scaling results back: one file, several files, a batch job's folder.

The rows are made up (nothing is measured here); the real runs that write these files
are tested in test_scaling_bench.py."""

from __future__ import annotations

import dataclasses
import json

import matplotlib

matplotlib.use("Agg")

import pytest
from scaling_helpers import scaling_result

from workshop.bench.scaling_plots import load_scaling, plot_scaling
from workshop.bench.scaling_results import ScalingResult, ScalingRow, add_speedups


def _row(mode: str, ranks: int, step_ms: float) -> ScalingRow:
    """Weak scaling keeps 32 samples per rank; strong scaling a global batch of 32."""
    per_rank = 32 if mode == "weak" else 32 // ranks
    return ScalingRow(
        mode=mode,
        world_size=ranks,
        batch_per_rank=per_rank,
        global_batch=per_rank * ranks,
        threads_per_rank=1,
        samples_per_second=per_rank * ranks / (step_ms / 1e3),
        step_seconds=step_ms / 1e3,
        compute_seconds=0.8 * step_ms / 1e3,
        comm_seconds=0.2 * step_ms / 1e3,
        allreduce_seconds=0.001,
    )


def _result(*rows: ScalingRow, source: str = "given", **changes) -> ScalingResult:
    """A run as one step of a batch job saves it: speed-ups against its own rows."""
    rows = [dataclasses.replace(r) for r in rows]
    add_speedups(rows)
    return scaling_result(rows, launcher="srun", alpha_beta_source=source, **changes)


@pytest.fixture
def job(tmp_path):
    """The files of a scaling job: 1 rank (no alpha/beta), then 2 and 4 ranks."""
    folder = tmp_path / "scaling-42"
    steps = {
        "scaling-1rank": _result(
            _row("weak", 1, 30.0), _row("strong", 1, 30.0), source="none (pass ...)"
        ),
        "scaling-1node": _result(_row("weak", 2, 40.0), _row("strong", 2, 20.0)),
        "scaling-2node": _result(_row("weak", 4, 60.0), _row("strong", 4, 12.0)),
    }
    for name, result in steps.items():
        result.save(folder / name)
    (folder / "notes.json").write_text('{"kind": "something else"}')
    return folder


def test_one_file_reads_back_exactly_as_saved(job):
    one = load_scaling(job / "scaling-1node.json")
    assert [(r.mode, r.world_size) for r in one.rows] == [("weak", 2), ("strong", 2)]
    # Saved on its own, the 2-rank step is its own baseline.
    assert [(r.base_world_size, r.speedup) for r in one.rows] == [(2, 1.0), (2, 1.0)]
    assert one.explain()[-1].startswith(
        "on the CPU the 2 ranks share this machine's 2 cores, each computing with "
        "1 thread. That measures this machine"
    )


def test_several_files_make_one_table_against_the_smallest_world_size(job):
    merged = load_scaling(job / "scaling-2node.json", job / "scaling-1rank.json",
                          job / "scaling-1node.json")  # fmt: skip
    assert [(r.mode, r.world_size) for r in merged.rows] == [
        ("weak", 1), ("weak", 2), ("weak", 4),
        ("strong", 1), ("strong", 2), ("strong", 4),
    ]  # fmt: skip
    assert {r.base_world_size for r in merged.rows} == {1}
    weak4, strong4 = merged.row("weak", 4), merged.row("strong", 4)
    # weak: 4 x 32 samples in 60 ms against 32 in 30 ms: 2x the throughput, 50 %.
    assert weak4.speedup == pytest.approx(2.0)
    assert weak4.efficiency == pytest.approx(0.5)
    # strong: 32 samples in 12 ms against 30 ms: 2.5x faster on 4 ranks, 62.5 %.
    assert strong4.speedup == pytest.approx(2.5)
    assert strong4.efficiency == pytest.approx(0.625)
    # The 1-rank step fitted nothing; the others say where alpha and beta came from.
    assert merged.alpha_beta_source == "given"
    assert "weak       4         32     2,133     2.00    50%" in merged.table()
    assert (
        "with 1 rank, each rank computes with 1 thread; with 4 ranks, with 1 "
        in (merged.explain()[-1])
    )


def test_a_folder_reads_every_scaling_file_in_it_and_passes_over_others(job):
    assert load_scaling(job) == load_scaling(*sorted(job.glob("scaling-*.json")))
    fig = plot_scaling(job)
    (throughput, _) = fig.axes
    lines = {line.get_label(): line for line in throughput.get_lines()}
    weak = lines["weak scaling, cnn (CPU)"]
    assert list(weak.get_xdata()) == [1, 2, 4]


def test_what_cannot_be_read_together_is_named(job, tmp_path):
    with pytest.raises(TypeError, match="load_scaling needs at least one path"):
        load_scaling()
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "other.json").write_text(json.dumps({"kind": "workshop.allreduce"}))
    with pytest.raises(FileNotFoundError, match=r"no scaling results in the folder"):
        load_scaling(empty)
    with pytest.raises(
        ValueError, match=r"both hold weak scaling at 2 rank\(s\); load"
    ):
        load_scaling(job / "scaling-1node.json", job / "scaling-1node.json")
    cases = [
        (
            _result(_row("weak", 8, 90.0), model="resnet50"),
            r"measured different things: cnn at 32px against resnet50 at 32px",
        ),
        (
            _result(dataclasses.replace(_row("weak", 8, 90.0), batch_per_rank=64)),
            r"weak scaling with batch_per_rank 32 against 64",
        ),
        (
            _result(_row("weak", 8, 90.0), backend="nccl", device="GPU"),
            r"measured gloo on CPU but .* nccl on GPU; load runs of one backend",
        ),
    ]
    for other, message in cases:
        path, _ = other.save(tmp_path / "other")
        with pytest.raises(ValueError, match=message):
            load_scaling(job / "scaling-1rank.json", path)
