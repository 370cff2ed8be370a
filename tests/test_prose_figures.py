"""What README.md, docs/ and the notebooks' markdown say about the stored outputs is
what the outputs hold: linked figures, counts of questions and exercises, and every
figure of text about a notebook (see prose_figures for the rules).

Re-executing a notebook changes its measured outputs; these tests then fail, naming
the line or the cell to update, instead of leaving the text quietly wrong."""

from __future__ import annotations

import json

import pytest
from prose_figures import (
    FIGURE,
    JOBS_NOT_CHECKED,
    LINKABLE,
    NOT_FROM_OUTPUTS,
    ROOT,
    Prose,
    _figures,
    _number,
    broken_pointers,
    cell_outputs,
    counts,
    job_count_phrases,
    labelled_values,
    linked_figures,
    machine_bound_cells,
    prose_key,
    prose_texts,
    slurm_minutes,
    stale_links,
    submissions,
    unaccounted_figures,
    unlinked_figures,
    unlisted_files,
    wrong_counts,
    wrong_file_counts,
    wrong_job_counts,
)

TEXTS = prose_texts()
FILES = sorted({t.name.split(" cell ")[0] for t in TEXTS})
GUIDES = ["notebooks.md", "instructor.md"]


def _of(name: str) -> list[Prose]:
    return [t for t in TEXTS if t.name.split(" cell ")[0] == name]


@pytest.fixture(scope="module")
def outputs():
    return cell_outputs()


def test_the_check_reads_every_text():
    names = {t.name.split(" cell ")[0] for t in TEXTS}
    assert {"README.md", "instructor.md", "glossary.md", "benchmarks.md"} <= names
    notebooks = {t.notebook for t in TEXTS if t.notebook}
    assert notebooks == {"01", "02", "03", "04", "05"}


@pytest.mark.parametrize("name", FILES)
def test_every_linked_figure_holds_in_its_cells_stored_output(name, outputs):
    assert [p for t in _of(name) for p in stale_links(t, outputs)] == []


@pytest.mark.parametrize("name", FILES)
def test_every_count_of_questions_and_exercises_is_right(name):
    known = counts()
    assert [p for t in _of(name) for p in wrong_counts(t, known)] == []


@pytest.mark.parametrize("name", FILES)
def test_every_count_of_jobs_is_what_the_notebooks_submit(name):
    jobs = submissions()
    assert [p for t in _of(name) for p in wrong_job_counts(t, jobs)] == []


@pytest.mark.parametrize("name", FILES)
def test_every_count_of_a_files_lines_or_a_folders_files_is_right(name):
    assert [p for t in _of(name) for p in wrong_file_counts(t)] == []
    assert [p for t in _of(name) for p in unlisted_files(t)] == []


@pytest.mark.parametrize("name", FILES)
def test_every_pointer_leads_where_it_says(name):
    assert [p for t in _of(name) for p in broken_pointers(t)] == []


@pytest.mark.parametrize("name", FILES)
def test_every_figure_of_text_about_a_notebook_is_accounted_for(name, outputs):
    assert [p for t in _of(name) for p in unaccounted_figures(t, outputs)] == []


@pytest.mark.parametrize("name", [f for f in FILES if not f.endswith(".ipynb")])
def test_no_figure_of_a_stored_output_is_quoted_without_its_link(name, outputs):
    assert [p for t in _of(name) for p in unlinked_figures(t, outputs)] == []


def test_every_entry_of_not_from_outputs_names_a_figure_the_text_has():
    # An entry whose figure has left the text would excuse the next one quietly.
    found = {
        (prose_key(t), figure)
        for t in TEXTS
        for pattern in (FIGURE, LINKABLE)
        for figure, _, _ in _figures(t.text, pattern)
    }
    assert sorted(set(NOT_FROM_OUTPUTS) - found) == []


def test_the_guides_link_their_figures_to_cells(outputs):
    # The instructor's guide quotes outputs of every notebook; if no link were found,
    # the link pattern would be broken and the tests above would pass vacuously.
    links = [link for name in GUIDES for t in _of(name) for link in linked_figures(t)]
    assert {link.notebook for link in links} == {"01", "02", "03", "04", "05"}
    assert any(link.label for link in links)  # and some name the figure they bound


def test_the_quizzes_and_exercises_are_counted():
    known = counts()
    assert all(c["questions"] >= 6 and c["exercises"] >= 2 for c in known.values())
    assert sum(c["exercises"] for c in known.values()) >= 19


def test_training_cells_are_the_ones_that_print_losses_and_accuracies(outputs):
    bound = machine_bound_cells(outputs)
    assert "656ce1cd" in bound["01"]  # the history table
    assert "d70de7d4" in bound["03"]  # the global batch table (accuracy column)
    assert "29b41351" not in bound["03"]  # published figures that quote an accuracy


# ------------------------------------------ the issue's examples, as they were written
ISSUE_01_QUIZ = (
    "## Quiz\n\nSix questions on what this notebook taught, one right answer each. "
    'Where the widgets do not show, answer in code: `workshop.quiz("01")`.'
)
ISSUE_05_TIME = (
    "**Time:** about 2 hours 10 minutes led: sections 1\u20134 (data) 60 minutes,\n"
    "5 (monitoring) 40, 6 (stuck ranks) 20, the quiz 10; the five exercises take "
    "about 5\nminutes each of that, and can be left as homework."
)
ISSUE_GLOSSARY = (
    "## Linear scaling rule\n\nN times the global batch, N times the learning rate, "
    "usually with a warm-up that\nraises the rate over the first steps. Taught in 03 "
    "§9, which measures it: 4 ranks at\nthe same learning rate reached 0.22 accuracy "
    "after one epoch, with lr \u00d7 4 about 0.5,\nagainst 0.83 on one rank.\n"
)


def test_the_issues_three_examples_fail_as_they_were_written(outputs):
    known = counts()
    quiz = wrong_counts(Prose("01 cell", ISSUE_01_QUIZ, "01"), known)
    assert len(quiz) == 1 and "'Six questions' but notebook 01 has 8" in quiz[0]
    time = wrong_counts(Prose("05 cell", ISSUE_05_TIME, "05"), known)
    assert len(time) == 1 and "'five exercises' but notebook 05 has 4" in time[0]
    glossary = unaccounted_figures(Prose("glossary.md", ISSUE_GLOSSARY), outputs)
    assert any("'0.83' is in no stored output of notebook(s) 03" in p for p in glossary)


# ------------------------------------------------------- the rules, on small notebooks
def _notebook(tmp_path, text, *, code="print(1)", more=()):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    cells = [
        {
            "cell_type": "code",
            "id": "abc123",
            "metadata": {},
            "source": [code],
            "execution_count": 1,
            "outputs": [{"output_type": "stream", "name": "stdout", "text": [text]}],
        },
        *more,
    ]
    (folder / "05_x.ipynb").write_text(json.dumps({"cells": cells}))
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


def test_a_link_without_a_number_points_at_a_cell_that_must_exist(
    tmp_path, monkeypatch
):
    import prose_figures

    monkeypatch.setattr(prose_figures, "NOTEBOOKS", _notebook(tmp_path, "a table\n"))
    doc = Prose(
        "guide.md",
        '[its table](../notebooks/05_x.ipynb "cell abc123") and '
        '[the other](../notebooks/05_x.ipynb "cell gone").\n',
    )
    problems = stale_links(doc, prose_figures.cell_outputs())
    assert len(problems) == 1 and "no cell with id 'gone'" in problems[0]


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


HISTORY = (
    "epoch 1/3  loss 1.486  accuracy 0.644  eval accuracy 0.719\n"
    "epoch 3/3  loss 0.151  accuracy 0.986  eval accuracy 0.989\n"
    "epoch   loss  accuracy  eval accuracy\n"
    "    3  0.151     0.986          0.989\n"
)


def test_the_label_names_the_figure_after_it_on_its_line():
    assert labelled_values(HISTORY, "eval accuracy") == [0.719, 0.989]
    assert labelled_values(HISTORY, "3/3 … eval accuracy") == [0.989]
    table = "4 ranks, lr x 4, warm-up   4  128  0.2  3  12  0.498\n"
    table += "4 ranks, lr x 4            4  128  0.2  0  12  0.519\n"
    assert labelled_values(table, "lr x 4 … 12") == [0.519]  # not "4," nor "128"
    assert labelled_values(table, "warm-up … 12") == [0.498]


@pytest.mark.parametrize(
    "text, problem",
    [
        ("above 0.95", None),
        ("0.98 to 0.99", None),
        ("about 0.99", None),
        ("above 0.99", "'eval accuracy' is 0.989, not above 0.99"),
        ("below 0.5", "not below 0.5"),
        ("0.7\u20130.8", "not 0.7 to 0.8"),
        ("0.989", "quotes a training figure exactly"),
    ],
)
def test_a_bound_or_range_is_checked_and_a_training_figure_needs_one(
    tmp_path, monkeypatch, text, problem
):
    import prose_figures

    monkeypatch.setattr(prose_figures, "NOTEBOOKS", _notebook(tmp_path, HISTORY))
    link = f'[{text}](../notebooks/05_x.ipynb "cell abc123: eval accuracy")'
    problems = stale_links(Prose("guide.md", link), prose_figures.cell_outputs())
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0]


def test_a_bound_without_a_label_is_refused(tmp_path, monkeypatch):
    import prose_figures

    monkeypatch.setattr(prose_figures, "NOTEBOOKS", _notebook(tmp_path, HISTORY))
    link = '[above 0.95](../notebooks/05_x.ipynb "cell abc123")'
    problems = stale_links(Prose("guide.md", link), prose_figures.cell_outputs())
    assert len(problems) == 1 and "needs the figure it bounds" in problems[0]


QUIZ = {
    "cell_type": "code",
    "id": "quiz",
    "metadata": {},
    "source": ['workshop.quiz("05")'],
    "execution_count": 2,
    "outputs": [
        {
            "output_type": "execute_result",
            "execution_count": 2,
            "metadata": {},
            "data": {"text/plain": ["Quiz 05 · Things: 7 questions, one right option"]},
        }
    ],
}


def test_counts_of_questions_and_exercises_are_the_notebooks(tmp_path, monkeypatch):
    import prose_figures

    folder = _notebook(
        tmp_path,
        "Not yet: 05.a.\n",
        code='workshop.check("05.a", answer)',
        more=[QUIZ],
    )
    monkeypatch.setattr(prose_figures, "NOTEBOOKS", folder)
    known = prose_figures.counts()
    assert known == {"05": {"questions": 7, "exercises": 1}}
    right = "## Quiz\n\nSeven questions on what this notebook taught; the one exercise."
    assert wrong_counts(Prose("05_x.ipynb cell q", right, "05"), known) == []
    wrong = "## Quiz\n\nSix questions; the two exercises take 5 minutes each."
    problems = wrong_counts(Prose("05_x.ipynb cell q", wrong, "05"), known)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "'Six questions' but notebook 05 has 7 questions",
        "'two exercises' but notebook 05 has 1 exercises",
    ]
    # Questions that are not a quiz's are not counted: "Two questions, two runs".
    other = "## 11. Scaling\n\nTwo questions, two experiments."
    assert wrong_counts(Prose("05_x.ipynb cell s", other, "05"), known) == []


def test_a_doc_count_is_about_the_notebook_its_sentence_or_list_names(
    tmp_path, monkeypatch
):
    import prose_figures

    folder = _notebook(
        tmp_path, "", code='workshop.check("05.a", x)\nworkshop.check("05.b", y)'
    )
    monkeypatch.setattr(prose_figures, "NOTEBOOKS", folder)
    known = prose_figures.counts()
    doc = (
        "Notebook 05 is about files:\n\n- staging;\n- three exercises that check "
        "themselves.\n\nThere are 2 exercises in all.\n"
    )
    problems = wrong_counts(Prose("README.md", doc), known)
    assert (
        len(problems) == 1
        and "'three exercises' but notebook 05 has 2" in (problems[0])
    )


def test_a_figure_no_output_holds_is_reported_in_a_notebook_and_in_a_doc(
    tmp_path, monkeypatch
):
    import prose_figures

    monkeypatch.setattr(
        prose_figures,
        "NOTEBOOKS",
        _notebook(tmp_path, "scale 131,072 at step 2\n" + HISTORY),
    )
    outputs = prose_figures.cell_outputs()
    cell = Prose("05_x.ipynb cell m", "The scale grew to 131,072, not 262,144.", "05")
    problems = unaccounted_figures(cell, outputs)
    assert len(problems) == 1 and "'262,144' is in no stored output" in problems[0]
    # A training figure quoted exactly, even one the output holds, is reported.
    cell = Prose("05_x.ipynb cell n", "It reached 0.989 after 3 epochs.", "05")
    problems = unaccounted_figures(cell, outputs)
    assert len(problems) == 1 and "is a training figure" in problems[0]
    # A doc paragraph is checked when it cites a section of the notebook.
    doc = Prose("guide.md", "Taught in 05 §2: a scale of 65,536.\n\nSetup: 6.2 GB.\n")
    problems = unaccounted_figures(doc, outputs)
    assert len(problems) == 1 and "'65,536'" in problems[0]


# ------------------------------------------------ jobs, files and pointers, for real
def test_the_jobs_of_the_notebooks_are_found():
    # If the submit helper or the "!sbatch" lines were missed, every count of jobs
    # would be checked against nothing; the lessons that submit are 03, 04 and 05.
    jobs = submissions()
    assert {j.notebook for j in jobs} == {"03", "04", "05"}
    assert {j.fate for j in jobs} == {"run", "held", "cancelled"}
    assert all(j.nodes >= 1 for j in jobs)
    assert any(j.nodes > 1 for j in jobs)  # the hello job asks for two nodes
    phrases = [p for t in TEXTS for p in job_count_phrases(t)]
    assert len(phrases) >= 5  # notebooks.md, portal.md and the guide count jobs


def test_every_entry_of_jobs_not_checked_names_a_phrase_the_text_has():
    found = {(prose_key(t), m) for t in TEXTS for m in _job_phrases(t)}
    assert sorted(set(JOBS_NOT_CHECKED) - found) == []


def _job_phrases(prose):
    import prose_figures

    for _, sentence, _ in prose_figures._sentences(prose):
        yield from (m.group(0) for m in prose_figures.JOB_COUNT.finditer(sentence))


# ------------------------------------------------- the new rules, on small texts
def _cell(cid, kind, source, outputs=()):
    cell = {"cell_type": kind, "id": cid, "metadata": {}, "source": [source]}
    if kind == "code":
        cell |= {"execution_count": 1, "outputs": list(outputs)}
    return cell


SUBMITTING = [
    _cell("h1", "markdown", "# 05 · Jobs\n\n## 1. Setup"),
    _cell("c1", "code", 'small = dict(nodes=1, ntasks_per_node=2)\nopts = "--nodes=2"'),
    _cell("h2", "markdown", "## 2. Slurm"),
    _cell(
        "c2",
        "code",
        "hello = !sbatch --parsable {opts} slurm/hello_ranks.sbatch\n"
        'sleeper = !sbatch --parsable --wrap "srun sleep 300"\n'
        "!sbatch --test-only --nodes=1 --wrap true\n",
    ),
    _cell("c3", "code", "!scancel {sleeper}"),
    _cell(
        "c4",
        "code",
        "for t in (1, 2):\n"
        '    job = workshop.cluster.submit("slurm/hybrid.sbatch", str(t), nodes=2)\n'
        'for limit in ["5", "5:30", "2-12"]:\n'
        "    held = !sbatch --parsable --hold --time={limit} --wrap true\n"
        "    !scancel {held}\n",
    ),
    _cell("h3", "markdown", "## 3. More"),
    _cell(
        "c5", "code", 'job = workshop.cluster.submit("slurm/train_ddp.sbatch", **small)'
    ),
]


def _jobs_notebook(tmp_path, cells=SUBMITTING):
    folder = tmp_path / "notebooks"
    folder.mkdir(exist_ok=True)
    (folder / "05_x.ipynb").write_text(json.dumps({"cells": cells}))
    return folder


def test_submissions_follow_the_counting_rule(tmp_path):
    jobs = submissions(_jobs_notebook(tmp_path))
    got = [
        (j.section, j.script.split("/")[-1], j.nodes, j.minutes, j.fate) for j in jobs
    ]
    assert got == [
        # the hello job: --nodes from {opts}, --time from the script's #SBATCH line
        ("2", "hello_ranks.sbatch", 2, 5.0, "run"),
        ("2", "--wrap", 1, None, "cancelled"),  # passed to scancel later
        # --test-only is no job; a loop over two items submits two
        ("2", "hybrid.sbatch", 2, 5.0, "run"),
        ("2", "hybrid.sbatch", 2, 5.0, "run"),
        ("2", "--wrap", 1, None, "held"),
        ("2", "--wrap", 1, None, "held"),
        ("2", "--wrap", 1, None, "held"),
        ("3", "train_ddp.sbatch", 1, 15.0, "run"),  # nodes from **small
    ]


def test_a_loop_over_something_else_is_an_error_not_a_guess(tmp_path):
    cells = [
        _cell(
            "c1",
            "code",
            "for n in sizes:\n    workshop.cluster.submit('slurm/hybrid.sbatch')\n",
        )
    ]
    with pytest.raises(ValueError, match=r"cell c1: a job submitted in the loop"):
        submissions(_jobs_notebook(tmp_path, cells))


@pytest.mark.parametrize(
    "limit, minutes",
    [
        ("5", 5),
        ("5:30", 5.5),
        ("00:05:00", 5),
        ("0-00:05", 5),
        ("2-12", 3600),
        ("1-00:00:30", 1440.5),
        ("soon", None),
    ],
)
def test_slurm_time_limits_in_minutes(limit, minutes):
    assert slurm_minutes(limit) == minutes


@pytest.mark.parametrize(
    "text, problem",
    [
        ("Notebook 05 submits its jobs (four that run, the rest held).", None),
        ("Notebook 05 submits its jobs (six that run).", "says 6 jobs that run"),
        ("In 05 §2 and §3 a learner submits 8 jobs.", None),
        ("In 05 §2 and §3 a learner submits twelve jobs.", "submits 8 ("),
        ("05 §2 submits three 2-node jobs, and three held ones.", None),
        ("05 §2 submits two 2-node jobs.", "says 2 2-node jobs in 05 §2, but"),
        ("Each learner, in 05 §2, submits 7 more.", None),
        ("The two hybrid jobs of 05 §2 run after the hello job on 2 nodes.", None),
        ("The hybrid jobs on 1 node in 05 §2.", "asks for 1 node(s) in 05 §2, but"),
        ("05 §2 shows that two jobs never mix.", None),  # not a count of submissions
    ],
)
def test_a_count_of_jobs_is_the_notebooks(tmp_path, text, problem):
    jobs = submissions(_jobs_notebook(tmp_path))
    problems = wrong_job_counts(Prose("guide.md", text + "\n"), jobs)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0], problems
        assert problems[0].startswith("guide.md:1: ")  # the file, then the phrase


def test_a_count_of_jobs_in_a_notebook_is_about_that_notebook(tmp_path):
    jobs = submissions(_jobs_notebook(tmp_path))
    cell = Prose("05_x.ipynb cell m", "This notebook submits 3 jobs.", "05")
    assert "but its code submits 8" in wrong_job_counts(cell, jobs)[0]


def test_number_words():
    assert [_number(w) for w in ("7", "twelve", "Twenty", "thirty-four")] == [
        7,
        12,
        20,
        34,
    ]


def test_exercises_of_named_sections_are_counted_there(tmp_path, monkeypatch):
    import prose_figures

    cells = [
        _cell("h1", "markdown", "## 1. One"),
        _cell("c1", "code", 'workshop.check("05.a", a)\nworkshop.check("05.b", b)'),
        _cell("h2", "markdown", "## 2. Two"),
        _cell("c2", "code", 'workshop.check("05.c", c)'),
    ]
    monkeypatch.setattr(prose_figures, "NOTEBOOKS", _jobs_notebook(tmp_path, cells))
    known = prose_figures.counts()
    right = Prose("guide.md", "Drop 05 §1 and its two exercises; 05 has 3 exercises.")
    assert wrong_counts(right, known) == []
    wrong = Prose("guide.md", "Keep 05 §2 with its two exercises.")
    problems = wrong_counts(wrong, known)
    assert len(problems) == 1 and "but 05 §2 has 1 exercises" in problems[0]


def test_the_lines_of_a_named_file_are_counted():
    lines = len((ROOT / "slurm" / "local_rank.py").read_text().splitlines())
    right = f"Run the {lines}-line script `slurm/local_rank.py` under torchrun."
    about = f"The script `slurm/local_rank.py` (about {lines + 1} lines) prints."
    assert wrong_file_counts(Prose("guide.md", right)) == []
    assert wrong_file_counts(Prose("guide.md", about)) == []
    wrong = Prose(
        "guide.md", "The cell starts a four-line script, `slurm/local_rank.py`."
    )
    problems = wrong_file_counts(wrong)
    assert len(problems) == 1
    assert f"says 4 lines, but slurm/local_rank.py has {lines}" in problems[0]
    gone = Prose("guide.md", "The 40-line script slurm/gone.py.")
    assert "which does not exist" in wrong_file_counts(gone)[0]


def test_the_files_of_a_named_folder_are_counted_and_listed():
    batch = sorted(p.name for p in (ROOT / "slurm").glob("*.sbatch"))
    said = f"The {len(batch)} batch scripts in `slurm/` are listed below."
    assert wrong_file_counts(Prose("guide.md", said)) == []
    wrong = f"The {len(batch) - 1} batch scripts in `slurm/`."
    problems = wrong_file_counts(Prose("guide.md", wrong))
    assert len(problems) == 1 and f"but slurm/ holds {len(batch)}" in problems[0]
    rows = "".join(f"| `{name}` | what it does |\n" for name in batch[1:])
    table = f"The batch scripts in `slurm/`:\n\n| script | what |\n|---|---|\n{rows}"
    problems = unlisted_files(Prose("guide.md", table))
    assert len(problems) == 1 and f"lacks [{batch[0]!r}]" in problems[0]
    rows += f"| `{batch[0]}` | what it does |\n"
    table = f"The batch scripts in `slurm/`:\n\n| script | what |\n|---|---|\n{rows}"
    assert unlisted_files(Prose("guide.md", table)) == []


def test_the_top_of_a_file_must_hold_what_the_pointer_says(tmp_path, monkeypatch):
    import prose_figures

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "times.md").write_text("# Times\n\nAll five took 535 s.\n\n## More\n\n")
    monkeypatch.setattr(prose_figures, "DOCS", docs)
    monkeypatch.setattr(prose_figures, "ROOT", tmp_path)
    right = Prose("guide.md", "About as long (535 s; see the top of [it](times.md)).")
    assert broken_pointers(right) == []
    wrong = Prose("guide.md", "About as long (612 s; see the top of [it](times.md)).")
    problems = broken_pointers(wrong)
    assert len(problems) == 1 and "docs/times.md does not hold 612" in problems[0]
    (docs / "other.md").write_text("# Other\n\n## A\n\nno 535 s here\n")
    this = Prose("other.md", "By hand (535 s here; see the top of this file).")
    assert "does not hold 535" in broken_pointers(this)[0]
    missing = Prose("guide.md", "See the top of [it](gone.md).")
    assert "which does not exist" in broken_pointers(missing)[0]


def test_a_scripts_top_is_its_opening_comment(tmp_path, monkeypatch):
    import prose_figures

    monkeypatch.setattr(prose_figures, "ROOT", tmp_path)
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "a.sbatch").write_text("#!/bin/bash\n# a: says 16 ranks\nx\n")
    (tmp_path / "slurm" / "b.py").write_text("import os\n")
    assert (
        broken_pointers(Prose("g.md", "16 ranks (see the top of `slurm/a.sbatch`)."))
        == []
    )
    problems = broken_pointers(Prose("g.md", "See the top of `slurm/b.py`."))
    assert len(problems) == 1 and "has no opening comment" in problems[0]


POINTING = [
    _cell(
        "m0", "markdown", "## 1. Start\n\nSee section 2 and §3; notebook 04, section 9."
    ),
    _cell("c0", "code", "print(1)"),
    _cell("m1", "markdown", "## 2. Next\n\nThe cell below prints the table."),
    _cell("m2", "markdown", "The next cell draws it. The cell before printed it."),
    _cell("c2", "code", "x = 1"),
]


def test_pointers_in_a_notebook(tmp_path, monkeypatch):
    import prose_figures

    cells = [*POINTING]
    folder = _jobs_notebook(tmp_path, cells)
    (folder / "04_y.ipynb").write_text(
        json.dumps({"cells": [_cell("h", "markdown", "## 9. Nine")]})
    )
    monkeypatch.setattr(prose_figures, "NOTEBOOKS", folder)

    def problems(cid):
        cell = next(c for c in cells if c["id"] == cid)
        return broken_pointers(Prose(f"05_x.ipynb cell {cid}", cell["source"][0], "05"))

    # §3 is no section of 05; notebook 04's section 9 is one of 04.
    first = problems("m0")
    assert len(first) == 1 and "cites section(s) 3 of notebook 05" in first[0]
    # The cell below m1 is markdown: "the cell below" says code.
    below = problems("m1")
    assert len(below) == 1
    said = (
        "'The cell below' points at the next cell, which is a markdown cell, not code"
    )
    assert said in below[0]
    # m2's next cell is code but draws nothing; its previous cell is markdown.
    around = problems("m2")
    assert any("'The next cell' draws, but cell c2 draws nothing" in p for p in around)
    assert any("'The cell before' points at the previous cell" in p for p in around)
    assert len(around) == 2


def test_a_notebooks_link_to_a_docs_heading_must_name_its_explicit_anchor(
    tmp_path, monkeypatch
):
    import prose_figures

    folder = _jobs_notebook(tmp_path, [_cell("c", "code", "1")])
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "glossary.md").write_text(
        '# Glossary\n\n<a id="rank"></a>\n## Rank\n\nA rank.\n\n'
        "## Node\n\nA node, with a heading a git host names #node but no anchor that\n"
        'JupyterLab scrolls to; `<a id="host"></a>` in code is no anchor either.\n'
    )
    monkeypatch.setattr(prose_figures, "NOTEBOOKS", folder)
    text = (
        "A [rank](../docs/glossary.md#rank), a [node](../docs/glossary.md#node), "
        "a [host](../docs/glossary.md#host)."
    )
    problems = broken_pointers(Prose("05_x.ipynb cell m", text, "05"))
    assert len(problems) == 2, problems
    assert "glossary.md#node" in problems[0] and "glossary.md#host" in problems[1]
    assert '<a id="node"></a> line' in problems[0]
