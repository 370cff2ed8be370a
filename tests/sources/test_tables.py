"""The source documents' tables as data: every figure is one the document holds, the
speed-ups are worked out from the cells, and the number index matches the documents
where they are on this machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import workshop
from workshop.sources import documents
from workshop.sources.doc_table import DocumentTable
from workshop.sources.documents import document, holds, missing_numbers, numbers_in
from workshop.sources.tables import document_table, document_tables

ROOT = Path(__file__).resolve().parents[2]


def _sources_folder() -> Path | None:
    candidates = [os.environ.get("WORKSHOP_SOURCES"), "/work/shared/sources",
                  ROOT.parent / "shared" / "sources"]  # fmt: skip
    for folder in candidates:
        if folder and Path(folder, document("004").file).is_file():
            return Path(folder)
    return None


@pytest.mark.parametrize("table", document_tables(), ids=lambda t: t.name)
def test_every_figure_of_a_table_is_in_its_document(table):
    assert table.key == "004" and table.document is document("004")
    assert holds(table.key, table.numbers_text()), missing_numbers(
        table.key, table.numbers_text()
    )
    # Every cell is there, each row as wide as the header.
    assert all(len(row) == len(table.columns) for row in table.rows), table.name
    cells = [c for row in table.rows for c in row]
    assert all(c in table.numbers_text() for c in cells)


def test_a_figure_typed_wrong_is_caught():
    (table,) = document_tables("cpu-batch50")
    rows = tuple((n, "762.11" if t == "762.10" else t) for n, t in table.rows)
    wrong = DocumentTable(**{**table.__dict__, "rows": rows})
    assert missing_numbers("004", wrong.numbers_text()) == ["762.11"]
    assert not holds("004", "16 CPU cores: 761.10 s")


def test_the_tables_the_workshop_teaches_are_all_there():
    names = {t.name for t in document_tables()}
    assert {"cpu-batch50", "cpu-batch256", "gpu-p100-apis", "gpu-p100-v100-apis",
            "keras-gpus-batch256", "estimator-gpus-batch256", "keras-v100-batch2048",
            "keras-v100-batch8192", "estimator-v100-batch2048",
            "estimator-v100-batch8192", "resnet50-v100-batch128",
            "horovod-resnet50"} == names  # fmt: skip
    # Every number of the document that is a table cell belongs to some table.
    in_tables = " ".join(t.numbers_text() for t in document_tables())
    for cell in ("11193.94", "2336.07", "338", "2791", "714", "1132", "10143.52"):
        assert cell in in_tables and cell in numbers_in("004")


def test_seconds_give_time_ratios_and_rates_give_rate_ratios():
    cpu = document_table("cpu-batch50")
    ((label, gains),) = cpu.speedups().items()
    assert label == cpu.label
    times = dict(cpu.values())
    assert dict(gains)[16] == pytest.approx(times[1] / times[16])
    # The lesson of the table: 32 cores are slower than 16 at batch 50, not at 256.
    assert times[32] > times[16]
    big = dict(document_table("cpu-batch256").values())
    assert big[32] < big[16]
    resnet = document_table("resnet50-v100-batch128")
    rates = dict(resnet.values())
    (points,) = resnet.speedups().values()
    assert dict(points)[8] == pytest.approx(rates[8] / rates[1])
    assert resnet.bigger_is_better and not cpu.bigger_is_better


def test_blanks_stars_and_parentheses_are_read_as_the_slide_means_them():
    estimator = document_table("estimator-gpus-batch256")
    assert [n for n, _ in estimator.values("P100")] == [1, 2]  # blanks and '*' out
    assert [n for n, _ in estimator.values("V100")] == [1, 2, 4, 8]  # '*' at 6
    assert set(estimator.speedups()) == {f"{estimator.label}, P100",
                                         f"{estimator.label}, V100"}  # fmt: skip
    horovod = document_table("horovod-resnet50")
    assert horovod.values()[-1] == (64, 9318.2)  # the first of "9318.20 (10143.52)"
    assert horovod.values()[0] == (2, 322.93)  # counted in GPUs, not nodes
    assert any("does not say" in note for note in horovod.notes)


def test_the_bigger_batch_is_the_documents_own_test_of_its_hypothesis():
    (small,) = document_table("estimator-gpus-batch256").speedups("V100").values()
    (large,) = document_table("estimator-v100-batch8192").speedups().values()
    assert dict(small)[8] < 1 < dict(large)[8]
    assert f"{dict(large)[8]:.1f}" == "3.9"


def test_a_table_prints_in_88_columns_with_its_source():
    for table in document_tables():
        text = str(table)
        assert max(len(line) for line in text.splitlines()) <= 88, table.name
        assert "[doc 004]" in " ".join(text.split())
        for row in table.rows:
            assert row[-1] in text
    text = document_table("cpu-batch50").text()
    assert "3.75x" in text and "23%" in text  # 2854.43 / 762.10 on 16 cores
    assert "speed-up" not in document_table("gpu-p100-apis").text()
    with pytest.raises(
        ValueError, match=r"width must be a whole number, 60 or more, not 50"
    ):
        document_table("cpu-batch50").text(width=50)


def test_unknown_names_and_columns_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"no document table named \['nope'\]; the "
                       r"known ones are \['cpu-batch50', "):  # fmt: skip
        document_tables("cpu-batch50", "nope")
    with pytest.raises(ValueError, match=r"no document table named \['nope'\]"):
        workshop.sources.document_table("nope")
    with pytest.raises(ValueError, match=r"has no column 'A100'; its columns are "
                       r"\['P100', 'V100'\]"):  # fmt: skip
        document_table("keras-gpus-batch256").values("A100")
    with pytest.raises(ValueError, match=r"has columns \['P100', 'V100'\]; pass one"):
        document_table("keras-gpus-batch256").values()
    with pytest.raises(ValueError, match=r"'gpu-p100-apis' is not a scaling table"):
        document_table("gpu-p100-apis").speedups()


def test_the_number_index_is_made_from_the_documents():
    folder = _sources_folder()
    if folder is None:
        pytest.skip(
            "the source documents are not on this machine (set WORKSHOP_SOURCES to "
            "their folder, shared/sources beside the project)"
        )
    import json

    stored = json.loads(Path(documents.__file__).with_name("numbers.json").read_text())
    assert documents.build_index(folder) == stored
