"""Published figures at scale (kept in :mod:`workshop.sources.scale_data`), to hold
the layout planner against: what follows from them (busbw from printed times, MFU,
weak-scaling efficiency) is computed by :func:`derived`, never stored as published;
:func:`scale_sources` prints them, and two plots draw them for a projector."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..comm.costmodel import algbw, bus_factor, busbw
from ..draw.diagrams import HEIGHT_IN, WIDTH_IN
from ..draw.plots import COLOURS, FONT
from ..sources.documents import pick_named
from ..sources.scale_data import QUOTES, TABLES, QuotedBandwidth, ScaleTable
from .published import PublishedQuote, line_wrapper

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "derived",
    "plot_published_busbw",
    "plot_published_mfu",
    "scale_quotes",
    "scale_sources",
    "scale_tables",
]


def scale_tables(*names: str) -> list[ScaleTable]:
    """The published tables at scale, each with its source: three of bus bandwidth
    by message size, two of GPT-3 175B training throughput by GPU count.

    Raises:
        ValueError: an unknown name (``ScaleTable.name``); the message lists them.

    Example:
        >>> [t.name for t in scale_tables() if t.x_unit == "GPUs"]
        ['nemo-gpt3-175b-h100-bf16', 'nemo-gpt3-175b-h100-fp8']
    """
    return pick_named(TABLES, names, "published table at scale")


def scale_quotes(*names: str) -> list[PublishedQuote]:
    """Published single figures at scale: bus bandwidths quoted by NCCL's
    maintainers (:class:`QuotedBandwidth`) and model-FLOPs utilisation of large runs.

    Raises:
        ValueError: an unknown name; the message lists the known ones.

    Example:
        >>> scale_quotes("nccl-dgx-a100-8xhdr")[0].busbw_gbs
        (192.0, 192.0)
    """
    return pick_named(QUOTES, names, "published quote at scale")


def derived(table: ScaleTable) -> dict[str, list[float]]:
    """What follows from a table's printed figures, one value per point.

    A bus-bandwidth table with times gives ``"algbw GB/s"``, ``"busbw GB/s"`` and
    ``"busbw from algbw"``; a training table gives the ``"global batch"`` its
    throughput implies, ``"MFU %"``, ``"days for 1T tokens"`` and
    ``"weak-scaling efficiency"`` (tokens/s per GPU over the first point's).

    Raises:
        ValueError: a table with nothing to derive (no times, no step times).

    Example:
        >>> (table,) = scale_tables("nccl-allreduce-dgx-h100")
        >>> round(derived(table)["busbw GB/s"][-2], 1)
        480.2
    """
    xs = [x for x, _ in table.points]
    ys = [y for _, y in table.points]
    names = [key for key, _ in table.columns]
    if table.x_unit == "bytes" and "time us" in names and table.world_size:
        n = table.world_size
        times = [t * 1e-6 for t in table.column("time us")]
        return {
            "algbw GB/s": [algbw(s, t) / 1e9 for s, t in zip(xs, times, strict=True)],
            "busbw GB/s": [
                busbw(s, t, n) / 1e9 for s, t in zip(xs, times, strict=True)
            ],
            "busbw from algbw": [
                busbw(a * 1e9, 1.0, n) / 1e9 for a in table.column("algbw GB/s")
            ],
        }
    if table.x_unit == "GPUs" and "step s" in names and table.seq:
        assert table.flops_per_sequence and table.peak_tflops
        steps = table.column("step s")
        per_gpu = [y / x for x, y in table.points]
        sequences = [y / table.seq for y in ys]
        return {
            "global batch": [y * s / table.seq for y, s in zip(ys, steps, strict=True)],
            "MFU %": [
                100 * q * table.flops_per_sequence / x / (table.peak_tflops * 1e12)
                for q, x in zip(sequences, xs, strict=True)
            ],
            "days for 1T tokens": [1e12 / y / 86400 for y in ys],
            "weak-scaling efficiency": [p / per_gpu[0] for p in per_gpu],
        }
    raise ValueError(
        f"table {table.name!r} prints no times or step times to derive from; "
        "derived() works on the bus-bandwidth table with times and the training tables"
    )


def _size(size: float) -> str:
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= unit:
            return f"{size / unit:g} {name}"
    return f"{size:g} B"


def _bus_lines(table: ScaleTable) -> list[str]:
    (s0, b0), (s_peak, b_peak) = table.points[0], max(table.points, key=lambda p: p[1])
    text = (
        f"{table.label}: busbw {b0:g} GB/s at {_size(s0)}, peak {b_peak:g} GB/s at "
        f"{_size(s_peak)}."
    )
    if table.size_labels:
        text += (
            f" Its sizes, printed {table.size_labels[0]} to {table.size_labels[-1]}, "
            f"are {_size(s0)} to {_size(table.points[-1][0])}, doubling."
        )
    lines = [text]
    if table.columns:
        worked = derived(table)["busbw GB/s"]
        worst = max(abs(w - b) for w, (_, b) in zip(worked, table.points, strict=True))
        factor = bus_factor(table.world_size or 1)
        lines.append(
            f"Worked out from its size and time, x 2(n-1)/n = {factor:g}: "
            f"{worked[table.points.index((s_peak, b_peak))]:.1f} GB/s at the peak; "
            f"at most {worst:.2f} GB/s from the printed busbw at any size (the "
            "printed times and bandwidths are rounded)."
        )
    return lines


def _training_lines(table: ScaleTable) -> list[str]:
    worked = derived(table)
    tokens = ", ".join(f"{x}: {y:,.0f}" for x, y in table.points)
    mfu = table.column("MFU %")
    implied = [round(b) for b in worked["global batch"]]
    printed = [round(b) for b in table.column("global batch")]
    lines = [
        f"{table.label}, tokens/s by GPUs: {tokens}; MFU {mfu[0]:.2f}% to "
        f"{mfu[-1]:.2f}%.",
        f"Worked out: per-GPU throughput at {table.points[-1][0]} GPUs is "
        f"{worked['weak-scaling efficiency'][-1]:.1%} of that at "
        f"{table.points[0][0]}; MFU from tokens/s {worked['MFU %'][0]:.2f}% to "
        f"{worked['MFU %'][-1]:.2f}%; the throughput implies global batches "
        f"{', '.join(map(str, implied))}.",
    ]
    slips = [
        f"{p} at {x} GPUs"
        for p, i, (x, _) in zip(printed, implied, table.points, strict=True)
        if p != i
    ]
    if slips:
        lines.append(
            f"The table prints {', '.join(slips)}: a slip, since its own throughput "
            "and step time need the batch worked out above."
        )
    return lines


def scale_sources(width: int = 88) -> str:
    """Every published figure at scale with its source, and what follows from it
    (:func:`derived`); quoted bus bandwidths beside their link's line rate.

    Args:
        width: the longest line, in characters; at least 40.

    Raises:
        ValueError: ``width`` below 40.

    Example:
        >>> print(scale_sources())                                  # doctest: +SKIP
    """
    wrap = line_wrapper(width, break_long_words=False)
    lines = wrap(
        "All-reduce bus bandwidth, 8 GPUs in one node (plot_published_busbw, left):", ""
    )
    bus = [t for t in TABLES if t.x_unit == "bytes"]
    training = [t for t in TABLES if t.x_unit == "GPUs"]
    for table in bus + training:
        part = _training_lines if table in training else _bus_lines
        if table is training[0]:
            lines += wrap("Training throughput at scale (plot_published_mfu):", "")
        first, *rest = part(table)
        lines += wrap(first)
        for text in [*rest, table.setup + ".", f"Source: {table.source.cite()}"]:
            lines += wrap(text, "    ")
    lines += wrap(
        "Bus bandwidths quoted on their own, against their link's line "
        "rate (plot_published_busbw, right):",
        "",
    )
    others = []
    for quote in QUOTES:
        if not isinstance(quote, QuotedBandwidth):
            others.append(quote)
            continue
        low, high = quote.busbw_gbs
        share = f"{low / quote.line_rate_gbs:.0%}"
        if high != low:
            share += f" to {high / quote.line_rate_gbs:.0%}"
        lines += wrap(f"{quote.statement}.")
        lines += wrap(
            f"That is {share} of a {quote.line_rate_gbs:g} GB/s line rate "
            f"({quote.link}). Source: {quote.source.cite()}",
            "    ",
        )
    lines += wrap("Utilisation of large runs, quoted (not drawn):", "")
    for quote in others:
        lines += wrap(f"{quote.statement}.")
        lines += wrap(f"Source: {quote.source.cite()}", "    ")
    return "\n".join(lines)


# ------------------------------------------------------------------ pictures
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


def plot_published_busbw(
    *names: str,
    extra: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    title: str = "",
) -> Figure:
    """Published all-reduce bus bandwidth: by message size in one node (left), and
    quoted peaks against their link's line rate (right; a point above the line, NVLink
    SHARP, adds inside the switch, which busbw's formula does not count).

    Args:
        *names: bus-bandwidth tables to draw on the left; none for all three.
        extra: ``{label: [(bytes, busbw GB/s), ...]}`` drawn dashed beside them (the
            planner's busbw, or a learner's ``measure_allreduce``).

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
            style = dict(marker=_MARKERS[i], ms=5, lw=2.2, color=COLOURS[i])
            left.plot(xs, ys, label=table.label, **style)
        for j, (label, points) in enumerate(more.items()):
            xs, ys = zip(*points, strict=True)
            sizes |= set(xs)
            colour = COLOURS[(len(tables) + j) % 7]
            left.plot(xs, ys, ls="--", lw=2.2, color=colour, label=label)
        left.set_xscale("log", base=2)
        left.set_yscale("log")
        low, high = min(sizes), max(sizes)
        first, last = math.ceil(math.log2(low)), math.floor(math.log2(high))
        ticks = [2.0**k for k in range(first, last + 1, 4)]
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
            bars = dict(ms=8, color=colour, capsize=4, lw=0, elinewidth=2)
            label = f"{link}, {where}"
            right.errorbar(xs, mids, yerr=spans, fmt=marker, label=label, **bars)
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
            ideal = [ys[0], ys[0] * xs[-1] / xs[0]]
            left.plot(
                [xs[0], xs[-1]], ideal, ls="--", lw=1.5, color=COLOURS[i], alpha=0.8
            )
            right.plot(xs, table.column("MFU %"), label=table.label, **style)
        for j, (label, points) in enumerate(more.items()):
            xs, ys = zip(*points, strict=True)
            gpus |= set(xs)
            style = dict(ls="--", marker="x", ms=8, lw=2.2, label=label)
            colour = COLOURS[(len(tables) + j) % 7]
            right.plot(xs, [100 * y for y in ys], color=colour, **style)
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
