"""Every table and list a notebook prints fits 88 columns (README's promise).

Long sentences wrap in the browser and command lines are shown whole (they are to be
copied), so a stored output line longer than 88 characters is allowed only when it is
one of those; anything laid out in columns, or a printed list, must fit."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted(
    (Path(__file__).resolve().parent.parent / "notebooks").glob("0*.ipynb")
)
WIDTH = 88
COMMAND = re.compile(
    r"^(?:\[[^]]+\] )?(?:\$ |sbatch |srun |mpirun |torchrun |benchmark: )"
)
COLUMNS = re.compile(r"\S {2,}\S.* {2,}\S")  # two gaps of two spaces or more


def is_sentence(line: str) -> bool:
    """Prose: words with single spaces, ending as a sentence does."""
    return (
        not COLUMNS.search(line)
        and line.rstrip().endswith((".", ":", ")", "!"))
        and line.count(" ") >= 10
        and not line.rstrip().endswith("])")
    )


def too_wide(text: str) -> list[str]:
    """The lines of ``text`` that break the 88-column rule."""
    return [
        line
        for line in text.splitlines()
        if len(line) > WIDTH
        and not COMMAND.match(line.strip())
        and not is_sentence(line)
    ]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_printed_tables_and_lists_fit_88_columns(notebook):
    wide = []
    for index, cell in enumerate(json.loads(notebook.read_text())["cells"]):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                continue  # a traceback is Python's layout, not the lesson's
            text = "".join(out.get("text", "")) + "".join(
                out.get("data", {}).get("text/plain", "")
            )
            wide += [
                f"cell {index}: {len(line)} columns: {line[:70]}"
                for line in too_wide(text)
            ]
    assert not wide, "\n".join(wide)


def test_the_rule_flags_wide_tables_and_lists_but_not_sentences_or_commands():
    table = (
        "inside a node (NVLink)     tensor parallel (8 ranks), per layer:   3.4 ms;"
        + " " * 20
        + "x"
    )
    listing = "4 ranks, equal: [" + ", ".join(["(True, True)"] * 7) + "]"
    sentence = "No GPU visible: using 2 CPU stand-ins " + "for the devices " * 6 + "so."
    command = "$ torchrun --standalone --nproc_per_node=2 " + "--flag=value " * 6
    assert too_wide("\n".join([table, listing, sentence, command])) == [table, listing]
    assert too_wide("short line\n" + "x" * 88) == []
