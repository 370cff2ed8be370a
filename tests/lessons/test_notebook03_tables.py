"""workshop.lessons.plot_api_times: a source document's table of single runs (one GPU,
per API) drawn as bars, each with its figure, the V100's beside how much faster it ran
than the P100; scaling tables are sent to plot_efficiency."""

from __future__ import annotations

from dataclasses import replace

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from workshop.lessons import plot_api_times
from workshop.sources import document_table


def _texts(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].texts]


def test_each_bar_is_labelled_with_its_figure_and_the_gain_over_the_first_gpu():
    fig = plot_api_times(document_table("gpu-p100-v100-apis"))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "low-level API",
        "Keras",
        "Estimator",
    ]
    assert sorted(round(bar.get_width()) for bar in ax.patches) == sorted(
        [157, 135, 185, 103, 128, 133]
    )
    assert _texts(fig) == [
        "157 s",
        "135 s",
        "185 s",
        "103 s, 1.52x faster",
        "128 s, 1.05x faster",
        "133 s, 1.39x faster",
    ]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["P100", "V100"]
    assert ax.get_xlabel() == "seconds for the run (20000 iterations)"
    assert ax.get_title() == "MNIST on one GPU, per API (SHARCNET), doc 004"
    assert not plt.fignum_exists(fig.number)  # a cell shows it once


def test_a_table_of_one_gpu_reads_the_approximate_cells():
    fig = plot_api_times(document_table("gpu-p100-apis"), title="one P100")
    assert _texts(fig) == ["157 s", "133 s", "185 s"]  # "~157" as the slide has it
    assert fig.axes[0].get_title() == "one P100"


def test_a_scaling_table_is_sent_to_plot_efficiency():
    with pytest.raises(
        ValueError,
        match=r"cpu-batch50 is a scaling table \(over 'CPU cores'\): draw it with "
        r"workshop\.bench\.plot_efficiency",
    ):
        plot_api_times(document_table("cpu-batch50"))


def test_a_cell_without_a_figure_is_named():
    blank = replace(document_table("gpu-p100-apis"), rows=(("Keras", ""),))
    with pytest.raises(
        ValueError, match=r"^gpu-p100-apis: the cell '' of 'Keras' has no figure$"
    ):
        plot_api_times(blank)
