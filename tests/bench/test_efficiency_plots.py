"""plot_efficiency: speed-up and efficiency of tables in seconds and of rates, each
over its own first count, beside the ideal."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest

from workshop.bench.efficiency_plots import efficiency_series, plot_efficiency
from workshop.sources.tables import document_table

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


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
