"""The README and the docs quote no figure of a notebook's stored output that the
output does not hold: each such figure links to its cell, and the link is checked.

Re-executing a notebook changes its measured outputs; these tests then fail, naming
the line of the guide to update, instead of leaving the guide quietly wrong."""

from __future__ import annotations

import json

import pytest
from prose_figures import (
    ROOT,
    cell_outputs,
    linked_figures,
    stale_links,
    unlinked_figures,
)

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GUIDES = [ROOT / "README.md", ROOT / "docs" / "instructor.md"]


@pytest.fixture(scope="module")
def outputs():
    return cell_outputs()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_linked_figure_is_in_its_cells_stored_output(doc, outputs):
    assert stale_links(doc, outputs) == []


@pytest.mark.parametrize("doc", GUIDES, ids=lambda p: p.name)
def test_no_figure_of_a_stored_output_is_quoted_without_its_link(doc, outputs):
    assert unlinked_figures(doc, outputs) == []


def test_the_guides_link_their_figures_to_cells(outputs):
    # The instructor's guide quotes outputs of every notebook; if no link were found,
    # the link pattern would be broken and the two tests above would pass vacuously.
    links = [link for doc in GUIDES for link in linked_figures(doc)]
    assert {link.notebook for link in links} == {"01", "02", "03", "04", "05"}


def _notebook(tmp_path, text):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    cell = {
        "cell_type": "code",
        "id": "abc123",
        "metadata": {},
        "source": [],
        "execution_count": 1,
        "outputs": [{"output_type": "stream", "name": "stdout", "text": [text]}],
    }
    (folder / "05_x.ipynb").write_text(json.dumps({"cells": [cell]}))
    return folder


def test_a_link_whose_output_changed_is_reported(tmp_path, monkeypatch):
    import prose_figures

    folder = _notebook(tmp_path, "speed-up x10.25\n")
    monkeypatch.setattr(prose_figures, "NOTEBOOKS", folder)
    doc = tmp_path / "guide.md"
    doc.write_text(
        'Show [x10.2](../notebooks/05_x.ipynb "cell abc123") and\n'
        '[1,437 files](../notebooks/05_x.ipynb "cell gone").\n'
    )
    problems = stale_links(doc, prose_figures.cell_outputs())
    assert len(problems) == 2
    assert "lacks 10.2" in problems[0]  # 10.25 is not 10.2
    assert "no cell with id 'gone'" in problems[1]


def test_an_unlinked_figure_is_reported_but_code_is_not(tmp_path, monkeypatch):
    import prose_figures

    monkeypatch.setattr(
        prose_figures, "NOTEBOOKS", _notebook(tmp_path, "bytes per step: 376,744\n")
    )
    doc = tmp_path / "guide.md"
    doc.write_text(
        "### Notebook 05\n\nShow 376,744 bytes per step.\n\n"
        "```\n376,744 bytes\n```\n`376,744` in code.\n"
    )
    problems = unlinked_figures(doc, prose_figures.cell_outputs())
    assert len(problems) == 1 and "guide.md:3: '376,744'" in problems[0]
