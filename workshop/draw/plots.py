"""Plots of measurements (throughput, speed-up), drawn from plain numbers so the same
function draws a learner's own run, a batch job's saved results, or a published table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

# The plots' type is the lane diagrams' (12 points and up: the projector's 12 px).
from .diagrams import FIT_FONT as FONT

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_speedup", "plot_throughput"]

# Okabe-Ito: told apart with every common colour-vision deficiency.
COLOURS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442"]
# Whole on a 1280x720 projector (1100 x 456 px of notebook, workshop.draw.projector)
# at the inline backend's 100 dpi: one panel, its legend beside it.
FIGSIZE = (8.6, 4.2)


def plot_throughput(
    series: Mapping[str, Sequence[tuple[int, float]]], title: str = ""
) -> Figure:
    """Samples per second against batch size, one line per model.

    Args:
        series: for each model's name, (batch size, samples per second) pairs.
        title: the figure's title.

    Returns:
        The matplotlib Figure, whole on a 1280x720 projector; closed in pyplot, so
        a cell that ends with it shows it once.

    Example:
        >>> fig = plot_throughput({"SmallCNN": [(64, 900.0), (16, 400.0)]})
        >>> [t.get_text() for t in fig.axes[0].get_xticklabels()]
        ['16', '64']
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullLocator

    with plt.rc_context(FONT):
        fig, ax = plt.subplots(figsize=FIGSIZE, layout="constrained")
        for i, (name, points) in enumerate(series.items()):
            xs, ys = zip(*sorted(points), strict=True)
            ax.plot(xs, ys, marker="o", lw=2.5, ms=8, color=COLOURS[i % 7], label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        # The batch sizes measured, written plainly (not 2^5), as ticks.
        sizes = sorted({b for points in series.values() for b, _ in points})
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.set_xlabel("batch size (samples per step)")
        ax.set_ylabel("samples per second")
        ax.set_title(title or "Throughput against batch size")
        ax.grid(True, which="major", alpha=0.4)
        ax.legend(loc="best")
    plt.close(fig)  # shown once, as the cell's value
    return fig


def plot_speedup(
    devices: Sequence[int],
    series: Mapping[str, Sequence[float]],
    title: str = "",
    xlabel: str = "devices",
) -> Figure:
    """Speed-up against the number of devices, with the ideal (linear) line.

    Args:
        devices: device (or rank) counts, e.g. ``[1, 2, 4, 8]``.
        series: for each name, the speed-up at each count (1.0 at one device).
        title: the figure's title.
        xlabel: what is counted.

    Returns:
        The matplotlib Figure, whole on a 1280x720 projector; closed in pyplot, so
        a cell that ends with it shows it once.

    Raises:
        ValueError: a series without one speed-up per device count.

    Example:
        >>> fig = plot_speedup([1, 2, 4], {"SmallCNN": [1.0, 1.8, 2.9]})
        >>> [line.get_label() for line in fig.axes[0].get_lines()]
        ['ideal', 'SmallCNN']
    """
    import matplotlib.pyplot as plt

    with plt.rc_context(FONT):
        fig, ax = plt.subplots(figsize=FIGSIZE, layout="constrained")
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
        # Upper left lies above the speed-ups (none beats the ideal line).
        ax.legend(loc="upper left")
    plt.close(fig)  # shown once, as the cell's value
    return fig
