"""python -m workshop.bench allreduce: a real sweep on 2 ranks, its files, its fit,
its plot and its command line (started by itself and by torchrun)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib
import pytest
from figure_helpers import texts_on

from workshop.bench.allreduce_result import (
    FIT_TOLERANCE,
    AllreduceResult,
    load_allreduce,
    parse_size,
    plot_allreduce,
    save_allreduce,
)
from workshop.bench.allreduce_worker import (
    measure_allreduce,
)
from workshop.comm.costmodel import ring_all_reduce_time

matplotlib.use("Agg")

SMALL = [4096, 65536, 1 << 20]
FIELDS = {
    "backend",
    "world_size",
    "launcher",
    "device",
    "sizes",
    "warmup",
    "reference",
    "machine",
    "versions",
    "dtype",
    "skipped_sizes",
    "created",
    "fit",
    "peak_busbw",
    "peak_fraction_of_reference",
}


def _synthetic(world_size=2, alpha=3e-4, beta=1e9, sizes=SMALL, wobble=0.0):
    """A result whose times follow the ring model (each repetition off by up to
    ``wobble``, the median exactly on it): known figures without a launch."""
    seconds = []
    for size in sizes:
        t = ring_all_reduce_time(size, world_size, alpha, beta)
        seconds.append([t * (1 - wobble), t, t * (1 + wobble)])
    return AllreduceResult(
        backend="gloo",
        world_size=world_size,
        launcher="workshop",
        device="cpu",
        sizes=list(sizes),
        seconds=seconds,
        warmup=1,
        reference={
            "what": "cpu memory copy of 1 MiB",
            "bytes": 1 << 20,
            "seconds": [1e-4, 2e-4],
        },
        machine={
            "hostname": "h",
            "cpu_count": 2,
            "platform": "p",
            "threads": 1,
            "gpu": None,
            "load_average": [0.0, 0.0, 0.0],
        },
        versions={"python": "3", "torch": "2", "workshop": "0.1.0"},
    )


@pytest.fixture(scope="module")
def swept() -> AllreduceResult:
    """One real sweep on 2 gloo ranks: three sizes, four repetitions each. Pinned to
    gloo: on a GPU node "auto" gives NCCL where there are 2 GPUs, and the figures
    checked below (CPU memory copy against busbw) are those of CPU ranks."""
    return measure_allreduce(
        2,
        backend="gloo",
        sizes=SMALL,
        repeats=4,
        warmup=1,
        min_time=0,
        reference_bytes=1 << 20,
    )


# ------------------------------------------------------------------ sizes
@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("4K", 4096),
        ("4KiB", 4096),
        ("64 MiB", 64 << 20),
        ("64m", 64 << 20),
        ("1G", 1 << 30),
    ],
)
def test_parse_size_reads_binary_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["4X", "-4K", "1.5M", ""])
def test_parse_size_rejects_what_it_cannot_read(text):
    with pytest.raises(ValueError, match=r"cannot read the size .*e\.g\. 4096, 4K"):
        parse_size(text)


# ------------------------------------------------------------------ files
def test_json_has_every_field_and_csv_one_row_per_repetition(swept, tmp_path):
    json_path, csv_path = save_allreduce(swept, tmp_path / "runs" / "ar")
    assert (json_path.name, csv_path.name) == ("ar.json", "ar.csv")
    data = json.loads(json_path.read_text())
    assert set(data) == FIELDS
    assert [row["size_bytes"] for row in data["sizes"]] == SMALL
    for row, times in zip(data["sizes"], swept.seconds, strict=True):
        assert set(row) == {
            "size_bytes",
            "count",
            "seconds",
            "median_seconds",
            "algbw",
            "busbw",
            "predicted_seconds",
        }
        assert row["seconds"] == times
        assert row["count"] == row["size_bytes"] // 4
    fit = swept.fit()
    assert data["fit"] == {
        "alpha": fit.alpha,
        "beta": fit.beta,
        "world_size": 2,
        "max_rel_error": fit.max_rel_error,
        "tolerance": FIT_TOLERANCE,
        "within_tolerance": fit.max_rel_error <= FIT_TOLERANCE,
    }
    assert data["reference"]["bandwidth"] == swept.reference_bandwidth
    assert set(data["reference"]) == {
        "what",
        "counted",
        "bytes",
        "seconds",
        "bandwidth",
    }
    assert data["peak_fraction_of_reference"] == pytest.approx(
        swept.peak_busbw / swept.reference_bandwidth
    )

    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["size_bytes", "repetition", "seconds", "algbw", "busbw"]
    assert len(rows) == sum(len(times) for times in swept.seconds) == 12
    expected = [
        (size, i, t)
        for size, times in zip(swept.sizes, swept.seconds, strict=True)
        for i, t in enumerate(times)
    ]
    for row, (size, i, t) in zip(rows, expected, strict=True):
        assert (int(row["size_bytes"]), int(row["repetition"])) == (size, i)
        assert float(row["seconds"]) == t
        assert float(row["algbw"]) == pytest.approx(size / t)
        assert float(row["busbw"]) == pytest.approx(size / t * 1.0)


def test_load_gives_back_the_same_result(swept, tmp_path):
    save_allreduce(swept, tmp_path / "ar")
    assert load_allreduce(tmp_path / "ar.json") == swept
    assert load_allreduce(tmp_path / "ar") == swept  # the prefix works too
    assert load_allreduce(str(tmp_path / "ar.json")).fit() == swept.fit()


def test_a_result_of_one_size_saves_without_a_fit(tmp_path):
    result = _synthetic(sizes=[4096])
    json_path, _ = save_allreduce(result, tmp_path / "one")
    assert json.loads(json_path.read_text())["fit"] is None
    assert "no ring model: fitting alpha and beta needs 2 ranks or more" in (
        result.summary()
    )
    assert load_allreduce(json_path) == result


def test_load_errors_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no all-reduce result at .*nope"):
        load_allreduce(tmp_path / "nope.json")
    save_allreduce(_synthetic(), tmp_path / "ar")
    with pytest.raises(ValueError, match=r"ar\.csv is not JSON .*not the \.csv"):
        load_allreduce(tmp_path / "ar.csv")
    (tmp_path / "other.json").write_text('{"steps": 3}')
    with pytest.raises(ValueError, match=r"other\.json is not an all-reduce result"):
        load_allreduce(tmp_path / "other.json")
    data = json.loads((tmp_path / "ar.json").read_text())
    del data["backend"], data["machine"]
    (tmp_path / "broken.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"backend, machine missing; load a JSON"):
        load_allreduce(tmp_path / "broken.json")


# ------------------------------------------------------------------ report
def test_table_and_summary_read_like_nccl_tests():
    result = _synthetic(world_size=4, alpha=1e-4, beta=2e9, wobble=0.5)
    lines = result.table().splitlines()
    assert lines[0].split() == [
        "size",
        "count",
        "type",
        "reps",
        "time",
        "us",
        "algbw",
        "GB/s",
        "busbw",
        "GB/s",
        "model",
        "us",
        "error",
    ]
    assert len(lines) == 1 + len(SMALL)
    t = ring_all_reduce_time(1 << 20, 4, 1e-4, 2e9)
    assert lines[3].split() == [
        "1048576",
        "262144",
        "float32",
        "3",
        f"{t * 1e6:.1f}",
        f"{(1 << 20) / t / 1e9:.3f}",
        f"{(1 << 20) / t * 1.5 / 1e9:.3f}",
        f"{t * 1e6:.1f}",
        "+0%",
    ]
    summary = result.summary().splitlines()
    assert (
        summary[0]
        == "ring model: alpha = 100.0 us per step, beta = 2.000 GB/s per link"
    )
    assert summary[1].startswith("the model predicts every measured size within 30%")
    peak = (1 << 20) / t * 1.5
    assert summary[2] == (
        f"peak busbw {peak / 1e9:.3f} GB/s = {peak / 1.048576e10:.1%} of the "
        "reference: cpu memory copy of 1 MiB at 10.486 GB/s"
    )
    # Notebooks print these: every line fits 88 columns.
    assert max(len(line) for line in lines + summary) <= 88


def test_table_and_summary_fit_88_columns_for_large_messages_and_slow_links():
    # 16 GiB on 64 ranks over a slow link: about 6 s an all-reduce, 10 digits sizes.
    result = _synthetic(world_size=64, alpha=1e-3, beta=5e9, sizes=[1024, 1 << 34])
    result.reference["what"] = "cuda device-to-device copy of 1 GiB"
    text = result.table() + "\n" + result.summary()
    assert "17179869184" in text and "4294967296" in text
    assert max(len(line) for line in text.splitlines()) <= 88


def test_summary_says_so_when_the_model_misses():
    result = _synthetic()
    result.seconds[1] = [t * 3 for t in result.seconds[1]]
    assert "the model does NOT predict every measured size within 30%: worst " in (
        result.summary()
    )
    assert "at 64 KiB" in result.summary()


# ------------------------------------------------------------------ plot
def test_plot_shows_measured_model_and_reference():
    import matplotlib.pyplot as plt

    result = _synthetic(world_size=4, alpha=1e-4, beta=2e9, wobble=0.2)
    fig = plot_allreduce(result)
    left, right = fig.axes
    lines = {line.get_label(): line for line in left.get_lines()}
    assert set(lines) == {
        "measured (median)",
        "ring model: $\\alpha$ = 100 µs, $\\beta$ = 2.00 GB/s",
    }
    assert list(lines["measured (median)"].get_ydata()) == pytest.approx(
        [t * 1e3 for t in result.medians]
    )
    labels = {c.get_label() for c in left.collections}
    assert {"each repetition", "model ± 30%"} <= labels
    dots = next(c for c in left.collections if c.get_label() == "each repetition")
    assert len(dots.get_offsets()) == 3  # the first size's; others are unlabelled
    assert sum(len(c.get_offsets()) for c in left.collections[:3]) == 9
    assert left.get_ylabel() == "time per all-reduce (ms)"
    assert left.get_xlabel() == right.get_xlabel() == "message size"
    assert [t.get_text() for t in left.get_xticklabels()] == [
        "4 KiB",
        "64 KiB",
        "1 MiB",
    ]
    assert left.get_title() == "Time: worst model error 0%"
    assert (left.get_yscale(), right.get_yscale()) == ("log", "log")

    lines = {line.get_label(): line for line in right.get_lines()}
    reference = "cpu memory copy of 1 MiB: 10.49 GB/s"
    assert set(lines) == {"measured busbw (median)", "ring model", reference}
    assert list(lines[reference].get_ydata()) == pytest.approx([10.48576] * 2)
    assert list(lines["measured busbw (median)"].get_ydata()) == pytest.approx(
        [b / 1e9 for b in result.busbw]
    )
    assert right.get_ylabel() == "bus bandwidth (GB/s)"
    peak = result.peak_busbw / 1e9
    assert right.get_title() == (
        f"busbw: peak {peak:.2f} GB/s = {peak / 10.48576:.0%} of copy"
    )
    assert fig.get_suptitle() == "All-reduce of float32 on 4 ranks, gloo on cpu"
    assert texts_on(left) == []  # everything is in the legend and titles
    legend = [t.get_text() for t in right.get_legend().get_texts()]
    assert reference in legend
    plt.close(fig)


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_plots_legends_cover_no_measurement(ranks):

    import matplotlib.pyplot as plt

    results = Path(__file__).resolve().parents[2] / "docs" / "results"
    fig = plot_allreduce(load_allreduce(results / f"allreduce-gloo-N{ranks}.json"))
    fig.canvas.draw()
    for ax in fig.axes:
        box = ax.get_legend().get_window_extent()
        points = [line.get_xydata() for line in ax.get_lines()]
        points += [
            c.get_offsets() for c in ax.collections if c.get_label() != "model ± 30%"
        ]
        for xy in points:
            shown = ax.transData.transform(xy)
            inside = [p for p in shown if box.contains(*p)]
            assert inside == [], (ax.get_title(), len(inside))
    plt.close(fig)


def test_plot_takes_a_loaded_result(swept, tmp_path):
    import matplotlib.pyplot as plt

    save_allreduce(swept, tmp_path / "ar")
    fig = plot_allreduce(load_allreduce(tmp_path / "ar.json"), title="batch job")
    assert fig.get_suptitle() == "batch job"
    assert len(fig.axes[1].get_lines()) == 3
    plt.close(fig)


def test_plot_of_one_rank_says_there_is_no_fit():
    with pytest.raises(ValueError, match=r"1 rank sends nothing"):
        plot_allreduce(_synthetic(world_size=1))


# ------------------------------------------------------------------ a real sweep
def test_a_real_sweep_times_every_size_and_repetition(swept):
    assert (swept.backend, swept.world_size, swept.device) == ("gloo", 2, "cpu")
    assert swept.launcher == "workshop"
    assert swept.dtype == "float32" and swept.warmup == 1
    assert swept.sizes == SMALL and swept.skipped_sizes == []
    assert [len(times) for times in swept.seconds] == [4, 4, 4]
    assert all(0 < t < 5 for times in swept.seconds for t in times)
    for size, t, a, b in zip(
        swept.sizes, swept.medians, swept.algbw, swept.busbw, strict=True
    ):
        assert a == pytest.approx(size / t)
        assert b == pytest.approx(a)  # 2(N-1)/N = 1 on 2 ranks
    assert swept.reference["bytes"] == 1 << 20
    assert len(swept.reference["seconds"]) == 5
    # Every byte gloo sends is copied at least once on its way: a copy in memory is
    # a ceiling. (Below it means the copy itself was slow: more compute threads
    # than the cores this job may use, say.)
    assert swept.reference_bandwidth > swept.peak_busbw > 0, (
        swept.reference,
        swept.busbw,
        swept.machine,
    )
    assert set(swept.machine) == {
        "hostname",
        "cpu_count",
        "platform",
        "threads",
        "gpu",
        "load_average",
    }
    assert swept.machine["gpu"] is None
    assert set(swept.versions) == {"python", "torch", "workshop"}
    fit = swept.fit()
    assert fit.alpha >= 0 and fit.beta > 0 and fit.world_size == 2
