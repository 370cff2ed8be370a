"""The slow tests of test_docs.py (they start processes, kernels or ranks, or take
seconds): make test runs them, make test-fast leaves them out: the documented commands
and snippets run."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import ROOT
from test_docs import FENCE, GUIDE, PAGES, SECTION_REF, _notebook, _sections, _text

from workshop.lessons.quiz import QUIZZES

MODULE_COMMAND = re.compile(r"python -m workshop ([a-z]+(?:-[a-z]+)*)")


# ------------------------------------------------------------------ references
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_cited_section_is_a_heading_of_its_notebook(page):
    text = _text(page)
    cited = 0
    for match in SECTION_REF.finditer(text):
        number, sections = match.group(1), _sections(match.group(1))
        for section in re.findall(r"§(\d+(?:\.\d+)?)", match.group(2)):
            cited += 1
            assert section in sections, (
                f"{page.name} cites {number} §{section}, but {_notebook(number).name} "
                f"has sections {sorted(sections)}"
            )
    # Every § must belong to a checked reference: no bare "§5" without its notebook.
    assert cited == text.count("§"), (
        f"{page.name}: {text.count('§') - cited} '§' not of the form 'NN §X'"
    )


def test_every_python_m_workshop_command_exists():
    commands = {c for page in PAGES for c in MODULE_COMMAND.findall(_text(page))}
    assert {"check-node", "kernel-spec"} <= commands
    for command in sorted(commands):
        done = subprocess.run(
            [sys.executable, "-m", "workshop", command, "--help"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"python -m workshop {command}: {done.stderr}"


def test_the_quiz_answer_snippet_prints_every_answer():
    snippet = next(b for b in FENCE.findall(_text(GUIDE)) if "QUIZZES" in b)
    done = subprocess.run(
        [sys.executable, "-c", snippet],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    total = sum(len(questions) for _, questions in QUIZZES.values())
    assert len(lines) == total
    for notebook, (_, questions) in QUIZZES.items():
        for number, q in enumerate(questions, 1):
            right = q.options["abcd".index(q.right)].text
            assert f"{notebook} Q{number}: {q.right}) {right}" in lines
    stated = re.search(r"print all (\d+) answers", _text(GUIDE))
    assert stated and int(stated.group(1)) == total
