"""Plots of communication benchmarks, sized for a projector.

:func:`plot_allreduce` draws an all-reduce sweep (what ``measure_allreduce`` returns
or ``load_allreduce`` reads back): the measured time against the ring model's, and
the bus bandwidth against the reference memory copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..draw.diagrams import HEIGHT_IN, WIDTH_IN
from ..draw.plots import COLOURS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_allreduce"]

_FONT = {
    "font.size": 13,
    "axes.titlesize": 13,
    "axes.labelsize": 13,
    "legend.fontsize": 11,
    "xtick.labelsize": 12,
    "ytick.labelsize": 12,
}
_BLUE, _ORANGE, _GREEN, _SKY = COLOURS[0], COLOURS[1], COLOURS[2], COLOURS[5]


def plot_allreduce(result: Any, title: str = "") -> Figure:
    """Time and busbw against message size, with the fitted ring model.

    Left: every repetition's time (dots) and each size's median, against the ring
    model ``2(N-1)·alpha + 2(N-1)/N · size / beta`` fitted to the medians, with
    the band of :data:`~workshop.bench.allreduce_result.FIT_TOLERANCE` around it.
    Right: busbw of each median against the model's, under the reference copy's
    bandwidth, drawn as a line. Both axes are logarithmic.

    Args:
        result: an :class:`~workshop.bench.allreduce_result.AllreduceResult`.
        title: the figure's title; by default the backend, ranks and device.

    Returns:
        The matplotlib Figure.

    Raises:
        ValueError: a result of one rank or one size, which has no fit.

    Example:
        >>> result = load_allreduce("allreduce-gloo-N2.json")        # doctest: +SKIP
        >>> plot_allreduce(result).savefig("allreduce.png")         # doctest: +SKIP
    """
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import FixedLocator, NullLocator

    from .allreduce_result import FIT_TOLERANCE, human_size

    fit = result.fit()
    sizes = np.array(result.sizes, dtype=float)
    grid = np.geomspace(sizes[0], sizes[-1], 200)
    model = np.array([fit.predict(s) for s in grid])
    factor = 2 * (result.world_size - 1) / result.world_size
    reference = result.reference_bandwidth / 1e9
    device = result.machine.get("gpu") or result.device
    with plt.rc_context(_FONT):
        # Side by side: whole on a 1280x720 projector (workshop.draw.projector).
        fig, (left, right) = plt.subplots(
            1, 2, figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained"
        )
        for size, times in zip(result.sizes, result.seconds, strict=True):
            left.scatter(
                [size] * len(times),
                np.array(times) * 1e3,
                s=7,
                color=_SKY,
                alpha=0.25,
                lw=0,
                label="each repetition" if size == result.sizes[0] else None,
            )
        left.fill_between(
            grid,
            model * 1e3 * (1 - FIT_TOLERANCE),
            model * 1e3 * (1 + FIT_TOLERANCE),
            color=_ORANGE,
            alpha=0.18,
            lw=0,
            label=f"model ± {FIT_TOLERANCE:.0%}",
        )
        left.plot(
            grid,
            model * 1e3,
            color=_ORANGE,
            lw=2.5,
            label=f"ring model: $\\alpha$ = {fit.alpha * 1e6:.0f} µs, "
            f"$\\beta$ = {fit.beta / 1e9:.2f} GB/s",
        )
        left.plot(
            sizes,
            np.array(result.medians) * 1e3,
            "o",
            ms=7,
            color=_BLUE,
            label="measured (median)",
        )
        left.set_yscale("log")
        left.set_ylabel("time per all-reduce (ms)")
        left.set_title(f"Time: worst model error {fit.max_rel_error:.0%}")

        right.plot(
            sizes,
            np.array(result.busbw) / 1e9,
            "o-",
            lw=2.2,
            ms=7,
            color=_BLUE,
            label="measured busbw (median)",
        )
        right.plot(
            grid,
            grid * factor / model / 1e9,
            "--",
            lw=2.5,
            color=_ORANGE,
            label="ring model",
        )
        right.axhline(
            reference,
            color=_GREEN,
            lw=3,
            ls=":",
            label=f"{result.reference['what']}: {reference:.2f} GB/s",
        )
        right.set_yscale("log")
        right.set_ylabel("bus bandwidth (GB/s)")
        peak = result.peak_busbw / 1e9
        right.set_title(f"busbw: peak {peak:.2f} GB/s = {peak / reference:.0%} of copy")
        step = max(1, len(result.sizes) // 8)
        # Room for each legend outside the data, on the log axis: above the times
        # (which rise to the right), below the busbw (which rises from the left).
        low, high = left.get_ylim()
        left.set_ylim(low, high * (high / low) ** 0.6)
        low, high = right.get_ylim()
        right.set_ylim(low / (high / low) ** 0.5, high)
        for ax, corner in ((left, "upper left"), (right, "lower right")):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(result.sizes[::step]))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([human_size(s) for s in result.sizes[::step]])
            ax.tick_params(axis="x", labelrotation=35)
            ax.set_xlabel("message size")
            ax.grid(True, which="major", alpha=0.4)
            ax.legend(loc=corner, framealpha=0.9)
        fig.suptitle(
            title
            or f"All-reduce of float32 on {result.world_size} ranks, "
            f"{result.backend} on {device}"
        )
    plt.close(fig)  # shown once, as the cell's value
    return fig
