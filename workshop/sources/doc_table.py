"""The type of a source document's table: its cells as the document writes them, and
the speed-up and efficiency worked out from them (the data is in ``tables``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..checks import whole
from . import documents as _documents
from .documents import Document

__all__ = ["DocumentTable"]

_FIRST_NUMBER = re.compile(r"\d+(?:\.\d+)?")


@dataclass(frozen=True)
class DocumentTable:
    """One table of a source document, its cells as the document writes them.

    Attributes:
        name: a short key, e.g. "cpu-batch50".
        key: the document's key ("004"); :attr:`document` is the Document.
        caption, label: the slide's heading; a short legend entry.
        columns: the count column(s) first, then the measured ones.
        rows: the cells as written; "" where the slide has no figure, "*" where it
            marks a count that could not run.
        count: the column a scaling table scales over; None for single runs.
        unit: "s" (time of the whole run), or a rate.
        bigger_is_better: True for a rate, False for seconds.
        hardware, software, model, batch: as the document names them.
        iterations: training steps of each run, None where not given.
        notes: what the document says about the table, and what it leaves unsaid.
    """

    name: str
    key: str
    caption: str
    label: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    count: str | None
    unit: str
    bigger_is_better: bool
    hardware: str
    software: str
    model: str
    batch: str
    iterations: int | None
    notes: tuple[str, ...] = field(default=())

    @property
    def document(self) -> Document:
        """The source document (``workshop.sources.document(self.key)``)."""
        return _documents.document(self.key)

    @property
    def measured(self) -> tuple[str, ...]:
        """The measured columns: all but the count column(s) in front."""
        first = 0 if self.count is None else self.columns.index(self.count) + 1
        return self.columns[max(first, 1) :]

    def numbers_text(self) -> str:
        """Every figure the table credits to its document, as one line of text: what
        ``workshop.sources.holds(self.key, ...)`` must find in the document."""
        parts = [self.caption, self.hardware, self.software, self.model, self.batch]
        parts += [str(self.iterations or "")]
        parts += [cell for row in self.rows for cell in row]
        parts += list(self.notes)
        return " ".join(parts)

    def values(self, column: str | None = None) -> list[tuple[int, float]]:
        """(count, value) of each row that has a figure in ``column``.

        Blank and "*" cells are left out; of "9318.20 (10143.52)" the first figure
        is taken (the slide does not say what the one in parentheses is).

        Args:
            column: a measured column; None for the only one.

        Raises:
            ValueError: a table of single runs (no count column), or a column it
                does not have, or None where it has several.
        """
        column = self._column(column)
        at_count = self.columns.index(self.count)  # type: ignore[arg-type]
        at = self.columns.index(column)
        out = []
        for row in self.rows:
            found = _FIRST_NUMBER.search(row[at])
            if found:
                out.append((int(row[at_count]), float(found.group())))
        return out

    def speedups(self, column: str | None = None) -> dict[str, list[tuple[int, float]]]:
        """Speed-up of each count over the table's smallest, per measured column.

        The result is what :func:`workshop.bench.plot_efficiency` draws.

        Args:
            column: one measured column; None for all of them.

        Returns:
            ``{label: [(count, speed-up), ...]}``; the label names the column where
            the table has several.

        Raises:
            ValueError: as :meth:`values`.

        Example:
            >>> from workshop.sources import document_table
            >>> document_table("resnet50-v100-batch128").speedups()
            {'ResNet-50, V100, one node (SHARCNET)': [(1, 1.0), (2, 1.643...), ...]}
        """
        self._column(column if column is not None else self.measured[0])
        columns = [column] if column is not None else list(self.measured)
        out = {}
        for name in columns:
            points = self.values(name)
            if not points:
                continue
            (_, first) = points[0]
            if self.bigger_is_better:
                gains = [(n, value / first) for n, value in points]
            else:
                gains = [(n, first / value) for n, value in points]
            label = self.label if len(self.measured) == 1 else f"{self.label}, {name}"
            out[label] = gains
        return out

    def text(self, width: int = 88) -> str:
        """The table as printed lines: its cells, speed-up and efficiency, source.

        Args:
            width: the longest line; at least 60.

        Raises:
            ValueError: ``width`` below 60.
        """
        import textwrap

        whole("width", width, least=60)
        head = list(self.columns)
        body = [list(row) for row in self.rows]
        if self.count is not None:
            extra: list[str] = []
            for name in self.measured:
                gains = dict(next(iter(self.speedups(name).values()), []))
                n0 = min(gains) if gains else 1
                short = "" if len(self.measured) == 1 else f" {name}"
                extra += [f"speed-up{short}", f"effic.{short}"]
                for row in body:
                    n = int(row[self.columns.index(self.count)])
                    gain = gains.get(n)
                    row += (
                        [f"{gain:.2f}x", f"{gain * n0 / n:.0%}"]
                        if gain is not None
                        else ["", ""]
                    )
            head += extra
        unit = "seconds" if self.unit == "s" else self.unit
        sizes = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(head)]
        line = lambda cells: "  ".join(  # noqa: E731
            c.ljust(s) if i == 0 else c.rjust(s)
            for i, (c, s) in enumerate(zip(cells, sizes, strict=True))
        ).rstrip()
        wrap = lambda text: textwrap.wrap(  # noqa: E731
            text, width, subsequent_indent="  ", break_on_hyphens=False
        )
        lines = wrap(f"{self.name}: {self.caption}; {self.model}")
        lines += wrap(
            f"batch {self.batch}"
            + (f", {self.iterations} iterations" if self.iterations else "")
            + f"; cells in {unit}"
            + ("" if self.bigger_is_better else " (smaller is faster)")
        )
        lines += [line(head), *(line(r) for r in body)]
        if self.count is not None:
            lines += wrap(
                "speed-up and efficiency worked out here from the cells, against "
                f"the smallest count ({'rate' if self.bigger_is_better else 'time'} "
                "ratio; efficiency = speed-up / (count / smallest count))"
            )
        lines += wrap(f"hardware: {self.hardware}; software: {self.software}")
        for note in self.notes:
            lines += wrap(f"note: {note}")
        lines += wrap(f"source: {self.document.cite()}")
        if max(len(x) for x in lines) > width:
            raise ValueError(
                f"table {self.name!r} needs {max(len(x) for x in lines)} columns, "
                f"more than width={width}; print it with a larger width"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def _column(self, column: str | None) -> str:
        if self.count is None:
            raise ValueError(
                f"table {self.name!r} is not a scaling table (one run per row, no "
                "count of cores or GPUs); read its rows instead"
            )
        if column is None:
            if len(self.measured) != 1:
                raise ValueError(
                    f"table {self.name!r} has columns {list(self.measured)}; pass one"
                )
            return self.measured[0]
        if column not in self.measured:
            raise ValueError(
                f"table {self.name!r} has no column {column!r}; its columns are "
                f"{list(self.measured)}"
            )
        return column
