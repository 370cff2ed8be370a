"""Speed-up and efficiency against the ideal, for tables in seconds or in rates.

A published table may give the time of a whole run (smaller is faster) or a rate
(samples per second); a learner's run gives a rate. Both become a speed-up over the
series' smallest count (time ratio, or rate ratio) and an efficiency, speed-up /
(N / N0), drawn beside the ideal::

    plot_efficiency(document_table("cpu-batch50"), load_scaling("docs/results/..."))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..draw.diagrams import HEIGHT_IN, WIDTH_IN
from ..draw.plots import FONT
from ..sources.doc_table import DocumentTable
from .scaling_plots import Points, scaling_series, series_style

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["efficiency_series", "plot_efficiency"]


def efficiency_series(*sources: Any) -> dict[str, Points]:
    """Each source's speed-up over its smallest count, as ``{label: [(N, x)]}``.

    Args:
        *sources: a :class:`~workshop.sources.tables.DocumentTable` (every measured
            column becomes a series), or anything :func:`scaling_series` reads: a
            ``ScalingResult``, a dict ``{label: [(ranks, samples_per_sec), ...]}``,
            a CSV or JSON path. A dict of speed-ups (``table.speedups("V100")``)
            reads as rates too: a speed-up is a rate over the first one.

    Returns:
        Speed-ups, sorted by count; the first point of each series is 1.

    Raises:
        ValueError: no source, a bad table, or a document table of single runs.
        TypeError: a source of another kind.

    Example:
        >>> efficiency_series({"mine": [(1, 100.0), (4, 300.0)]})
        {'mine': [(1, 1.0), (4, 3.0)]}
    """
    if not sources:
        raise ValueError(
            "nothing to draw; pass a document table "
            "(workshop.sources.document_table(name)), "
            "a ScalingResult or a dict {label: [(ranks, samples_per_sec), ...]}"
        )
    out: dict[str, Points] = {}
    for source in sources:
        if isinstance(source, DocumentTable):
            raw = source.speedups()
        else:
            raw = scaling_series(source)
        for label, points in scaling_series(raw).items():
            unique, k = label, 2
            while unique in out:
                unique, k = f"{label} ({k})", k + 1
            x0 = points[0][1]
            out[unique] = [(n, x / x0) for n, x in points]
    return out


def plot_efficiency(
    *sources: Any,
    title: str = "",
    xlabel: str = "CPU cores, GPUs or ranks",
) -> Figure:
    """Speed-up (left) and efficiency (right) against the count, with the ideal.

    Speed-up is over each series' smallest count: for a table in seconds, time at
    that count / time; for rates, rate / rate at that count. Efficiency is speed-up /
    (N / N0); the ideal is N / N0 and 100 %. A series that starts above 1 (a table
    from 2 GPUs up) says so in the legend.

    Args:
        *sources: document tables, measured runs or tables of rates; see
            :func:`efficiency_series`.
        title: the figure's title.
        xlabel: what is counted.

    Returns:
        The matplotlib Figure, ``fig.axes`` (speed-up, efficiency), whole on a
        1280x720 projector; closed in pyplot, so a cell shows it once.

    Raises:
        ValueError, TypeError: as :func:`efficiency_series`.

    Example:
        >>> fig = plot_efficiency(document_table("cpu-batch50"),
        ...                       document_table("cpu-batch256"))  # doctest: +SKIP
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, NullLocator, PercentFormatter

    series = efficiency_series(*sources)
    counts = sorted({n for points in series.values() for n, _ in points})
    with plt.rc_context(FONT):
        fig, (ax_s, ax_e) = plt.subplots(
            1, 2, figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained"
        )
        handles, labels = [], []
        for i, (label, points) in enumerate(series.items()):
            style = series_style(i)
            ns, gains = zip(*points, strict=True)
            n0 = ns[0]
            (line,) = ax_s.plot(ns, gains, **style)
            ax_e.plot(ns, [100 * g * n0 / n for n, g in points], **style)
            handles.append(line)
            labels.append(label + ("" if n0 == 1 else f" (vs {n0})"))
        ideal_x = [counts[0], counts[-1]]
        ax_s.plot(ideal_x, [1, counts[-1] / counts[0]], ls="--", lw=1.8,
                  color="0.35", gid="ideal")  # fmt: skip
        ax_e.axhline(100, ls="--", lw=1.8, color="0.35", gid="ideal")
        for ax in (ax_s, ax_e):
            ax.set_xscale("log", base=2)
            ax.set_xticks(counts, [str(n) for n in counts])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xlabel(xlabel)
            ax.grid(True, alpha=0.4)
        ax_s.set_yscale("log", base=2)
        ax_s.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax_s.yaxis.set_minor_locator(NullLocator())
        ax_s.set_ylabel("speed-up over the first count")
        ax_s.set_title("Speed-up")
        top = max(max(line.get_ydata()) for line in ax_e.get_lines())
        ax_e.set_ylim(0, max(110, 1.1 * top))
        ax_e.yaxis.set_major_formatter(PercentFormatter())
        ax_e.set_ylabel("efficiency (of ideal)")
        ax_e.set_title("Efficiency = speed-up / (N / N0)")
        handles.append(Line2D([], [], ls="--", lw=1.8, color="0.35"))
        labels.append("ideal (N / N0, 100 %)")
        longest = max(len(text) for text in labels)
        fig.legend(
            handles,
            labels,
            loc="outside lower center",
            ncols=3 if longest <= 30 else 2 if longest <= 56 else 1,
            frameon=False,
        )
        fig.suptitle(title or "Speed-up and efficiency against the ideal")
    plt.close(fig)
    return fig
