"""Published scaling figures: each table and quote has a source, the tables are in the
form plot_scaling draws, their numbers agree with what their sources state beside
them, the figures credited to a source document are in it, and the printed list fits
a projector."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from workshop.bench.published import (
    figures_not_in_documents,
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
from workshop.sources.documents import Document, document, holds
from workshop.sources.published import PublishedQuote
from workshop.sources.tables import document_tables


def test_every_table_and_quote_names_its_source():
    items = published_tables() + published_quotes()
    assert items, "no published figures at all"
    for item in items:
        source = item.source
        if isinstance(source, Document):
            # One of the workshop's source documents: named by its key.
            assert document(source.key) is source, item.name
            continue
        assert source.title and source.organisation, item.name
        assert source.url and source.url.startswith("https://"), item.name
        assert source.year is None or 2000 < source.year < 2100, item.name
    names = [item.name for item in items]
    assert len(names) == len(set(names)), "two figures share a name"


def test_every_figure_credited_to_a_document_is_in_it():
    credited = [i for i in published_tables() + published_quotes()
                if isinstance(i.source, Document)]  # fmt: skip
    assert {i.source.key for i in credited} == {"002", "004"}
    for item in credited:
        assert holds(item.source.key, item.numbers_text()), item.name
    assert figures_not_in_documents() == []
    # The points drawn are the document's cells.
    for table in published_tables():
        if table.table is not None:
            assert list(table.points) == table.table.values()


def test_a_quote_with_a_figure_the_document_lacks_is_caught():
    fake = PublishedQuote("fake", "16 GPUs were 75% faster than 8", document("002"))
    assert figures_not_in_documents(fake) == ["fake [doc 002]: 75"]
    real = published_quotes("large-batch-16gpus")[0]
    assert figures_not_in_documents(real, fake) == ["fake [doc 002]: 75"]


def test_the_large_batch_quote_names_its_baseline_and_document():
    (large,) = published_quotes("large-batch-16gpus")
    assert large.source.key == "002"
    text = large.statement
    assert "70% faster than 8 GPUs on one machine" in text
    assert "68.82%" in text and "63.73%" in text
    assert "per-GPU batch" not in text  # the chapter does not say so


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
    # NVIDIA's README has a strong-scaling column of its own; the points are its
    # rounded throughputs. A mistyped figure breaks the match; the printed list
    # gives both where they differ.
    stated = [t for t in published_tables() if t.stated_speedup is not None]
    assert stated
    text = " ".join(published_sources().split())
    for table in stated:
        (_, x0), (_, x) = table.points[0], table.points[-1]
        assert x / x0 == pytest.approx(table.stated_speedup, abs=0.05)
        assert f"{x / x0:.2f}x" in text
        if f"{x / x0:.2f}" != f"{table.stated_speedup:.2f}":
            assert f"says {table.stated_speedup:.2f}x" in text


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


def test_the_documents_own_resnet50_table_scales_far_less_than_nvidias():
    # The lesson of notebook 03: the two V100 tables teach opposite things.
    (nvidia,) = published_tables("resnet50-v100-fp32")
    (sharcnet,) = published_tables("sharcnet-resnet50-v100")
    assert relative_efficiency(list(sharcnet.points))[-1][1] < 0.5
    assert relative_efficiency(list(nvidia.points))[-1][1] > 0.9
    horovod = published_tables("sharcnet-horovod-resnet50")[0]
    assert horovod.points[0][0] == 2 and horovod.points[-1][0] == 64


def test_the_printed_sources_fit_88_columns_and_name_every_figure():
    text = published_sources()
    assert max(len(line) for line in text.splitlines()) <= 88
    flat = " ".join(text.split())
    for item in published_tables() + published_quotes():
        assert item.source.cite() in flat, item.name
        if getattr(item.source, "url", None):
            assert item.source.url in flat, item.name
    # Efficiency worked out from each table's own numbers.
    for table in published_tables():
        efficiency = relative_efficiency(list(table.points))[-1][1]
        assert f"efficiency {efficiency:.0%}" in flat
    for table in document_tables():
        assert f"- {table.name}: " in text
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
        ValueError, match=r"width must be a whole number, 40 or more, not"
    ):
        published_sources(width=width)
