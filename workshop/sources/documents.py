"""Bibliographic data of the source documents, and the numbers each one contains."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

_INDEX = Path(__file__).with_name("numbers.json")

# A number as the documents write it: 762.10, 9318.20, 68.82%, 1,203 is not used by
# them (they write 1203), but a thousands comma is accepted and dropped.
_NUMBER = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?")


@dataclass(frozen=True)
class Document:
    """One source document.

    Attributes:
        key: its number in ``shared/sources`` ("000" to "004").
        file: its file name there.
        author: who wrote it, None where the document does not say.
        title: its title as it gives it.
        publisher: the organisation or publisher.
        year: the year it gives, None where it gives none.
        kind: what it is: a guide, a blog post, a book chapter, slides.
    """

    key: str
    file: str
    author: str | None
    title: str
    publisher: str
    year: int | None
    kind: str

    def cite(self) -> str:
        """The short citation the notebooks print beside a figure."""
        who = f"{self.author} ({self.publisher})" if self.author else self.publisher
        year = f", {self.year}" if self.year else ""
        return f"{who}, *{self.title}*, {self.kind}{year} [doc {self.key}]"


DOCUMENTS: dict[str, Document] = {
    d.key: d
    for d in (
        Document(
            "000",
            "000_f491eabb11040bfd.txt",
            None,
            "High-Performance Computing for Machine Learning at Scale",
            "an online guide",
            None,
            "guide",
        ),
        Document(
            "001",
            "001_d281d68bab5d56a1.txt",
            None,
            "Scaling PyTorch for High-Performance Computing Applications",
            "a PyTorch blog",
            None,
            "blog post",
        ),
        Document(
            "002",
            "002_1673302a2eba4556.txt",
            "M. M. Alves",
            "Accelerate Model Training with PyTorch 2.X",
            "Packt",
            2024,
            "book, ch. 11 'Training with Multiple Machines'",
        ),
        Document(
            "003",
            "003_2d41d674a1230b7e.txt",
            "S. Li",
            "Machine Learning at TACC: Distributed Training",
            "TACC",
            2024,
            "slides",
        ),
        Document(
            "004",
            "004_3e650e34f1b706ff.txt",
            "W. Guan",
            "Leveraging HPC to Accelerate Machine Learning",
            "SHARCNET / Compute Canada",
            None,
            "slides",
        ),
    )
}


def document(key: str) -> Document:
    """The document with this key ("000" to "004").

    Raises:
        ValueError: an unknown key; the message lists the known ones.
    """
    if key not in DOCUMENTS:
        raise ValueError(
            f"no source document {key!r}; the known ones are {sorted(DOCUMENTS)}"
        )
    return DOCUMENTS[key]


def pick_named(items: Sequence, names: Sequence[str], what: str) -> list:
    """The items whose ``.name`` is in ``names``, in their own order; all of them when
    ``names`` is empty.

    Raises:
        ValueError: a name no item has; the message lists the known ones.
    """
    known = [item.name for item in items]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(
            f"no {what} named {unknown}; the known ones are {known}; pass "
            "some of those, or nothing for all"
        )
    return [item for item in items if not names or item.name in names]


def cite(key: str) -> str:
    """The citation of document ``key``, e.g. ``cite("004")``."""
    return document(key).cite()


def _normalise(number: str) -> str:
    return number.replace(",", "")


def numbers_of_text(text: str) -> list[str]:
    """Every number in ``text``, thousands commas dropped, in order, repeats kept."""
    return [_normalise(m) for m in _NUMBER.findall(text)]


@lru_cache(maxsize=1)
def _index() -> dict:
    return json.loads(_INDEX.read_text())


def numbers_in(key: str) -> frozenset[str]:
    """The numbers document ``key`` contains, as written there (commas dropped)."""
    document(key)
    return frozenset(_index()[key]["numbers"])


def missing_numbers(key: str, text: str) -> list[str]:
    """The numbers of ``text`` that document ``key`` does not contain."""
    have = numbers_in(key)
    return [n for n in numbers_of_text(text) if n not in have]


def holds(key: str, text: str) -> bool:
    """Whether document ``key`` contains every number written in ``text``."""
    return not missing_numbers(key, text)


def build_index(folder: str | Path) -> dict:
    """The index of the documents in ``folder``: per key, file, SHA-256 and numbers.

    Raises:
        FileNotFoundError: a document's file is not in ``folder``.
    """
    folder = Path(folder)
    index = {}
    for key, doc in sorted(DOCUMENTS.items()):
        path = folder / doc.file
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing: {folder} should hold the five source documents "
                "(shared/sources beside the project)"
            )
        raw = path.read_bytes()
        index[key] = {
            "file": doc.file,
            "sha256": hashlib.sha256(raw).hexdigest(),
            "numbers": sorted(set(numbers_of_text(raw.decode("utf-8")))),
        }
    return index


def write_index(folder: str | Path) -> Path:
    """Write ``numbers.json`` from the documents in ``folder``; returns its path."""
    _INDEX.write_text(json.dumps(build_index(folder), indent=1) + "\n")
    _index.cache_clear()
    return _INDEX
