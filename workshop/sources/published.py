"""The records a published figure is kept in: its :class:`Source`, a
:class:`PublishedTable`, or one figure in words (:class:`PublishedQuote`); the
figures themselves are in :mod:`workshop.sources.scale_data`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .doc_table import DocumentTable
from .documents import Document

__all__ = ["PublishedQuote", "PublishedTable", "Source"]


@dataclass(frozen=True)
class Source:
    """Where a published figure comes from.

    Attributes:
        title: the document's title (and the part of it that holds the figure).
        organisation: who published it.
        year: the year of the figures, None where the source does not say.
        url: where to read it, None where it is not known.
    """

    title: str
    organisation: str
    year: int | None
    url: str | None

    def cite(self) -> str:
        """One line: organisation, title, year and address."""
        year = f", {self.year}" if self.year else ""
        url = f", {self.url}" if self.url else ""
        return f"{self.organisation}: {self.title}{year}{url}"


@dataclass(frozen=True)
class PublishedTable:
    """A published throughput table: (GPUs, samples per second) pairs.

    Attributes:
        name: a short key, e.g. "resnet50-v100-fp32".
        label: the legend entry, naming model, hardware and source.
        setup: how it was measured (model, precision, batch, software).
        points: (GPUs, samples per second), as the source gives them.
        source: a :class:`Source`, or the workshop's
            :class:`~workshop.sources.documents.Document` that holds the table.
        stated_speedup: the speed-up at the largest count, where the source
            states one.
        table: the document's table the points are read from, if any.
    """

    name: str
    label: str
    setup: str
    points: tuple[tuple[int, float], ...]
    source: Source | Document
    stated_speedup: float | None = None
    table: DocumentTable | None = None

    def numbers_text(self) -> str:
        """The figures it credits to its source, as the source writes them."""
        if self.table is not None:
            return " ".join((self.label, self.setup, self.table.numbers_text()))
        return " ".join(f"{n} {x:g}" for n, x in self.points)


@dataclass(frozen=True)
class PublishedQuote:
    """A published figure that is not a table: printed with its source, not drawn.

    Attributes:
        name: a short key.
        statement: the figure, in words; its numbers as the source writes them.
        source: where it was published: a :class:`Source`, or the workshop's
            source :class:`~workshop.sources.documents.Document` that says it.
    """

    name: str
    statement: str
    source: Source | Document

    def numbers_text(self) -> str:
        """The figures it credits to its source: its statement."""
        return self.statement
