"""Graham's storage table (document 004) as data: every figure is the document's, the
table fits 88 columns and names its source, and bad tables are refused."""

from __future__ import annotations

import pytest

import workshop
from workshop.sources.documents import missing_numbers
from workshop.sources.storage import GRAHAM_STORAGE, format_table, storage_table


def test_every_figure_of_the_table_is_in_document_004():
    for system in GRAHAM_STORAGE:
        assert missing_numbers("004", system.quota + " " + system.purged) == []
    by_name = {s.name: s for s in GRAHAM_STORAGE}
    assert list(by_name) == ["home", "project", "scratch", "local disk"]
    # The document's yes/no columns, row by row.
    assert [s.backed_up for s in GRAHAM_STORAGE] == [True, True, False, False]
    assert by_name["scratch"].purged == "files older than 60 days"
    assert [s.purged for s in GRAHAM_STORAGE if s.name != "scratch"] == ["no"] * 3
    assert by_name["local disk"].default == "transient"
    assert by_name["local disk"].on_compute_nodes == "per node"
    assert {s.kind for s in GRAHAM_STORAGE[:3]} == {"NFS", "Lustre"}
    assert by_name["local disk"].path == "$SLURM_TMPDIR"


def test_the_table_fits_88_columns_and_names_its_source():
    text = workshop.sources.storage_table()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 88
    assert "[doc 004]" in " ".join(text.split())
    for system in GRAHAM_STORAGE:
        assert system.path in text
    # Wrapped cells keep every word of every quota.
    words = set(text.split())
    for system in GRAHAM_STORAGE:
        assert set(system.quota.split()) <= words, system.quota
    assert "[doc" not in storage_table(source=None)


def test_cells_wrap_within_their_columns():
    text = format_table(["name", "what"], [4, 5], [["ab", "one two three"]])
    assert text.splitlines() == [
        "name  what",
        "----  -----",
        "ab    one",
        "      two",
        "      three",
    ]


def test_a_table_that_does_not_match_its_headers_is_refused():
    with pytest.raises(ValueError, match=r"got 2 headers but 1 widths"):
        format_table(["a", "b"], [5], [])
    with pytest.raises(
        ValueError, match=r"column widths must be 3 or more, got \[5, 2\]"
    ):
        format_table(["a", "b"], [5, 2], [])
    with pytest.raises(ValueError, match=r"row \['x'\] has 1 cells for 2 columns"):
        format_table(["a", "b"], [5, 5], [["x"]])
    with pytest.raises(ValueError, match=r"no source document '999'"):
        storage_table(source="999")
