"""Published figures at scale: every figure has its source, the figures worked out from
a table agree with the table's own columns (busbw from its times by the workshop's
formula, tokens/s and MFU from its step times), a quote's figures are in its words,
and the pictures fit the projector."""

from __future__ import annotations

import itertools

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from workshop.bench.published_scale import (
    derived,
    plot_published_busbw,
    plot_published_mfu,
    scale_quotes,
    scale_sources,
    scale_tables,
)
from workshop.comm.costmodel import bus_factor
from workshop.draw.projector import MIN_LABEL_PX, NOTEBOOK_AREA_PX, projector_fit
from workshop.sources.documents import numbers_of_text
from workshop.sources.published import PublishedQuote, PublishedTable, Source
from workshop.sources.scale_data import QuotedBandwidth, ScaleTable

BUS = [t for t in scale_tables() if t.x_unit == "bytes"]
TRAINING = [t for t in scale_tables() if t.x_unit == "GPUs"]


def test_every_table_and_quote_names_its_source_exactly():
    items = scale_tables() + scale_quotes()
    assert len(BUS) == 3 and len(TRAINING) == 2 and len(scale_quotes()) >= 10
    for item in items:
        source = item.source
        assert isinstance(source, Source), item.name
        assert source.title and source.organisation, item.name
        assert source.url and source.url.startswith("https://"), item.name
        assert source.year and 2015 < source.year < 2030, item.name
        assert source.cite().startswith(source.organisation), item.name
    names = [item.name for item in items]
    assert len(names) == len(set(names)), "two figures share a name"
    # Reused through the records of workshop.bench.published, not copied.
    assert all(isinstance(t, PublishedTable) for t in scale_tables())
    assert all(isinstance(q, PublishedQuote) for q in scale_quotes())
    # A quote from a GitHub answer says where: repository and issue number.
    for quote in scale_quotes():
        if "GitHub" in quote.source.organisation:
            number = quote.source.url.rsplit("/", 1)[-1]
            assert f"#{number}" in quote.source.title, quote.name


def test_a_quoted_bandwidth_says_its_figures_in_its_own_words():
    quoted = [q for q in scale_quotes() if isinstance(q, QuotedBandwidth)]
    assert {q.link for q in quoted} == {"InfiniBand", "NVLink"}
    for quote in quoted:
        low, high = quote.busbw_gbs
        assert 0 < low <= high < 1000, quote.name
        words = numbers_of_text(quote.statement)
        assert f"{low:g}" in words and f"{high:g}" in words, quote.name
        assert quote.line_rate_gbs > 0, quote.name
    # Rings and trees stay under the line rate; NVLink SHARP adds in the switch,
    # which busbw's 2(n-1)/n does not count, and so shows above it.
    above = {q.name for q in quoted if q.busbw_gbs[0] > q.line_rate_gbs}
    assert above == {"nccl-h100-nvls"}


def test_the_quoted_nvls_algbw_and_busbw_agree_by_the_formula():
    (nvls,) = scale_quotes("nccl-h100-nvls")
    assert "275 GB/s" in nvls.statement  # algbw, as quoted
    assert 275 * bus_factor(8) == pytest.approx(nvls.busbw_gbs[0], rel=0.01)


def test_busbw_worked_out_from_the_printed_times_matches_the_printed_column():
    (table,) = [t for t in BUS if t.columns]
    worked = derived(table)
    assert table.world_size == 8
    for (size, printed), from_time, from_algbw, algbw in zip(
        table.points,
        worked["busbw GB/s"],
        worked["busbw from algbw"],
        worked["algbw GB/s"],
        strict=True,
    ):
        # The output prints 4-5 digits of time and 2 decimals of bandwidth.
        assert from_time == pytest.approx(printed, abs=0.01, rel=2e-3), size
        assert from_algbw == pytest.approx(printed, abs=0.011, rel=1e-3), size
        assert algbw * 1.75 == pytest.approx(from_time)
    # The peak, 8 GiB in 31307 us on 8 GPUs: 274.4 GB/s algbw, 480.2 GB/s busbw.
    peak = table.points.index((8 << 30, 480.16))
    assert worked["algbw GB/s"][peak] == pytest.approx(274.38, abs=0.01)


def test_a_mistyped_busbw_would_be_caught():
    (table,) = [t for t in BUS if t.columns]
    rows = list(table.points)
    rows[-2] = (rows[-2][0], 448.16)  # one digit wrong
    wrong = ScaleTable(**{**table.__dict__, "points": tuple(rows)})
    worked = derived(wrong)["busbw GB/s"]
    assert abs(worked[-2] - wrong.points[-2][1]) > 30


def test_bus_tables_double_the_size_from_1_kib_and_rise_to_a_plateau():
    for table in BUS:
        sizes = [s for s, _ in table.points]
        assert sizes[0] == 1 << 10
        assert all(b == 2 * a for a, b in itertools.pairwise(sizes)), table.name
        assert not table.size_labels or len(table.size_labels) == len(sizes)
        busbw = [b for _, b in table.points]
        assert busbw[-1] > 100 * busbw[0], table.name
    h100 = {t.name: max(b for _, b in t.points) for t in BUS}
    # Two H100 systems (NVIDIA's, Azure's) within 1% of each other; A100 about half.
    assert h100["nccl-allreduce-azure-nd-h100-v5"] == pytest.approx(
        h100["nccl-allreduce-dgx-h100"], rel=0.01
    )
    assert (
        h100["nccl-allreduce-azure-nd-a100-v4"] < 0.5 * h100["nccl-allreduce-dgx-h100"]
    )


def test_training_tables_agree_with_their_own_columns():
    for table in TRAINING:
        worked = derived(table)
        gpus = [x for x, _ in table.points]
        # tokens/s = sequence x batch / step: the batch is 2 per GPU at every count.
        assert worked["global batch"] == pytest.approx([2 * g for g in gpus], rel=2e-3)
        assert worked["MFU %"] == pytest.approx(list(table.column("MFU %")), abs=0.15)
        days = worked["days for 1T tokens"]
        assert [round(d) for d in days] == [
            round(d) for d in table.column("days for 1T tokens")
        ]
        efficiency = worked["weak-scaling efficiency"]
        assert efficiency[0] == 1.0 and 0.9 < efficiency[-1] < 1.0
        # The table's own batch column has a slip at 512 GPUs, which the text says.
        assert table.column("global batch")[2] == 1204
    text = " ".join(scale_sources().split())
    assert "The table prints 1204 at 512 GPUs" in text
    assert "97.9% of that at 128" in text


def test_derived_refuses_a_table_with_nothing_to_work_from():
    azure = scale_tables("nccl-allreduce-azure-nd-h100-v5")[0]
    with pytest.raises(ValueError, match="no times or step times"):
        derived(azure)
    with pytest.raises(ValueError, match="has no column 'time us'"):
        azure.column("time us")


def test_unknown_names_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="nccl-allreduce-dgx-h100"):
        scale_tables("nccl-allreduce-dgx-b200")
    with pytest.raises(ValueError, match="megatron-h100-strong"):
        scale_quotes("llama3-mfu")


def test_the_list_names_every_source_and_fits_88_columns():
    text = scale_sources()
    assert max(len(line) for line in text.splitlines()) <= 88
    flat = " ".join(text.split())
    for item in scale_tables() + scale_quotes():
        assert item.source.url in text, item.name
    for quote in scale_quotes():
        assert " ".join(quote.statement.split()) in flat, quote.name
    assert "at most 0.06 GB/s from the printed busbw" in flat
    with pytest.raises(ValueError, match="40 or more"):
        scale_sources(20)
    narrow = scale_sources(60)
    assert (
        max(len(line) for line in narrow.splitlines() if "https://" not in line) <= 60
    )


def _fits(fig) -> None:
    try:
        fit = projector_fit(fig)
        assert fit.fits, fit.problems
        assert (
            fit.width_px <= NOTEBOOK_AREA_PX[0]
            and fit.smallest_label_px >= MIN_LABEL_PX
        )
        assert not plt.fignum_exists(fig.number)  # closed: a cell shows it once
    finally:
        plt.close(fig)


def test_the_busbw_picture_draws_every_table_and_quote_and_fits():
    model = {"ring model, 450 GB/s": [(1 << k, 400.0 * k / 34) for k in range(10, 35)]}
    fig = plot_published_busbw(extra=model)
    left, right = fig.axes
    drawn = [line.get_label() for line in left.get_lines()]
    for table in BUS:
        assert table.label in drawn
    assert "ring model, 450 GB/s" in drawn
    legend = [t.get_text() for t in right.get_legend().get_texts()]
    assert "InfiniBand, across nodes" in legend and "NVLink, one node" in legend
    _fits(fig)
    _fits(plot_published_busbw("nccl-allreduce-dgx-h100", title="One table"))


def test_the_mfu_picture_draws_the_published_mfu_beside_the_planners_and_fits():
    fig = plot_published_mfu(extra={"planner": [(128, 0.5), (2048, 0.45)]})
    right = fig.axes[1]
    lines = {line.get_label(): line for line in right.get_lines()}
    for table in TRAINING:
        assert list(lines[table.label].get_ydata()) == list(table.column("MFU %"))
    assert list(lines["planner"].get_ydata()) == [50.0, 45.0]
    _fits(fig)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: plot_published_busbw("nemo-gpt3-175b-h100-bf16"), "draws the tables"),
        (lambda: plot_published_mfu("nccl-allreduce-dgx-h100"), "draws the tables"),
        (lambda: plot_published_mfu(extra={"planner": [(128, 45.0)]}), r"in \(0, 1\]"),
        (lambda: plot_published_mfu(extra=[(128, 0.4)]), "must be a dict"),
        (lambda: plot_published_busbw(extra={"x": [(1024,)]}), "pairs"),
        (lambda: plot_published_busbw(extra={"x": [(-1, 3.0)]}), "x > 0"),
    ],
)
def test_bad_input_is_refused_with_what_to_give(call, message):
    with pytest.raises(ValueError, match=message):
        call()
