"""Pictures of the published figures at scale (:mod:`workshop.bench.published_scale`),
sized for a 1280x720 projector, with room for the planner's own numbers beside them.

:func:`plot_published_busbw`: all-reduce bus bandwidth by message size on the 8 GPUs
of one node, and the bus bandwidths NCCL maintainers quoted against the line rate of
the link they ran over. :func:`plot_published_mfu`: GPT-3 175B throughput and MFU on
128 to 2,048 H100 GPUs, as NVIDIA published them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..draw.diagrams import HEIGHT_IN, WIDTH_IN
from ..draw.plots import COLOURS, FONT
from .published_scale import scale_quotes, scale_tables
from .published_scale_data import QuotedBandwidth, ScaleTable

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_published_busbw", "plot_published_mfu"]

_MARKERS = ["o", "s", "^", "D", "v", "P"]


def _tables(names: Sequence[str], x_unit: str, what: str) -> list[ScaleTable]:
    tables = [t for t in scale_tables(*names) if t.x_unit == x_unit]
    if not tables or len(tables) < len(names):
        fit = [t.name for t in scale_tables() if t.x_unit == x_unit]
        raise ValueError(
            f"{what} draws the tables {fit}; got {list(names)}, which are not all "
            "among them"
        )
    return tables


def _extra(extra: Any, what: str, low: float, high: float) -> dict[str, list]:
    """``extra`` as {label: sorted [(x, y), ...]}, every y within (low, high]."""
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise ValueError(
            f"extra must be a dict {{label: [({what}), ...]}}, got "
            f"{type(extra).__name__}"
        )
    series = {}
    for label, points in extra.items():
        try:
            pairs = sorted((float(x), float(y)) for x, y in points)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"extra[{label!r}] must be ({what}) pairs, got {points!r}"
            ) from error
        bad = [p for p in pairs if not (p[0] > 0 and low < p[1] <= high)]
        if not pairs or bad:
            raise ValueError(
                f"extra[{label!r}]: give one or more ({what}) pairs with x > 0 and y "
                f"in ({low:g}, {high:g}]; these are not: {bad or points!r}"
            )
        series[str(label)] = pairs
    return series


def _size(size: float) -> str:
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= unit:
            return f"{size / unit:g} {name}"
    return f"{size:g} B"


def plot_published_busbw(
    *names: str,
    extra: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    title: str = "",
) -> Figure:
    """Published all-reduce bus bandwidth: by message size in one node (left), and
    quoted peaks against their link's line rate (right).

    Left: each bus-bandwidth table of :func:`scale_tables` (busbw against message
    size, both axes logarithmic), and ``extra`` series, dashed: the planner's
    alpha-beta busbw, or the learner's own ``measure_allreduce``. Right: each
    :class:`QuotedBandwidth`, InfiniBand between nodes and NVLink within one, with
    the line where busbw equals the line rate. A point above it (NVLink SHARP) adds
    inside the switch, which busbw's formula does not count.

    Args:
        *names: bus-bandwidth tables to draw on the left; none for all three.
        extra: ``{label: [(bytes, busbw GB/s), ...]}`` drawn beside them.
        title: the figure's title.

    Returns:
        The Figure, whole on a 1280x720 projector; closed in pyplot.

    Raises:
        ValueError: a name that is not a bus-bandwidth table; ``extra`` that is not
            (bytes, GB/s) pairs with positive values up to 10,000 GB/s.

    Example:
        >>> fig = plot_published_busbw(extra={"ring model, 450 GB/s": [(1 << 30, 400)]})
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    tables = _tables(names, "bytes", "plot_published_busbw")
    more = _extra(extra, "bytes, busbw GB/s", 0.0, 1e4)
    quotes = [q for q in scale_quotes() if isinstance(q, QuotedBandwidth)]
    with plt.rc_context(FONT):
        fig, (left, right) = plt.subplots(
            1, 2, figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained"
        )
        sizes: set[float] = set()
        for i, table in enumerate(tables):
            xs, ys = zip(*table.points, strict=True)
            sizes |= set(xs)
            left.plot(
                xs,
                ys,
                marker=_MARKERS[i],
                ms=5,
                lw=2.2,
                color=COLOURS[i],
                label=table.label,
            )
        for j, (label, points) in enumerate(more.items()):
            xs, ys = zip(*points, strict=True)
            sizes |= set(xs)
            left.plot(
                xs,
                ys,
                ls="--",
                lw=2.2,
                color=COLOURS[(len(tables) + j) % 7],
                label=label,
            )
        left.set_xscale("log", base=2)
        left.set_yscale("log")
        low, high = min(sizes), max(sizes)
        ticks = [
            2.0**k
            for k in range(
                math.ceil(math.log2(low)), math.floor(math.log2(high)) + 1, 4
            )
        ]
        left.xaxis.set_major_locator(FixedLocator(ticks))
        left.xaxis.set_minor_locator(NullLocator())
        left.set_xticklabels([_size(t) for t in ticks])
        left.tick_params(axis="x", labelrotation=30)
        left.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        left.set_xlabel("message size")
        left.set_ylabel("busbw (GB/s)")
        left.set_title("8 GPUs in one node, by size")
        left.grid(True, which="major", alpha=0.4)
        # Under both panels: the curves fill the left panel's diagonal.
        fig.legend(
            *left.get_legend_handles_labels(),
            loc="outside lower center",
            ncols=2,
            fontsize=12,
            frameon=False,
        )

        rates = [q.line_rate_gbs for q in quotes]
        line = [min(rates) * 0.8, max(rates) * 1.6]
        right.plot(line, line, ls="--", lw=1.8, color="0.45", label="busbw = line rate")
        for link, colour, marker in (
            ("InfiniBand", COLOURS[0], "o"),
            ("NVLink", COLOURS[3], "s"),
        ):
            group = [q for q in quotes if q.link == link]
            if not group:
                continue
            xs = [q.line_rate_gbs for q in group]
            mids = [(q.busbw_gbs[0] + q.busbw_gbs[1]) / 2 for q in group]
            spans = [(q.busbw_gbs[1] - q.busbw_gbs[0]) / 2 for q in group]
            where = "across nodes" if link == "InfiniBand" else "one node"
            right.errorbar(
                xs,
                mids,
                yerr=spans,
                fmt=marker,
                ms=8,
                color=colour,
                capsize=4,
                lw=0,
                elinewidth=2,
                label=f"{link}, {where}",
            )
        for q in quotes:
            if q.link == "NVLink":
                above = q.busbw_gbs[0] > q.line_rate_gbs
                name = "SHARP" if above else "ring"
                right.annotate(
                    f"{name} {q.busbw_gbs[0]:g}",
                    (q.line_rate_gbs, q.busbw_gbs[0]),
                    xytext=(-8, 4 if above else -4),
                    textcoords="offset points",
                    ha="right",
                    va="bottom" if above else "top",
                    fontsize=12,
                )
        right.set_xscale("log")
        right.set_yscale("log")
        for axis in (right.xaxis, right.yaxis):
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        right.set_xlabel("line rate (GB/s): a node's NICs, or a GPU's NVLink")
        right.set_ylabel("quoted busbw (GB/s)")
        right.set_title("Quoted by NCCL's maintainers")
        right.grid(True, which="major", alpha=0.4)
        right.legend(loc="upper left", fontsize=12, framealpha=0.9)
        fig.suptitle(
            title or "Published all-reduce bus bandwidth (sources: scale_sources())"
        )
    plt.close(fig)  # shown once, as the cell's value
    return fig


def plot_published_mfu(
    *names: str,
    extra: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    title: str = "",
) -> Figure:
    """GPT-3 175B training on 128 to 2,048 H100 GPUs as NVIDIA published it:
    throughput (left, with ideal weak scaling from the first point) and MFU (right).

    Args:
        *names: training tables of :func:`scale_tables`; none for both (BF16, FP8).
        extra: ``{label: [(GPUs, MFU as a fraction), ...]}`` drawn dashed on the
            right: the planner's estimate for the same model and layout.
        title: the figure's title.

    Returns:
        The Figure, whole on a 1280x720 projector; closed in pyplot.

    Raises:
        ValueError: a name that is not a training table; ``extra`` that is not
            (GPUs, fraction) pairs with the fraction in (0, 1].

    Example:
        >>> fig = plot_published_mfu(extra={"planner": [(128, 0.5), (2048, 0.48)]})
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullLocator, PercentFormatter

    tables = _tables(names, "GPUs", "plot_published_mfu")
    more = _extra(extra, "GPUs, MFU fraction", 0.0, 1.0)
    with plt.rc_context(FONT):
        fig, (left, right) = plt.subplots(
            1, 2, figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained"
        )
        gpus: set[float] = set()
        for i, table in enumerate(tables):
            xs, ys = zip(*table.points, strict=True)
            gpus |= set(xs)
            style = dict(marker=_MARKERS[i], ms=7, lw=2.2, color=COLOURS[i])
            left.plot(xs, ys, label=table.label, **style)
            left.plot(
                [xs[0], xs[-1]],
                [ys[0], ys[0] * xs[-1] / xs[0]],
                ls="--",
                lw=1.5,
                color=COLOURS[i],
                alpha=0.8,
            )
            right.plot(xs, table.column("MFU %"), label=table.label, **style)
        for j, (label, points) in enumerate(more.items()):
            xs, ys = zip(*points, strict=True)
            gpus |= set(xs)
            right.plot(
                xs,
                [100 * y for y in ys],
                ls="--",
                marker="x",
                ms=8,
                lw=2.2,
                color=COLOURS[(len(tables) + j) % 7],
                label=label,
            )
        ticks = sorted(gpus)
        for ax in (left, right):
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xlabel("H100 GPUs")
            ax.grid(True, alpha=0.4)
        left.set_yscale("log")
        left.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        left.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        left.set_ylabel("tokens/s (all GPUs)")
        left.set_title("Throughput (dashed: ideal)")
        left.legend(loc="lower right", fontsize=12)
        top = max(max(line.get_ydata()) for line in right.get_lines())
        right.set_ylim(0, max(60.0, 1.15 * top))
        right.yaxis.set_major_formatter(PercentFormatter())
        right.set_ylabel("MFU (of the GPU's peak)")
        right.set_title("MFU as published")
        right.legend(loc="lower left", fontsize=12)
        fig.suptitle(
            title or "GPT-3 175B, weak scaling on H100 (NVIDIA; scale_sources())"
        )
    plt.close(fig)  # shown once, as the cell's value
    return fig
