"""Scaling plots: throughput and efficiency against the number of ranks.

Drawn from plain numbers, so a learner's run and a published table appear side by
side: a ``ScalingResult`` of :func:`workshop.bench.scaling_bench.measure_scaling`, a
table typed in by hand, ``{"label": [(ranks, samples_per_sec), ...]}``, or a file
(the ``.json`` or ``.csv`` the benchmark writes, or any CSV with columns ``ranks`` and
``throughput``). No published figures live here: whoever quotes one passes it in,
with its source in the label::

    plot_scaling(result, {"Horovod ResNet-50 (paper, Fig. N)": [(2, ...), (64, ...)]})
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..draw.diagrams import HEIGHT_IN, WIDTH_IN
from ..draw.plots import COLOURS, FONT

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_scaling", "relative_efficiency", "scaling_series"]

_MARKERS = ["o", "s", "^", "D", "v", "P", "X"]  # shape as well as colour tells lines


def series_style(i: int) -> dict[str, Any]:
    """The line style of the ``i``-th series of a scaling plot: colour and marker
    both change, so lines stay apart in black and white too."""
    return {
        "color": COLOURS[i % len(COLOURS)],
        "marker": _MARKERS[i % len(_MARKERS)],
        "lw": 2.2,
        "ms": 7,
    }


Points = list[tuple[int, float]]


def _checked(label: Any, points: Any) -> Points:
    """``points`` as sorted (ranks, samples per second) pairs, or a clear error."""
    if not isinstance(label, str) or not label:
        raise ValueError(f"series labels must be non-empty strings, got {label!r}")
    if isinstance(points, (str, bytes)) or not isinstance(points, Sequence):
        raise ValueError(
            f"series {label!r} must be a list of (ranks, samples per second) pairs, "
            f"got {type(points).__name__}"
        )
    if not points:
        raise ValueError(
            f"series {label!r} has no points; give at least one (ranks, samples per "
            "second) pair"
        )
    out: Points = []
    for point in points:
        if (
            isinstance(point, (str, bytes))
            or not isinstance(point, Sequence)
            or (len(point) != 2)
        ):
            raise ValueError(
                f"series {label!r}: {point!r} is not a (ranks, samples per second) pair"
            )
        ranks, rate = point
        if isinstance(ranks, float) and ranks.is_integer():
            ranks = int(ranks)
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
            raise ValueError(
                f"series {label!r}: ranks must be whole numbers, 1 or more; got "
                f"{ranks!r}"
            )
        if (
            isinstance(rate, bool)
            or not isinstance(rate, (int, float))
            or not (math.isfinite(rate) and rate > 0)
        ):
            raise ValueError(
                f"series {label!r}: samples per second must be a number above 0, "
                f"got {rate!r} at {ranks} ranks; leave out counts with no measurement"
            )
        out.append((ranks, float(rate)))
    out.sort()
    repeated = sorted({n for n, _ in out if sum(1 for m, _ in out if m == n) > 1})
    if repeated:
        raise ValueError(
            f"series {label!r} gives more than one throughput for {repeated} ranks; "
            "keep one (the median of repeated runs, say)"
        )
    return out


def _read_csv(path: Path) -> dict[str, Points]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = [h.strip().lower() for h in reader.fieldnames or []]
        missing = [c for c in ("ranks", "throughput") if c not in header]
        if missing:
            raise ValueError(
                f"{str(path)!r} needs columns 'ranks' and 'throughput' (samples per "
                f"second); it has {header}, missing {missing}"
            )
        group = next((c for c in ("label", "mode") if c in header), None)
        series: dict[str, list[tuple[Any, Any]]] = {}
        for line, row in enumerate(reader, start=2):
            row = {k.strip().lower(): (v or "").strip() for k, v in row.items() if k}
            label = path.stem + (f" {row[group]}" if group == "mode" else "")
            label = row[group] if group == "label" else label
            try:
                point = (float(row["ranks"]), float(row["throughput"]))
            except ValueError:
                raise ValueError(
                    f"{str(path)!r} line {line}: ranks={row['ranks']!r} and "
                    f"throughput={row['throughput']!r} must both be numbers"
                ) from None
            series.setdefault(label, []).append(point)
    if not series:
        raise ValueError(f"{str(path)!r} has a header but no rows")
    return series


def scaling_series(source: Any) -> dict[str, Points]:
    """One source of measurements as ``{label: [(ranks, samples/s), ...]}``, sorted.

    Args:
        source: a ``ScalingResult`` (one series per mode), a mapping of label to
            (ranks, samples per second) pairs, or the path of a CSV (columns
            ``ranks``, ``throughput``; a ``label`` or ``mode`` column splits it into
            series), of the JSON the scaling benchmark writes, or of a folder of
            such JSON files (a batch job's steps, read together by ``load_scaling``).

    Returns:
        Each series' points, checked and sorted by rank count.

    Raises:
        TypeError: a source of another kind.
        ValueError: a bad table: no points, ranks below 1, a throughput that is not
            above 0, a rank count given twice, missing CSV columns.
        FileNotFoundError: no such file.

    Example:
        >>> scaling_series({"mine": [(2, 190.0), (1, 100.0)]})
        {'mine': [(1, 100.0), (2, 190.0)]}
    """
    if hasattr(source, "rows") and hasattr(source, "model"):
        raw: dict[str, Any] = {}
        for row in source.rows:
            label = f"{row.mode} scaling, {source.model} ({source.device})"
            raw.setdefault(label, []).append((row.world_size, row.samples_per_second))
    elif isinstance(source, Mapping):
        raw = dict(source)
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir() or path.suffix.lower() == ".json":
            # A batch job's results: one JSON file per world size, in one folder.
            from .scaling_files import load_scaling

            return scaling_series(load_scaling(path))
        if not path.is_file():
            raise FileNotFoundError(f"no table at {str(path)!r}")
        raw = _read_csv(path)
    else:
        raise TypeError(
            "plot_scaling takes a ScalingResult, a dict {label: [(ranks, "
            "samples_per_sec), ...]}, or the path of a CSV (columns ranks, "
            f"throughput) or JSON file; got {type(source).__name__}"
        )
    return {label: _checked(label, points) for label, points in raw.items()}


def relative_efficiency(points: Points) -> Points:
    """Efficiency of each point against the first (the smallest rank count).

    ``(X_N / X_0) * (N_0 / N)``: with a 1-rank first point, X_N / (N X_1), the weak
    scaling efficiency; for a fixed global batch it equals (T_1 / T_N) / N, the strong
    scaling one, since throughput is the global batch over the step time.

    Example:
        >>> relative_efficiency([(1, 100.0), (4, 360.0)])
        [(1, 1.0), (4, 0.9)]
    """
    n0, x0 = points[0]
    return [(n, (x / x0) * (n0 / n)) for n, x in points]


def plot_scaling(
    *sources: Any,
    title: str = "",
    xlabel: str = "ranks (processes or GPUs)",
    log: bool = True,
) -> Figure:
    """Throughput and efficiency against ranks, each with its ideal line.

    Left: samples per second (all ranks together), each series with a dashed line of
    its own colour for perfect scaling from its first point. Right: efficiency, with
    the ideal at 100 %. Efficiency is computed against each series' smallest rank
    count; where that is not 1 (a published table from 2 GPUs up, say), the legend
    says so: "(vs 2 ranks)".

    Args:
        *sources: one or more of: a ``ScalingResult``, a dict ``{label: [(ranks,
            samples_per_sec), ...]}``, the path of a CSV (``ranks``, ``throughput``
            columns), of the benchmark's JSON or of a folder of them. See
            :func:`scaling_series`.
        title: the figure's title.
        xlabel: what the ranks are.
        log: logarithmic axes for the throughput (base 2 for ranks), so that a
            CPU's hundreds and a cluster's thousands fit in one panel.

    Returns:
        The matplotlib Figure; ``fig.axes`` is (throughput, efficiency).

    Raises:
        ValueError: no source, or a bad table (see :func:`scaling_series`).
        TypeError: a source of another kind.

    Example:
        >>> published = {"published (source)": [(2, 180.0), (8, 650.0)]}
        >>> fig = plot_scaling(result, published)          # doctest: +SKIP
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import (
        FuncFormatter,
        NullFormatter,
        NullLocator,
        PercentFormatter,
    )

    if not sources:
        raise ValueError(
            "nothing to draw; pass a ScalingResult, a dict {label: [(ranks, "
            "samples_per_sec), ...]} or a CSV path"
        )
    series: dict[str, Points] = {}
    for source in sources:
        for label, points in scaling_series(source).items():
            unique, k = label, 2
            while unique in series:  # two runs of the same model and mode
                unique, k = f"{label} ({k})", k + 1
            series[unique] = points
    ranks_drawn = sorted({n for points in series.values() for n, _ in points})

    with plt.rc_context(FONT):
        # Side by side, one legend under both: whole on a 1280x720 projector
        # (workshop.draw.projector), with nothing drawn over the lines.
        fig, (ax_t, ax_e) = plt.subplots(
            1, 2, figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained"
        )
        handles, labels = [], []
        for i, (label, points) in enumerate(series.items()):
            style = series_style(i)
            ranks, rates = zip(*points, strict=True)
            (line,) = ax_t.plot(ranks, rates, label=label, **style)
            (n0, x0), last = points[0], ranks[-1]
            (ideal,) = ax_t.plot(
                [n0, last], [x0, x0 * last / n0], ls="--", lw=1.6,
                color=style["color"], alpha=0.8, label="_ideal",
            )  # fmt: skip
            ideal.set_gid(f"ideal: {label}")
            efficiency = [100 * e for _, e in relative_efficiency(points)]
            relative = "" if n0 == 1 else f" (vs {n0} ranks)"
            ax_e.plot(ranks, efficiency, label=label + relative, **style)
            handles.append(line)
            labels.append(label + ("" if n0 == 1 else f" (efficiency vs {n0} ranks)"))
        ax_e.axhline(100, ls="--", lw=1.8, color="0.35", label="ideal", gid="ideal")
        for ax in (ax_t, ax_e):
            if log:
                ax.set_xscale("log", base=2)
            ax.set_xticks(ranks_drawn, [str(n) for n in ranks_drawn])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xlabel(xlabel)
            ax.grid(True, alpha=0.4)
        if log:
            ax_t.set_yscale("log")
        ax_t.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        # A log axis labels its minor ticks in scientific notation (4x10^3) beside
        # plain major ones; write them all the same way, and label minor ticks only
        # when the range holds no more than a few of them.
        low, high = ax_t.get_ylim()
        if log and high / max(low, 1e-12) < 30:
            ax_t.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        elif log:
            ax_t.yaxis.set_minor_formatter(NullFormatter())
        ax_t.set_ylabel("samples/s (all ranks)")
        ax_t.set_title("Throughput")
        handles.append(Line2D([], [], ls="--", lw=1.6, color="0.35"))
        labels.append("ideal (linear from the first point)")
        longest = max(len(text) for text in labels)
        fig.legend(
            handles,
            labels,
            loc="outside lower center",
            ncols=3 if longest <= 30 else 2 if longest <= 56 else 1,
            frameon=False,
        )
        top = max(max(line.get_ydata()) for line in ax_e.get_lines())
        ax_e.set_ylim(0, max(110, 1.1 * top))
        ax_e.yaxis.set_major_formatter(PercentFormatter())
        ax_e.set_ylabel("efficiency (of ideal)")
        ax_e.set_title("Scaling efficiency")
        fig.suptitle(title or "Scaling: throughput and efficiency against ranks")
    plt.close(fig)  # shown once, as the cell's value; no figure left open
    return fig
