"""Scaling plots: the series, ideal lines, labels and the errors for bad tables; and
plot_efficiency: speed-up and efficiency of tables in seconds and of rates, each over
its own first count, beside the ideal.

The numbers below are made up for the tests; they are nobody's published figures."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest
from scaling_helpers import scaling_result

from workshop.bench.scaling_plots import (
    efficiency_series,
    plot_efficiency,
    plot_scaling,
    relative_efficiency,
    scaling_series,
)
from workshop.bench.scaling_results import ScalingResult, ScalingRow
from workshop.sources.tables import document_table

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"

TABLE = {"a table from 2 ranks": [(8, 700.0), (2, 200.0), (4, 380.0)]}


def _row(mode: str, ranks: int, rate: float) -> ScalingRow:
    return ScalingRow(
        mode=mode,
        world_size=ranks,
        batch_per_rank=32,
        global_batch=32 * ranks,
        threads_per_rank=1,
        samples_per_second=rate,
        step_seconds=32 * ranks / rate,
        compute_seconds=0.9 * 32 * ranks / rate,
        comm_seconds=0.1 * 32 * ranks / rate,
        allreduce_seconds=0.001,
    )


@pytest.fixture
def result() -> ScalingResult:
    return scaling_result(
        [
            _row("weak", 1, 100.0),
            _row("weak", 2, 180.0),
            _row("weak", 4, 300.0),
            _row("strong", 1, 100.0),
            _row("strong", 2, 150.0),
        ]
    )


def _lines(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines()}


def _ideal(ax) -> dict:
    return {
        line.get_gid(): line
        for line in ax.get_lines()
        if (line.get_gid() or "").startswith("ideal")
    }


def test_plot_draws_a_run_beside_a_users_table(result):
    fig = plot_scaling(result, TABLE, title="CPU vs table")
    ax_t = fig.axes[0]
    weak, strong, table = (
        "weak scaling, cnn (CPU)",
        "strong scaling, cnn (CPU)",
        "a table from 2 ranks",
    )
    lines = _lines(ax_t)
    assert {weak, strong, table} <= set(lines)
    assert list(lines[weak].get_xdata()) == [1, 2, 4]
    assert list(lines[weak].get_ydata()) == [100.0, 180.0, 300.0]
    assert list(lines[table].get_xdata()) == [2, 4, 8]  # sorted by ranks
    # Each series has its own ideal line: linear from its first point.
    ideal = _ideal(ax_t)
    assert list(ideal[f"ideal: {weak}"].get_ydata()) == [100.0, 400.0]
    assert list(ideal[f"ideal: {table}"].get_xdata()) == [2, 8]
    assert list(ideal[f"ideal: {table}"].get_ydata()) == [200.0, 800.0]
    # One legend under both panels; the table's efficiency is against 2 ranks.
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [
        weak,
        strong,
        f"{table} (efficiency vs 2 ranks)",
        "ideal (linear from the first point)",
    ]
    assert ax_t.get_legend() is None and fig.axes[1].get_legend() is None
    assert ax_t.get_ylabel() == "samples/s (all ranks)"
    assert ax_t.get_xlabel() == "ranks (processes or GPUs)"
    assert [t.get_text() for t in ax_t.get_xticklabels()] == ["1", "2", "4", "8"]
    assert ax_t.get_xscale() == ax_t.get_yscale() == "log"
    assert fig._suptitle.get_text() == "CPU vs table"


def test_efficiency_panel_is_relative_to_each_series_smallest_count(result):
    ax_e = plot_scaling(result, TABLE).axes[1]
    lines = _lines(ax_e)
    assert list(lines["weak scaling, cnn (CPU)"].get_ydata()) == pytest.approx(
        [100, 90, 75]
    )
    assert list(lines["strong scaling, cnn (CPU)"].get_ydata()) == pytest.approx(
        [100, 75]
    )
    # No 1-rank point in the table: the legend says what it is relative to.
    assert list(lines["a table from 2 ranks (vs 2 ranks)"].get_ydata()) == (
        pytest.approx([100, 95, 87.5])
    )
    assert list(_ideal(ax_e)["ideal"].get_ydata()) == [100, 100]
    assert ax_e.get_ylabel() == "efficiency (of ideal)"
    assert ax_e.get_title() == "Scaling efficiency"
    assert ax_e.get_ylim() == pytest.approx((0, 110))


def test_plot_reads_the_benchmarks_files_and_any_csv(result, tmp_path):
    json_path, csv_path = result.save(tmp_path / "run")
    assert scaling_series(json_path) == scaling_series(result)
    assert scaling_series(csv_path) == {
        "run weak": [(1, 100.0), (2, 180.0), (4, 300.0)],
        "run strong": [(1, 100.0), (2, 150.0)],
    }
    table = tmp_path / "published.csv"
    table.write_text("Ranks, Throughput ,label\n4,350,B\n1,100,A\n2,190,A\n")
    assert scaling_series(table) == {"B": [(4, 350.0)], "A": [(1, 100.0), (2, 190.0)]}
    plain = tmp_path / "plain.csv"
    plain.write_text("ranks,throughput\n2,190.5\n1,100\n")
    fig = plot_scaling(plain, result, result)  # the same run twice gets a suffix
    labels = list(_lines(fig.axes[0]))
    assert "plain" in labels and "weak scaling, cnn (CPU) (2)" in labels


def test_relative_efficiency_formula():
    assert relative_efficiency([(1, 100.0), (4, 360.0)]) == [(1, 1.0), (4, 0.9)]
    assert relative_efficiency([(2, 200.0), (8, 700.0)]) == [(2, 1.0), (8, 0.875)]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"x": []}, r"series 'x' has no points; give at least one"),
        (
            {"x": [(1, 100.0), (2, 0.0)]},
            r"samples per second must be a number above 0, not 0\.0; at 2 ranks",
        ),
        ({"x": [(1, -5)]}, r"above 0, not -5; at 1 ranks"),
        (
            {"x": [(0, 10.0)]},
            r"series 'x': ranks must be a whole number, 1 or more, not 0",
        ),
        ({"x": [(1.5, 10.0)]}, r"ranks must be a whole number, 1 or more, not 1\.5"),
        ({"x": [(1, 10.0), (1, 11.0)]}, r"more than one throughput for \[1\] ranks"),
        (
            {"x": [(1, 10.0, 3)]},
            r"\(1, 10\.0, 3\) is not a \(ranks, samples per second\) pair",
        ),
        ({"x": "1,100"}, r"series 'x' must be a list of \(ranks, samples per second"),
        ({"": [(1, 1.0)]}, r"series labels must be non-empty strings, got ''"),
    ],
)
def test_bad_tables_are_refused_with_the_reason(table, message):
    with pytest.raises(ValueError, match=message):
        plot_scaling(table)


def test_bad_sources_and_files_are_refused_with_the_reason(tmp_path):
    with pytest.raises(ValueError, match=r"nothing to draw; pass a ScalingResult"):
        plot_scaling()
    with pytest.raises(
        TypeError, match=r"plot_scaling takes a ScalingResult, .*got int"
    ):
        plot_scaling(42)
    with pytest.raises(FileNotFoundError, match=r"no table at .*missing\.csv"):
        plot_scaling(tmp_path / "missing.csv")
    columns = tmp_path / "columns.csv"
    columns.write_text("gpus,images_per_sec\n1,100\n")
    with pytest.raises(
        ValueError,
        match=r"needs columns 'ranks' and 'throughput' \(samples per second\); it "
        r"has \['gpus', 'images_per_sec'\], missing \['ranks', 'throughput'\]",
    ):
        plot_scaling(columns)
    words = tmp_path / "words.csv"
    words.write_text("ranks,throughput\n1,100\n2,fast\n")
    with pytest.raises(
        ValueError, match=r"line 3: ranks='2' and throughput='fast' must both be"
    ):
        plot_scaling(words)
    empty = tmp_path / "empty.csv"
    empty.write_text("ranks,throughput\n")
    with pytest.raises(ValueError, match=r"has a header but no rows"):
        plot_scaling(empty)


def test_docstring_examples_run():
    import doctest

    import workshop.bench.scaling_plots

    assert doctest.testmod(workshop.bench.scaling_plots).failed == 0


def test_the_plot_leaves_no_open_figure_so_a_cell_shows_it_once(result):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    fig = plot_scaling(result, TABLE)
    assert plt.get_fignums() == before  # closed in pyplot, still drawable
    assert fig.axes[0].get_lines()
    plt.close(fig)


# ------------------------------------------------------------------ plot_efficiency
def test_a_table_in_seconds_and_a_run_in_rates_give_the_same_kind_of_series():
    cpu = document_table("cpu-batch50")
    times = dict(cpu.values())
    series = efficiency_series(cpu, {"rates": [(2, 300.0), (8, 900.0)]})
    assert dict(series[cpu.label])[32] == pytest.approx(times[1] / times[32])
    assert series["rates"] == [(2, 1.0), (8, 3.0)]


def test_the_figure_draws_every_series_and_the_ideal():
    import workshop

    mine = workshop.bench.load_scaling(RESULTS / "scaling-gloo-cnn.json")
    table = document_table("estimator-gpus-batch256")
    fig = plot_efficiency(table, mine, title="t")
    speedup, efficiency = fig.axes
    ideal = [line for line in efficiency.get_lines() if line.get_gid() == "ideal"]
    assert len(ideal) == 1 and list(ideal[0].get_ydata()) == [100, 100]
    (ideal,) = [line for line in speedup.get_lines() if line.get_gid() == "ideal"]
    assert list(ideal.get_xdata()) == [1, 8] and list(ideal.get_ydata()) == [1, 8]
    drawn = [line for line in efficiency.get_lines() if line.get_gid() != "ideal"]
    assert len(drawn) == 4  # P100, V100, weak, strong
    # The V100 column at 8 GPUs: 133 s on one over 338 s on eight, out of 8.
    v100 = next(line for line in drawn if 8 in list(line.get_xdata()))
    assert v100.get_ydata()[-1] == pytest.approx(100 * 133 / 338 / 8)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert f"{table.label}, V100" in legend


def test_a_series_from_two_gpus_says_so_in_the_legend():
    fig = plot_efficiency(document_table("horovod-resnet50"))
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(text.endswith("(vs 2)") for text in legend)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="nothing to draw"):
        plot_efficiency()
    with pytest.raises(ValueError, match="'gpu-p100-apis' is not a scaling table"):
        plot_efficiency(document_table("gpu-p100-apis"))
    with pytest.raises(TypeError, match="got int"):
        efficiency_series(3)
