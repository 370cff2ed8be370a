"""Published scaling figures: each table and quote has a source, the tables are in the
form plot_scaling draws, their numbers agree with what their sources state beside
them, and the printed list fits a projector."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")

import pytest

from workshop.bench.published import (
    published_quotes,
    published_scaling,
    published_sources,
    published_tables,
)
from workshop.bench.scaling_plots import (
    plot_scaling,
    relative_efficiency,
    scaling_series,
)


def test_every_table_and_quote_names_its_source():
    items = published_tables() + published_quotes()
    assert items, "no published figures at all"
    for item in items:
        source = item.source
        assert source.title and source.organisation, item.name
        # An address, or the plain statement that the original was not found.
        assert source.url or "not found" in source.title, item.name
        assert source.url is None or source.url.startswith("https://"), item.name
        assert source.year is None or 2000 < source.year < 2100, item.name
    names = [item.name for item in items]
    assert len(names) == len(set(names)), "two figures share a name"


def test_the_tables_are_what_plot_scaling_draws():
    series = published_scaling()
    assert scaling_series(series) == series  # checked, sorted, unchanged
    assert list(series) == [t.label for t in published_tables()]
    fig = plot_scaling(series)
    try:
        throughput, _ = fig.axes
        labels = [line.get_label() for line in throughput.get_lines()]
        for label in series:
            assert label in labels
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_each_table_agrees_with_the_speed_up_its_source_states():
    # The setup line copies the source's own "strong scaling" column; the points
    # are copied from its throughput columns. A mistyped figure breaks the match.
    for table in published_tables():
        stated = re.search(r"strong scaling ([\d.]+)x on (\d+) GPUs", table.setup)
        assert stated, table.name
        (n0, x0), (n, x) = table.points[0], table.points[-1]
        assert int(stated.group(2)) == n // n0
        assert x / x0 == pytest.approx(float(stated.group(1)), abs=0.05)


def test_a_faster_gpu_scales_less_in_the_same_box():
    # Mixed precision computes each step ~3x faster on the same GPUs and network,
    # so the same all-reduce is a larger share of the step: lower efficiency.
    fp32, amp = published_tables("resnet50-v100-fp32", "resnet50-v100-amp")
    assert amp.points[0][1] > 2 * fp32.points[0][1]
    assert (
        relative_efficiency(list(amp.points))[-1][1]
        < (relative_efficiency(list(fp32.points))[-1][1])
    )


def test_one_table_by_name():
    (table,) = published_tables("resnet50-v100-fp32")
    assert published_scaling("resnet50-v100-fp32") == {table.label: list(table.points)}


def test_the_quotes_the_workshop_material_gives_are_marked_as_quoted():
    (horovod,) = published_quotes("horovod-resnet50-64gpus")
    assert "9,318" in horovod.statement and "64 GPUs" in horovod.statement
    assert "source material" in horovod.source.title
    (large,) = published_quotes("large-batch-16gpus")
    assert "68.8%" in large.statement and "63.7%" in large.statement


def test_the_printed_sources_fit_88_columns_and_name_every_figure():
    text = published_sources()
    assert max(len(line) for line in text.splitlines()) <= 88
    flat = " ".join(text.split())
    for item in published_tables() + published_quotes():
        assert item.source.organisation in flat, item.name
        if item.source.url:
            assert item.source.url in flat, item.name
    # Efficiency worked out from each table's own numbers.
    for table in published_tables():
        efficiency = relative_efficiency(list(table.points))[-1][1]
        assert f"efficiency {efficiency:.0%}" in flat
    narrow = published_sources(width=60)
    assert max(len(line) for line in narrow.splitlines()) <= 60


@pytest.mark.parametrize(
    "call", [published_tables, published_quotes, published_scaling]
)
def test_an_unknown_name_is_refused_with_the_known_ones(call):
    with pytest.raises(
        ValueError, match=r"no published \w+ named \['nope'\]; the known"
    ):
        call("nope")


@pytest.mark.parametrize("width", [39, 0, True, 60.0])
def test_a_width_too_small_is_refused(width):
    with pytest.raises(
        ValueError, match=r"width=.* must be a whole number, 40 or more"
    ):
        published_sources(width=width)
