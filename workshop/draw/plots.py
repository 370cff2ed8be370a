"""Plots of measurements (throughput, speed-up), drawn from plain numbers so the same
function draws a learner's own run, a batch job's saved results, or a published table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["plot_speedup", "plot_throughput"]

# Okabe-Ito: told apart with every common colour-vision deficiency.
COLOURS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442"]
FONT = {
    "font.size": 14,
    "axes.titlesize": 16,
    "axes.labelsize": 15,
    "legend.fontsize": 13,
}


def plot_throughput(series: Mapping[str, Sequence[tuple[int, float]]], title: str = ""):
    """Samples per second against batch size, one line per model.

    Args:
        series: for each model's name, (batch size, samples per second) pairs.
        title: the figure's title.

    Returns:
        The matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    with plt.rc_context(FONT):
        fig, ax = plt.subplots(figsize=(9, 5.5), layout="constrained")
        for i, (name, points) in enumerate(series.items()):
            xs, ys = zip(*sorted(points), strict=True)
            ax.plot(xs, ys, marker="o", lw=2.5, ms=8, color=COLOURS[i % 7], label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size (samples per step)")
        ax.set_ylabel("samples per second")
        ax.set_title(title or "Throughput against batch size")
        ax.grid(True, which="major", alpha=0.4)
        ax.legend()
    return fig


def plot_speedup(
    devices: Sequence[int],
    series: Mapping[str, Sequence[float]],
    title: str = "",
    xlabel: str = "devices",
):
    """Speed-up against the number of devices, with the ideal (linear) line.

    Args:
        devices: device (or rank) counts, e.g. ``[1, 2, 4, 8]``.
        series: for each name, the speed-up at each count (1.0 at one device).
        title: the figure's title.
        xlabel: what is counted.

    Returns:
        The matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    with plt.rc_context(FONT):
        fig, ax = plt.subplots(figsize=(9, 5.5), layout="constrained")
        ax.plot(devices, devices, ls="--", lw=2, color="0.45", label="ideal")
        for i, (name, values) in enumerate(series.items()):
            if len(values) != len(devices):
                raise ValueError(
                    f"series {name!r} has {len(values)} values for {len(devices)} "
                    f"device counts {list(devices)}; give one speed-up per count"
                )
            ax.plot(
                devices,
                values,
                marker="o",
                lw=2.5,
                ms=8,
                color=COLOURS[i % 7],
                label=name,
            )
        ax.set_xticks(list(devices))
        ax.set_xlabel(xlabel)
        ax.set_ylabel("speed-up over one")
        ax.set_title(title or "Speed-up against device count")
        ax.grid(True, alpha=0.4)
        ax.legend()
    return fig
