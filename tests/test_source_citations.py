"""Every figure the workshop credits to one of its source documents is in that document.

The notebooks and docs cite a document with a tag, ``[doc 004]``, at the end of the
sentence that uses its facts (see ``workshop.sources``). In such a sentence every
number must be one the document itself contains; a figure worked out from the
document's numbers (a speed-up, an efficiency) belongs in another sentence or in a
cell's output, where the code shows how it was worked out."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from workshop.sources.documents import DOCUMENTS, missing_numbers

ROOT = Path(__file__).resolve().parent.parent
TAG = re.compile(r"\[doc (\d{3})\]")
# Sentence ends: a full stop, question or exclamation mark followed by a space and a
# capital, a line that is a list item or a table row, or a blank line.
SENTENCE_END = re.compile(
    r"(?<=[.!?])\s+(?=[A-Z*_(\[])|\n\s*\n|\n(?=\s*(?:[-*|]|\d+\.)\s)"
)


def _markdown_texts():
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "markdown":
                yield f"{path.name} cell {index}", "".join(cell["source"])
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        yield path.name, path.read_text()


def _strip(sentence: str) -> str:
    """The sentence without what holds numbers that are not figures: the tags
    themselves, code spans, link targets, section and notebook numbers."""
    sentence = TAG.sub("", sentence)
    sentence = re.sub(r"`[^`]*`", "", sentence)
    sentence = re.sub(r"\]\([^)]*\)", "]", sentence)
    sentence = re.sub(r"§\s?\d+(?:\.\d+)*", "", sentence)
    sentence = re.sub(r"\b[Nn]otebooks? 0[1-5]\b|\b0[1-5](?= §)", "", sentence)
    return sentence


def cited_sentences():
    """(where, document key, sentence) for every sentence that carries a tag."""
    for where, text in _markdown_texts():
        for sentence in SENTENCE_END.split(text):
            for key in TAG.findall(sentence):
                yield where, key, sentence


def test_every_cited_document_exists():
    unknown = {(w, key) for w, key, _ in cited_sentences() if key not in DOCUMENTS}
    assert not unknown, f"tags naming no source document: {sorted(unknown)}"


def test_a_cited_sentence_holds_only_numbers_of_its_document():
    wrong = []
    for where, key, sentence in cited_sentences():
        if key in DOCUMENTS:
            missing = missing_numbers(key, _strip(sentence))
            if missing:
                text = sentence.strip()[:160]
                wrong.append(f"{where}: doc {key} has no {missing}: {text}")
    assert not wrong, "\n".join(wrong)


def test_every_source_document_is_cited_in_a_notebook():
    cited = {key for where, key, _ in cited_sentences() if ".ipynb cell " in where}
    assert cited >= set(DOCUMENTS), f"not cited in a notebook: {set(DOCUMENTS) - cited}"


@pytest.mark.parametrize(
    "sentence, missing",
    [
        ("32 cores took 1187.92 s at batch 50 [doc 004].", []),
        ("32 cores took 1187.9 s at batch 50 [doc 004].", ["1187.9"]),
        ("16 GPUs on two machines: 70% faster than 8 on one [doc 002].", []),
        ("see `lfs setstripe --stripe_count=3` in notebook 05 §1 [doc 004].", []),
    ],
)
def test_the_check_finds_a_number_the_document_lacks(sentence, missing):
    key = TAG.search(sentence).group(1)
    assert missing_numbers(key, _strip(sentence)) == missing
