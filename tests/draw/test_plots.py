"""Measurement plots: the right series, values and labels."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from workshop.draw.plots import plot_speedup, plot_throughput


def test_throughput_plot_has_one_line_per_model():
    fig = plot_throughput(
        {"SmallCNN": [(64, 900.0), (16, 400.0)], "ResNet-18": [(16, 40.0), (64, 55.0)]},
        title="T",
    )
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) == {"SmallCNN", "ResNet-18"}
    assert list(lines["SmallCNN"].get_xdata()) == [16, 64]  # sorted by batch size
    assert list(lines["SmallCNN"].get_ydata()) == [400.0, 900.0]
    assert ax.get_xlabel() == "batch size (samples per step)"
    assert ax.get_ylabel() == "samples per second"
    assert ax.get_title() == "T"


def test_speedup_plot_has_the_ideal_line():
    fig = plot_speedup([1, 2, 4], {"small": [1.0, 1.1, 1.2], "large": [1, 1.9, 3.6]})
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert list(lines["ideal"].get_ydata()) == [1, 2, 4]
    assert list(lines["large"].get_ydata()) == [1, 1.9, 3.6]
    assert ax.get_ylabel() == "speed-up over one"
    with pytest.raises(
        ValueError,
        match=r"series 'small' has 2 values for 3 device "
        r"counts \[1, 2, 4\]",
    ):
        plot_speedup([1, 2, 4], {"small": [1.0, 1.1]})


def test_the_docstring_examples_run():
    import doctest

    import workshop.draw.plots

    assert doctest.testmod(workshop.draw.plots).failed == 0


def test_the_plots_are_closed_in_pyplot_so_a_cell_shows_each_once():
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    figs = [
        plot_throughput({"SmallCNN": [(16, 400.0), (64, 900.0)]}),
        plot_speedup([1, 2], {"SmallCNN": [1.0, 1.8]}),
    ]
    assert plt.get_fignums() == before
    assert all(fig.axes[0].get_lines() for fig in figs)
