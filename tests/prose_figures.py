"""Figures the README and the docs quote from the notebooks' stored outputs.

A figure quoted from a notebook is written as a link to the notebook whose title names
the cell by its id, so a reader can find it and this check can read it:

    [x10.2](../notebooks/01_single_node_multi_gpu.ipynb "cell 5f1c2a9e")

`linked_figures` finds those links; `stale_links` says which no longer match their
cell's stored output; `unlinked_figures` finds figures in the prose that a stored output
holds but that no link names (quoted without saying from where, so re-executing the
notebook would leave them wrong without anything noticing).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"

LINK = re.compile(
    r"\[(?P<text>[^\]]+)\]\((?P<path>(?:\.\./)?notebooks/(?P<nb>\d\d)_[\w.-]+\.ipynb)"
    r'\s+"cell (?P<cell>[\w-]+)"\)'
)
NUMBER = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\d.,])\d+(?:\.\d+)?")
# What counts as a measured-looking figure in prose: a decimal, a thousands-comma
# number, or a number with a unit or a speed-up mark.
FIGURE = re.compile(
    r"(?<![\w.,/-])x?(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+"
    r"(?=\s?(?:%|ms\b|MiB\b|GiB\b|bytes\b|samples/s\b|GB/s\b)))"
)
# Which notebook a paragraph talks about: "Notebook 02", "02 §5", "03 *Quiz*".
MENTION = re.compile(r"\b[Nn]otebooks? (0[1-5])\b|\b(0[1-5]) (?:§|\*)")


@dataclass(frozen=True)
class Link:
    doc: str
    line: int
    text: str
    notebook: str
    cell: str


def cell_outputs() -> dict[str, dict[str, str]]:
    """``{notebook number: {cell id: the cell's stored text outputs}}``."""
    found: dict[str, dict[str, str]] = {}
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        cells = {}
        for cell in json.loads(path.read_text())["cells"]:
            text = ""
            for out in cell.get("outputs", []):
                if "text" in out:
                    text += "".join(out["text"])
                for kind in ("text/plain", "text/markdown", "text/html"):
                    text += "".join(out.get("data", {}).get(kind, ""))
            cells[cell.get("id", "")] = text
        found[path.name[:2]] = cells
    return found


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def linked_figures(doc: Path) -> list[Link]:
    """Every link of ``doc`` to a notebook cell."""
    return [
        Link(doc.name, number, m["text"], m["nb"], m["cell"])
        for number, line in _prose_lines(doc.read_text())
        for m in LINK.finditer(line)
    ]


def holds(output: str, number: str) -> bool:
    """Whether ``output`` contains ``number`` as a whole number (not inside another)."""
    return (
        re.search(rf"(?<![\d.,]){re.escape(number)}(?![\d]|[.,]\d)", output) is not None
    )


def stale_links(doc: Path, outputs: dict[str, dict[str, str]]) -> list[str]:
    """One message per link whose cell is gone or whose output lacks a number of it."""
    problems = []
    for link in linked_figures(doc):
        cells = outputs.get(link.notebook, {})
        where = f"{link.doc}:{link.line} [{link.text}] -> notebook {link.notebook}"
        if link.cell not in cells:
            problems.append(f"{where}: no cell with id {link.cell!r}")
            continue
        numbers = NUMBER.findall(link.text)
        if not numbers:
            problems.append(f"{where}: the link text quotes no number")
        for number in numbers:
            if not holds(cells[link.cell], number):
                problems.append(
                    f"{where} cell {link.cell}: its stored output lacks {number}"
                )
    return problems


def _paragraphs(text: str):
    """Per paragraph: its first line number, its (number, line)s, its notebooks.

    A paragraph talks about the notebooks it mentions, and about the one its heading
    names ("### Notebook 02: ..."), so a figure is looked for where it came from.
    """
    heading: set[str] = set()
    block: list[tuple[int, str]] = []

    def flush():
        if block:
            named = {a or b for line in block for a, b in MENTION.findall(line[1])}
            yield block[0][0], list(block), named | heading

    for number, line in _prose_lines(text):
        if line.startswith("#"):
            yield from flush()
            block = []
            heading = (
                {a or b for a, b in MENTION.findall(line)}
                if line.startswith(("# ", "## ", "### "))
                else heading
            )
            continue
        if not line.strip():
            yield from flush()
            block = []
            continue
        block.append((number, line))
    yield from flush()


# Figures a stored output holds by coincidence: (file, figure) and why.
NOT_FROM_OUTPUTS = {
    ("README.md", "0.02"): "launch's bounded-output test (tests/ranks), not a cell",
    ("instructor.md", "1,024"): "the world size 04 §8 plans for, not a result",
    ("README.md", "1,024"): "the world size 04 §8 plans for, not a result",
}


def unlinked_figures(doc: Path, outputs: dict[str, dict[str, str]]) -> list[str]:
    """Figures of ``doc``'s prose, outside links, that the stored outputs of the
    notebook the paragraph talks about hold."""
    problems = []
    for _first, lines, notebooks in _paragraphs(doc.read_text()):
        for number, line in lines:
            bare = LINK.sub("", line)
            bare = re.sub(r"`[^`]*`", "", bare)  # code spans quote code, not results
            bare = re.sub(r"§\s?\d+(?:\.\d+)?", "", bare)  # section numbers
            for m in FIGURE.finditer(bare):
                figure = m["num"]
                if (doc.name, figure) in NOT_FROM_OUTPUTS:
                    continue
                where = [
                    f"{nb} cell {cell}"
                    for nb in sorted(notebooks)
                    for cell, text in outputs.get(nb, {}).items()
                    if holds(text, figure)
                ]
                if where:
                    problems.append(
                        f"{doc.name}:{number}: {m.group(0)!r} is in the stored "
                        f"output of notebook {where[0]}: link it to that cell"
                    )
    return problems
