"""Notebook 03 §7's picture of a source document's table of single runs: the same
MNIST network written with three of TensorFlow's APIs, timed on one P100 and on one
V100 (W. Guan's SHARCNET slides, ``document_table("gpu-p100-v100-apis")``).

A scaling table is drawn by ``workshop.bench.plot_efficiency``; this one has no count
to scale over, so its runs are drawn as bars, one group per API.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..draw.plots import COLOURS, FIGSIZE, FONT

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..sources.doc_table import DocumentTable

__all__ = ["plot_api_times"]

_FIRST_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def plot_api_times(table: DocumentTable, title: str = "") -> Figure:
    """A table of single runs as bars: one group per row (an API), one bar per
    measured column (a GPU), each labelled with its figure; the bar of a column
    after the first also says how much faster it ran than the first column's.

    Args:
        table: a document table of single runs (``table.count`` is None), e.g.
            ``workshop.sources.document_table("gpu-p100-v100-apis")``.
        title: the figure's title (default: the table's label and source).

    Returns:
        The matplotlib Figure, whole on a 1280x720 projector; closed in pyplot, so a
        cell that ends with it shows it once.

    Raises:
        ValueError: a scaling table (one with a count column), or a cell without a
            figure.

    Example:
        >>> from workshop.sources import document_table
        >>> fig = plot_api_times(document_table("gpu-p100-v100-apis"))
        >>> [t.get_text() for t in fig.axes[0].get_yticklabels()]
        ['low-level API', 'Keras', 'Estimator']
    """
    import matplotlib.pyplot as plt

    if table.count is not None:
        raise ValueError(
            f"{table.name} is a scaling table (over {table.count!r}): draw it with "
            "workshop.bench.plot_efficiency"
        )
    columns = table.measured
    rows = [(row[0], [_figure(table, row[0], cell) for cell in row[1:]])
            for row in table.rows]  # fmt: skip
    unit = "seconds" if table.unit == "s" else table.unit
    height = 0.8 / len(columns)
    with plt.rc_context(FONT):
        fig, ax = plt.subplots(figsize=FIGSIZE, layout="constrained")
        longest = max(v for _, values in rows for v in values)
        for j, column in enumerate(columns):
            ys = [i + (j - (len(columns) - 1) / 2) * height for i in range(len(rows))]
            values = [values[j] for _, values in rows]
            ax.barh(ys, values, height=height * 0.9, color=COLOURS[j % 7],
                    label=column)  # fmt: skip
            for y, (_, row_values), value in zip(ys, rows, values, strict=True):
                text = f"{value:g} s" if table.unit == "s" else f"{value:g}"
                if j > 0 and table.unit == "s":  # a time: the first over this one
                    text += f", {row_values[0] / value:.2f}x faster"
                ax.text(value + longest * 0.01, y, text, va="center", fontsize=12)
        ax.set_yticks(range(len(rows)), [name for name, _ in rows])
        ax.invert_yaxis()  # the table's first row on top
        ax.set_xlim(0, longest * 1.45)  # room for the labels
        ax.set_xlabel(f"{unit} for the run ({table.iterations} iterations)"
                      if table.iterations else unit)  # fmt: skip
        ax.set_title(title or f"{table.label}, doc {table.key}")
        ax.grid(True, axis="x", alpha=0.4)
        ax.legend(loc="lower right")
    plt.close(fig)  # shown once, as the cell's value
    return fig


def _figure(table: DocumentTable, row: str, cell: str) -> float:
    found = _FIRST_NUMBER.search(cell)
    if not found:
        raise ValueError(f"{table.name}: the cell {cell!r} of {row!r} has no figure")
    return float(found.group())
