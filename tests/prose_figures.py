"""What the prose claims about the notebooks' stored outputs, checked against them.

The prose is README.md, every Markdown file under docs/ and every markdown cell of
the notebooks. These kinds of claim are checked:

1. **A figure linked to a cell.** A figure quoted from a stored output is written as
   a link whose title names the cell by its id, so a reader can find it and this
   check can read it::

       [x10.2](../notebooks/01_single_node_multi_gpu.ipynb "cell 5f1c2a9e")

   Every number of the link text must be in the cell's output; a link text without
   a number points at the cell instead of quoting it, and the cell must exist. After
   a colon the
   title may name the figure meant, by the text printed just before it (``…``
   stands for any text on the same line; the last occurrence counts)::

       [above 0.95](../notebooks/01_single_node_multi_gpu.ipynb
                    "cell 656ce1cd: eval accuracy")

   The link text then states a plain figure (equal at the precision written), a
   bound (``above``, ``over``, ``at least``, ``below``, ``under``, ``at most``), a
   range (``0.7 to 0.85``, or with an en dash) or ``about X`` (rounds to X). A training
   cell's figures (losses, accuracies, checksums: see :func:`machine_bound_cells`)
   differ between CPUs in the third digit, so they may only be quoted as a bound, a
   range or ``about``. Inside a notebook the link names the notebook's own file.
2. **A count.** "Six questions" must be the number of questions of the quiz it
   talks about, "the five exercises" the number of exercises (``workshop.check``
   cells) of its notebook, "all 34 answers" every question of every quiz.
3. **A figure a stored output holds, in a doc.** In README.md and docs/ it must be
   a link (:func:`unlinked_figures`): quoted without saying from where, it would go
   stale without anything noticing.
4. **Every figure of text about a notebook** (:func:`unaccounted_figures`): in a
   notebook's markdown, and in a paragraph of a doc that names a notebook, every
   figure (a decimal, a number with a thousands comma or a unit) is a checked link,
   is in the stored output of a notebook the text is about, is in a sentence that
   credits a source document (tests/test_source_citations.py checks those), or is
   listed in :data:`NOT_FROM_OUTPUTS` with the reason it is not an output's. A
   figure that an output no longer holds, or never held, is reported. In a doc
   section that shows the command writing a file of docs/results/, the figures are
   looked for in what the workshop prints for that file, at the precision written.
5. **Jobs a notebook submits** (:func:`wrong_job_counts`): "six that run", "submits
   15 more", "three 2-node jobs in 03 §6", "six held ones", "the hello job on 2
   nodes", against the jobs the code cells submit (:func:`submissions` states the
   counting rule), in the notebooks and sections the sentence names.
6. **Exercises of named sections**: "05 §1, §3 and §5 with their four exercises"
   counts the exercises of those sections (2 above counts a notebook's).
7. **Lines of a named file and files of a folder** (:func:`wrong_file_counts`,
   :func:`unlisted_files`): "a four-line script, `slurm/local_rank.py`", "the seven
   batch scripts in `slurm/`", and a table introduced as the scripts of a folder
   lists every one of them.
8. **Pointers** (:func:`broken_pointers`): "see the top of this file" (the top holds
   the figures the sentence quotes; a script's top is its opening comment), a
   notebook's "§N" or "section N" (a heading numbered N exists), "the next cell" or
   "the cell before" (that neighbour is a code cell, and draws or prints where the
   sentence says so), and a notebook's links to docs' files and headings (docs' own
   links and "03 §6" are tests/test_docs.py's).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
DOCS = ROOT / "docs"

LINK = re.compile(
    r"\[(?P<text>[^\]]+)\]\((?P<path>(?:(?:\.\./)?notebooks/)?(?P<nb>\d\d)_[\w.-]+"
    r'\.ipynb)\s+"cell (?P<cell>[\w-]+)(?::\s*(?P<label>[^"]+))?"\)'
)
_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
NUMBER = re.compile(rf"(?<![\d.,])(?:{_NUM})")
_UNITS = (
    r"%|ms\b|µs\b|us\b|s\b|KiB\b|MiB\b|GiB\b|KB\b|MB\b|GB\b|TB\b|Gb/s|GB/s|bytes\b"
    r"|samples/s\b|images/s\b|examples/s\b|times\b"
)
# What counts as a measured-looking figure in prose: a decimal, a thousands-comma
# number, or a number with a unit or a speed-up mark.
FIGURE = re.compile(
    rf"(?<![\w.,/-])x?(?P<num>\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?|\d+\.\d+(?!\.\d)|\d+"
    rf"(?=\s?(?:{_UNITS})))"
)
# The figures a doc must link when a stored output holds them: decimals, thousands,
# and numbers with the units of the outputs; "6 GB" or "13 s" are too common to
# tell a quote from a coincidence.
LINKABLE = re.compile(
    r"(?<![\w.,/-])x?(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+(?!\.\d)|\d+"
    r"(?=\s?(?:%|ms\b|MiB\b|GiB\b|bytes\b|samples/s\b|GB/s\b)))"
)
# A figure the text gives as rounded: "about 3.3 times".
ROUNDED = re.compile(r"\b(?:about|around|nearly|near|roughly)\s+x?$")
# Which notebook a paragraph talks about: "Notebook 02", "02 §5", "03 *Quiz*".
MENTION = re.compile(r"\b[Nn]otebooks? (0[1-5])\b|\b(0[1-5]) (?:§|\*)")
# A paragraph that cites a section of a notebook teaches from it: "03 §9".
SECTION = re.compile(r"\b(0[1-5]) (?:§|\*)")
# The notebook a count is about: the nearest of these before it in its sentence.
SUBJECT = re.compile(r"\b[Nn]otebooks? (0[1-5])\b|\b(0[1-5])(?:'s\b| §| \*)")
TAG = re.compile(r"\[doc (\d{3})\]")
# Sentence ends, as tests/test_source_citations.py splits them.
SENTENCE_END = re.compile(
    r"(?<=[.!?])\s+(?=[A-Z*_(\[])|\n\s*\n|\n(?=\s*(?:[-*|]|\d+\.)\s)"
)
WORDS = [
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]
# Tens from thirty on, alone or with a unit after a hyphen ("thirty-four").
TENS = ["thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_COUNT_NUM = (
    rf"(?:(?:twenty|{'|'.join(TENS)})-(?:{'|'.join(WORDS[:9])})"
    rf"|{'|'.join(TENS)}|{'|'.join(WORDS)}|[1-9]\d*)"
)
COUNT = re.compile(
    rf"\b(?P<n>{_COUNT_NUM})(?:\s+to\s+(?P<m>{_COUNT_NUM}))?\s+(?:[a-z-]+\s+)?"
    r"(?P<noun>questions|exercises|answers)\b",
    re.IGNORECASE,
)
BOUND = re.compile(
    r"\b(?P<op>above|over|more than|at least|below|under|less than|at most|about)"
    rf"\s+(?P<num>{_NUM})"
)
RANGE = re.compile(rf"(?P<lo>{_NUM})\s*(?:\u2013|to)\s*(?P<hi>{_NUM})")
# Numbers that name a version, not a result: "torch 2.11", "Slurm 22.05".
VERSION = re.compile(
    r"(?:torch|PyTorch|Python|Slurm|MPI|NCCL|CUDA|[Vv]ersion|releases?|glibc|Linux)"
    r"\s+\(?(?:\d+(?:\.\d+)*\s*(?:,|and|or)\s+)*$"
)
# An inline sum the reader can follow: "6 + 2 / 4 = 6.5 ms", "30 x 16 = 480".
ARITHMETIC = re.compile(
    r"(?:[\d.,]+\s*(?:ms|s|GB|MB)?\s*[-+\u00d7x*/]\s*)+[\d.,]+\s*(?:ms|s)?\s*"
    r"[=\u2248<>]\s*[\d.,]+(?:\s*[-+\u00d7x*/]\s*[\d.,]+)*"
)
# Cells whose outputs hold training figures, which differ between CPUs: a loss, an
# accuracy or a checksum printed with its figure, or a table with such a column.
TRAINING = re.compile(
    r"\b(?:loss|accuracy|checksum|weights sum to)[ :=]+-?\d+\.\d"
    r"|^[^\d\n]*\b(?:loss|accuracy)\b[^\d\n]*$",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Link:
    doc: str
    line: int
    text: str
    notebook: str
    cell: str
    label: str | None = None


@dataclass(frozen=True)
class Prose:
    """One text: a Markdown file, or one markdown cell of a notebook."""

    name: str  # "README.md", "glossary.md", "01_x.ipynb cell 6a6820c0"
    text: str
    notebook: str | None = None  # the notebook a cell belongs to


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


def machine_bound_cells(outputs: dict[str, dict[str, str]]) -> dict[str, set[str]]:
    """Per notebook, the cells whose outputs print training figures (a loss, an
    accuracy, a checksum of the weights): their decimals differ between CPUs (AVX2,
    AVX-512) in the third digit, so prose may quote them only as a bound."""
    return {
        nb: {cell for cell, text in cells.items() if TRAINING.search(text)}
        for nb, cells in outputs.items()
    }


def counts() -> dict[str, dict[str, int]]:
    """``{notebook number: {"questions": n, "exercises": n}}``: the questions of its
    quiz, from the quiz cell's stored output, and its exercises, the names its code
    cells pass to ``workshop.check``."""
    found = {}
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        nb = path.name[:2]
        questions, exercises = 0, set()
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            exercises |= set(re.findall(r'workshop\.check\("(\d\d\.\w+)"', source))
            for out in cell.get("outputs", []):
                text = "".join(
                    out.get("data", {}).get("text/plain", out.get("text", ""))
                )
                said = re.search(rf"Quiz {nb} · [\s\S]*?(\d+) questions", text)
                if said:
                    questions = int(said[1])
        found[nb] = {"questions": questions, "exercises": len(exercises)}
    return found


def prose_key(prose: Prose) -> str:
    """The first part of a :data:`NOT_FROM_OUTPUTS` key: a notebook's number for
    its cells, else the file's name."""
    return prose.notebook or prose.name


def prose_texts() -> list[Prose]:
    """README.md, every Markdown file under docs/, every notebook markdown cell."""
    texts = [Prose("README.md", (ROOT / "README.md").read_text())]
    for path in sorted(DOCS.rglob("*.md")):
        texts.append(Prose(str(path.relative_to(DOCS)), path.read_text()))
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                name = f"{path.name} cell {cell.get('id', '')}"
                texts.append(Prose(name, "".join(cell["source"]), path.name[:2]))
    return texts


def _as_prose(doc: Path | Prose) -> Prose:
    return doc if isinstance(doc, Prose) else Prose(doc.name, doc.read_text())


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def linked_figures(doc: Path | Prose) -> list[Link]:
    """Every link of ``doc`` to a notebook cell."""
    prose = _as_prose(doc)
    return [
        Link(prose.name, number, m["text"], m["nb"], m["cell"], m["label"])
        for number, line in _prose_lines(prose.text)
        for m in LINK.finditer(line)
    ]


def holds(output: str, number: str) -> bool:
    """Whether ``output`` contains ``number`` as a whole number (not inside another),
    with or without thousands commas (the prose writes 1,437 where a cell prints
    1437)."""
    forms = {number, number.replace(",", "")}
    if re.fullmatch(r"\d{4,}", number):
        forms.add(f"{int(number):,}")
    return any(
        re.search(rf"(?<![\d.,]){re.escape(form)}(?![\d]|[.,]\d)", output) is not None
        for form in forms
    )


def _value(number: str) -> float:
    return float(number.replace(",", ""))


def _decimals(number: str) -> int:
    return len(number.split(".")[1]) if "." in number else 0


def _rounds_to(value: float, number: str) -> bool:
    """Whether ``value`` is ``number`` at the precision ``number`` is written with."""
    return abs(value - _value(number)) <= 0.5 * 10 ** -_decimals(number) + 1e-9


def labelled_values(output: str, label: str) -> list[float]:
    """The figures printed right after ``label`` (on the same line; ``…`` in the
    label stands for any text of that line), in the order they appear."""
    parts = [
        r"(?<![\w.,])" + r"[ \t]+".join(map(re.escape, part.split())) + r"(?![\w.,])"
        for part in label.split("…")
    ]
    pattern = r"[^\n]*?".join(parts)
    pattern += rf"[ \t:=]*(?P<value>-?(?:{_NUM}))"
    return [_value(m["value"]) for m in re.finditer(pattern, output)]


def _claim_problems(link: Link, output: str, training: bool) -> list[str]:
    """What the link text claims that the output does not hold."""
    problems = []
    text = link.text
    bounds = list(BOUND.finditer(text))
    ranges = list(RANGE.finditer(BOUND.sub("", text)))
    if not bounds and not ranges:
        numbers = NUMBER.findall(text)
        if not numbers:
            return []  # a pointer to the cell ("its history table"): it must exist
        if link.label is None:
            problems += [
                f"its stored output lacks {n}" for n in numbers if not holds(output, n)
            ]
        else:
            values = labelled_values(output, link.label)
            if not values:
                return [f"its stored output prints no figure after {link.label!r}"]
            problems += [
                f"{link.label!r} is {values[-1]:g}, not {n}"
                for n in numbers
                if not _rounds_to(values[-1], n)
            ]
        if training and any("." in n for n in numbers):
            problems.append(
                "it quotes a training figure exactly, which differs between CPUs in "
                "the third digit: quote a bound or a range, and name the figure "
                'after a colon in the title ("cell ID: eval accuracy")'
            )
        return problems
    if link.label is None:
        return [
            "a bound or a range needs the figure it bounds: name it after a "
            'colon in the title ("cell ID: eval accuracy")'
        ]
    values = labelled_values(output, link.label)
    if not values:
        return [f"its stored output prints no figure after {link.label!r}"]
    value = values[-1]
    for m in bounds:
        op, bound = m["op"], m["num"]
        ok = {
            "above": value > _value(bound),
            "over": value > _value(bound),
            "more than": value > _value(bound),
            "at least": value >= _value(bound),
            "below": value < _value(bound),
            "under": value < _value(bound),
            "less than": value < _value(bound),
            "at most": value <= _value(bound),
            "about": _rounds_to(value, bound),
        }[op]
        if not ok:
            problems.append(f"{link.label!r} is {value:g}, not {op} {bound}")
    for m in ranges:
        if not _value(m["lo"]) <= value <= _value(m["hi"]):
            problems.append(f"{link.label!r} is {value:g}, not {m['lo']} to {m['hi']}")
    return problems


def stale_links(doc: Path | Prose, outputs: dict[str, dict[str, str]]) -> list[str]:
    """One message per link whose cell is gone or whose output does not hold what
    the link text claims."""
    problems = []
    bound = machine_bound_cells(outputs)
    for link in linked_figures(doc):
        cells = outputs.get(link.notebook, {})
        where = f"{link.doc}:{link.line} [{link.text}] -> notebook {link.notebook}"
        if link.cell not in cells:
            problems.append(f"{where}: no cell with id {link.cell!r}")
            continue
        training = link.cell in bound.get(link.notebook, set())
        for problem in _claim_problems(link, cells[link.cell], training):
            problems.append(f"{where} cell {link.cell}: {problem}")
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


def _sections(text: str):
    """(first line, paragraph text, subject notebook or None).

    A heading that names one notebook makes its section about that notebook; a
    paragraph that opens with "Notebook 02" is about 02, and so is the list after
    it; any other paragraph outside such a section is about none."""
    subject, heading_subject = None, False
    block: list[tuple[int, str]] = []

    def flush():
        if block:
            yield block[0][0], "\n".join(line for _, line in block), subject

    for number, line in _prose_lines(text):
        if line.startswith("#"):
            yield from flush()
            block = []
            named = {a or b for a, b in MENTION.findall(line)}
            subject = named.pop() if len(named) == 1 else None
            heading_subject = subject is not None
            continue
        if not line.strip():
            yield from flush()
            block = []
            continue
        if not block:  # a paragraph opening with "Notebook 02" is about 02, and
            opening = re.match(r"\W*[Nn]otebook (0[1-5])\b", line)  # so is its list
            if opening:
                subject, heading_subject = opening[1], False
            elif not heading_subject and not re.match(r"\s*(?:[-*]|\d+\.)\s", line):
                subject = None
        block.append((number, line))
    yield from flush()


def wrong_counts(doc: Path | Prose, known: dict[str, dict[str, int]]) -> list[str]:
    """Counts of questions, answers and exercises that are not the quizzes' and the
    notebooks' own ("Six questions" before a quiz of 8)."""
    prose = _as_prose(doc)
    problems = []
    if prose.notebook:
        parts = [(1, prose.text, prose.notebook)]
    else:
        parts = list(_sections(prose.text))
    for first, text, subject in parts:
        # Questions and answers are a quiz's where the text is about a quiz.
        quiz = re.search(r"quiz", text, re.IGNORECASE) is not None
        for sentence in SENTENCE_END.split(re.sub(r"`[^`]*`", "", text)):
            for m in COUNT.finditer(sentence):
                if m["noun"].lower() != "exercises" and not quiz:
                    continue
                before = [a or b for a, b in SUBJECT.findall(sentence[: m.start()])]
                about = prose.notebook or (before[-1] if before else subject)
                noun = m["noun"].lower()
                kind = "exercises" if noun == "exercises" else "questions"
                per = [
                    c[kind]
                    for nb, c in sorted(known.items())
                    if about is None or nb == about
                ]
                said = [_number(m["n"])] + ([_number(m["m"])] if m["m"] else [])
                # A range is the fewest to the most; a number, one notebook's count
                # or, about none, all of them together.
                right = [min(per), max(per)] if len(said) == 2 else [sum(per)]
                whose = f"notebook {about}" if about else "all the notebooks"
                # In a doc, "05 §1, §3 and §5 with their four exercises": those
                # sections' exercises, where the list ends just before the count.
                sections = _sections_just_before(sentence, m.start(), about)
                if kind == "exercises" and sections and not prose.notebook:
                    where = exercise_sections().get(about, {}).values()
                    right = [sum(1 for s in where if s in sections)]
                    whose = f"{about} §{' §'.join(sorted(sections, key=int))}"
                if said != right:
                    problems.append(
                        f"{prose.name}:{first}: {m.group(0)!r} but {whose} "
                        f"{'has' if about else 'have'} {' to '.join(map(str, right))} "
                        f"{kind}"
                    )
    return problems


def exercise_sections(folder: Path | None = None) -> dict[str, dict[str, str]]:
    """``{notebook: {exercise: the number of the section ("## 6. ...") it is in}}``."""
    found: dict[str, dict[str, str]] = {}
    for path in sorted((folder or NOTEBOOKS).glob("[0-9][0-9]_*.ipynb")):
        section, names = "", found.setdefault(path.name[:2], {})
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "markdown":
                heading = re.findall(r"^#{1,3}\s+(\d+)\.\s", source, re.M)
                section = heading[-1] if heading else section
            elif cell["cell_type"] == "code":
                for name in re.findall(r'workshop\.check\("(\d\d\.\w+)"', source):
                    names.setdefault(name, section)
    return found


def _sections_just_before(sentence: str, start: int, notebook: str | None) -> set[str]:
    """The sections of ``notebook`` in a list of references that ends at most a few
    words before ``start`` ("05 §1, §3 and §5 with their four exercises")."""
    for _, g_end, scope in _ref_groups(sentence[:start]):
        if len(sentence[g_end:start]) <= 15 and len(scope.parts) == 1:
            nb, sections = scope.parts[0]
            if nb == notebook and sections:
                return set(sections)
    return set()


def _number(word: str) -> int:
    """The value of a count written in digits or in words ("12", "twelve",
    "thirty-four")."""
    word = word.lower()
    if word.isdigit():
        return int(word)
    tens, _, unit = word.partition("-")
    value = 30 + 10 * TENS.index(tens) if tens in TENS else WORDS.index(tens) + 1
    return value + (WORDS.index(unit) + 1 if unit else 0)


# Figures of the prose that no stored output holds, or holds by coincidence, with
# why: (file, figure) -> reason. A file is "README.md", a docs/ path, or a
# notebook's number for its markdown cells.
CONSTANT = "a fixed fact of the software, the data or the hardware, not a run's"
DERIVED = "worked out in the text from figures the cells print"
ASSUMED = "an assumption or an example, stated as such"
OUTSIDE = "from an outside source the text names"
VERSION_NAMED = "a version of the software named beside it"
RUN_TIME = "the time the command printed when its run ended; the file keeps none"
NOT_FROM_OUTPUTS = {
    ("launching.md", "0.02"): "launch's bounded-output test (tests/ranks), not a cell",
    ("notebooks.md", "1,024"): "the world size 04 §8 plans for, not a result",
    ("cluster.md", "2.4"): VERSION_NAMED + " (gloo in torch 2.4)",
    ("cluster.md", "2.1"): VERSION_NAMED + " (torch 2.4.1 and 2.11.0)",
    # notebook 01
    ("01", "1,797"): CONSTANT + ": scikit-learn's digits, 1,437 train + 360 test",
    ("01", "23.5"): DERIVED
    + ": ResNet-50's 25,557,032 less its last layer's 2,049,000",
    ("01", "0.10"): DERIVED + ": one class in ten, guessed",
    ("01", "6.6"): DERIVED + ": 1e-8 times 2**16",
    ("01", "65,504"): CONSTANT + ": float16's largest number (finfo prints 6.55e+04)",
    ("01", "2,000"): CONSTANT + ": GradScaler's default growth_interval",
    ("01", "49"): DERIVED + ": (224 / 32) squared",
    # notebook 02
    ("02", "60,000"): ASSUMED + ": a dataset of MNIST's size",
    ("02", "25,557,032"): "ResNet-50's parameters, as notebook 01's first cell counts",
    ("02", "1.8"): DERIVED + ": the exercise's 0.18 GB at 10 steps per second",
    # notebook 03
    ("03", "600"): CONSTANT + ": torchrun's default join_timeout",
    ("03", "5.0"): VERSION_NAMED + " (Open MPI)",
    ("03", "1.45"): DERIVED + ": keras-v100-batch8192's speed-up on 8 GPUs, which "
    "the cell draws and workshop.sources.document_table prints",
    ("03", "25.6"): DERIVED + ": ResNet-50's 25,557,032 parameters (01's first cell)",
    ("03", "102"): DERIVED + ": 25,557,032 parameters x 4 bytes",
    ("03", "150"): ASSUMED + ": the compute time the cell sets",
    ("03", "1.25"): ASSUMED + ": the beta the reader is asked to try",
    ("03", "140"): DERIVED + ": ring_time at beta 1.25 GB/s, 8 GPUs or more: 143 ms",
    ("03", "1,437"): CONSTANT + ": the digits' training set (01 prints it)",
    ("03", "5.8"): OUTSIDE + ": VGG-16's 138 million parameters over Inception V3's "
    "24 million, from Horovod's benchmark page",
    # notebook 04
    ("04", "40"): ASSUMED + ": the sleep the cell's code sets for a backward pass",
    ("04", "50"): ASSUMED + ": the delay the cell's code gives one worker a step",
    ("04", "47"): OUTSIDE + ": nccl-tests issue 290, the middle of its 46 to 48",
    ("04", "362"): OUTSIDE + ": Azure's ND H100 v5 all-reduce at 67 MB, 361.78 GB/s",
    ("04", "25"): ASSUMED + ": the goal the package sets itself (issue 46)",
    ("04", "2,000"): ASSUMED + ": any number of ranks",
    ("04", "263,168"): DERIVED + ": DDP's 4,210,688 bytes / 16 bytes per parameter",
    ("04", "1.5"): OUTSIDE + ": ZeRO's paper (Rajbhandari et al., 2020), stage 3's "
    "traffic",
    ("04", "1,000"): ASSUMED + ": the width the cell's model is built with",
    ("04", "25.6"): DERIVED + ": ResNet-50's 25,557,032 parameters (01's first cell)",
    ("04", "150"): ASSUMED + ": a typical NVLink figure, stated as assumed",
    ("04", "14,336"): OUTSIDE + ": Llama 3 8B's model card",
    ("04", "16,032"): DERIVED + ": 128,256 vocabulary rows / tp=8",
    ("04", "480"): OUTSIDE + ": NVIDIA's DGX Cloud NCCL benchmark",
    ("04", "370"): OUTSIDE + ": nccl-tests issue 212",
    ("04", "48"): OUTSIDE + ": nccl-tests issue 290",
    # notebook 05
    ("05", "5,000"): ASSUMED + ": round figures for illustration, stated as such",
    ("05", "1.5"): ASSUMED
    + " (1.5 ms of work per image); and "
    + DERIVED
    + " (24 MB of 16 MB sent on 4 ranks)",
    # docs
    ("benchmarks.md", "64"): "a message size, 64 KiB or 64 MiB (65536 or 67108864 "
    "bytes in the file)",
    ("benchmarks.md", "12.8"): RUN_TIME,
    ("benchmarks.md", "1.99"): "CPU-seconds to import what a rank imports, with the "
    "bytecode compiled (5 starts, timed by hand for make test), not a cell",
    ("benchmarks.md", "2.6"): "CPU-seconds a fresh rank spent importing torch here, "
    "timed by hand, not a cell",
    ("benchmarks.md", "5.3"): "CPU-seconds `import torch` took on another CI "
    "machine (4.2 to 5.3), timed there by hand, not a cell",
    ("benchmarks.md", "41.0"): RUN_TIME + " (make test-site, notebook 01's cell 15; "
    "04's published-runs table prints a 41.0% of Meta's by coincidence)",
    ("benchmarks.md", "16.3"): RUN_TIME,
    ("benchmarks.md", "19.0"): RUN_TIME,
    ("benchmarks.md", "36.4"): RUN_TIME,
    ("benchmarks.md", "39.5"): RUN_TIME,
    ("benchmarks.md", "1.4"): "CPU-seconds a fresh rank spent importing torch._dynamo, "
    "measured beside the suite (notebook 01's 1.4 is another figure)",
    ("benchmarks.md", "2.4"): DERIVED + ": alpha on 4 ranks / on 2, 1083 / 455 us",
    ("benchmarks.md", "1.9"): "CPU-seconds a fresh rank spent importing "
    "torch._dynamo (1.4 to 1.9), timed by hand; 04's calibration prints a 1.9 by "
    "coincidence",
    ("benchmarks.md", "7.6"): "seconds the slowest of 40 hello jobs took on the "
    "private cluster, timed by hand; 04's calibration prints a 7.6 by coincidence",
    ("glossary.md", "1,024"): "the world size 04 §8 plans for, not a result",
    ("glossary.md", "43"): OUTSIDE + ": Dubey et al., as 04 §8 cites them",
    ("glossary.md", "42"): DERIVED + ": 5.60 MiB of 9.71 MiB kept, 01 §5",
    ("glossary.md", "50"): ASSUMED + ": the delay 04 §5's cell sets, slow_seconds",
    ("glossary.md", "16"): CONSTANT
    + ": bytes per parameter with fp32 weights and Adam",
    ("instructor.md", "1,024"): "the world size 04 §8 plans for, not a result",
    ("instructor.md", "0.10"): DERIVED + ": one class in ten, guessed",
    ("instructor.md", "4.2"): OUTSIDE
    + ": the H100 node of issue 23 (benchmarks.md: 4.9)",
    ("instructor.md", "6.7"): OUTSIDE
    + ": the H100 node of issue 23 (benchmarks.md: 4.9)",
    ("instructor.md", "2.11"): VERSION_NAMED + " (torch)",
    ("instructor.md", "2.4"): VERSION_NAMED + " (torch)",
    ("instructor.md", "0.18"): DERIVED + ": the answer of exercise 02.bytes",
    ("instructor.md", "1.6"): DERIVED + ": the answer of exercise 04.server_bytes",
    ("instructor.md", "600"): CONSTANT + ": torchrun's default join_timeout",
    ("instructor.md", "1.5"): OUTSIDE + ": ZeRO's paper, as 04 §4 says",
}


def _strip(text: str) -> str:
    """The text without what holds numbers that are not figures: code, links (their
    figures are checked as links), section numbers and headings' numbers."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"^(?: {4}|\t).*$", "", text, flags=re.M)  # indented code
    text = re.sub(r"<[^>\n]+>", "", text)
    text = re.sub(r"`[^`]*`", "", text)
    text = LINK.sub("", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"§\s?\d+(?:\.\d+)*", "", text)
    text = re.sub(r"^#+\s+[\d.]+", "", text, flags=re.M)
    return ARITHMETIC.sub("", text)


def _figures(text: str, pattern: re.Pattern = FIGURE):
    """The figures of ``text`` outside code, links and sentences credited to a
    source document, with the sentence each is in."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code, also in a solution
    for sentence in SENTENCE_END.split(text):
        if TAG.search(sentence):
            continue  # tests/test_source_citations.py checks these
        bare = _strip(sentence)
        for m in pattern.finditer(bare):
            if VERSION.search(bare[: m.start()]):
                continue
            yield m["num"], m.group(0), sentence


@cache
def results_output(name: str) -> str:
    """What the workshop prints for a file (or a job's folder) of docs/results/:
    the tables and summaries that notebook 02 and 03 print for such files."""
    import workshop  # torch: imported only for the docs that need it

    path = DOCS / "results" / name
    if not path.exists():
        path = path.with_suffix(".json")
    if not path.exists():
        return ""
    if path.is_dir() or "scaling" in path.name:
        return workshop.bench.load_scaling(str(path)).report()
    result = workshop.bench.load_allreduce(str(path))
    return result.table() + "\n" + result.summary()


def _near(text: str, figure: str, scale: bool = True) -> bool:
    """Whether ``text`` prints ``figure`` at the precision written, in the same
    unit or (``scale``) a thousandth or thousandfold of it (µs and ms, MB and GB)."""
    for m in NUMBER.finditer(text):
        value = _value(m.group(0))
        scaled = (value, value / 1e3, value * 1e3) if scale else (value,)
        if any(_rounds_to(v, figure) for v in scaled):
            return True
    return False


def _results_sections(text: str) -> dict[int, str]:
    """``{line number: results file}`` for every line of a section (under a
    heading) that shows the command writing a file of docs/results/, or the line
    loading one."""
    found, section, name = {}, [], None
    for number, line in enumerate([*text.splitlines(), "#"], 1):
        if line.startswith("#"):
            for n in section:
                if name:
                    found[n] = name
            section, name = [], None
            continue
        said = re.search(r"(?:--out |load_\w+\(\")docs/results/([\w.-]+)", line)
        if said:
            path = DOCS / "results" / said[1]
            if path.is_dir() or path.with_suffix(".json").exists():
                name = said[1]
        section.append(number)
    return found


def unaccounted_figures(
    doc: Path | Prose, outputs: dict[str, dict[str, str]]
) -> list[str]:
    """Figures of text about a notebook that no stored output holds and no entry of
    :data:`NOT_FROM_OUTPUTS` explains, or that only a training cell holds."""
    prose = _as_prose(doc)
    bound = machine_bound_cells(outputs)
    problems = []
    if prose.notebook:
        named = {a or b for a, b in MENTION.findall(prose.text)}
        parts = [(1, prose.text, {prose.notebook} | named)]
    else:
        # A doc's paragraph is about the notebook it is written about, or whose
        # sections it cites ("03 §9"); a passing mention is not enough.
        parts = [
            (
                first,
                text,
                set(SECTION.findall(text)) | ({subject} if subject else set()),
            )
            for first, text, subject in _sections(prose.text)
        ]
    key = prose_key(prose)
    results = {} if prose.notebook else _results_sections(prose.text)
    for first, text, notebooks in parts:
        result = results.get(first)
        if not notebooks and not result:
            continue  # not about a notebook: setup, portals, the GPU node's runs
        for figure, shown, sentence in _figures(text):
            if (key, figure) in NOT_FROM_OUTPUTS:
                continue
            if result and _near(results_output(result), figure):
                continue
            rounded = ROUNDED.search(sentence[: sentence.find(shown)])
            if rounded and any(
                _near(outputs[nb][cell], figure, scale=False)
                for nb in notebooks
                for cell in outputs.get(nb, {})
            ):
                continue
            where = [
                (nb, cell)
                for nb in sorted(notebooks)
                for cell, out in outputs.get(nb, {}).items()
                if holds(out, figure)
            ]
            said = " ".join(sentence.split())[:100]
            if not where:
                problems.append(
                    f"{prose.name}:{first}: {shown!r} is in no stored output of "
                    f"notebook(s) {', '.join(sorted(notebooks)) or '-'}"
                    + (f" or of docs/results/{result}" if result else "")
                    + f": correct it, or say why in NOT_FROM_OUTPUTS ({said})"
                )
            elif "." in figure and all(cell in bound[nb] for nb, cell in where):
                problems.append(
                    f"{prose.name}:{first}: {shown!r} is a training figure of "
                    f"notebook {where[0][0]} cell {where[0][1]}, which differs "
                    f"between CPUs: quote a bound or a range ({said})"
                )
    return problems


def unlinked_figures(
    doc: Path | Prose, outputs: dict[str, dict[str, str]]
) -> list[str]:
    """Figures of a doc's prose, outside links, that the stored outputs of the
    notebook the paragraph talks about hold."""
    prose = _as_prose(doc)
    problems = []
    for _first, lines, notebooks in _paragraphs(prose.text):
        for number, line in lines:
            for figure, shown, _ in _figures(line, LINKABLE):
                if (prose.name, figure) in NOT_FROM_OUTPUTS:
                    continue  # a coincidence, explained there
                where = [
                    f"{nb} cell {cell}"
                    for nb in sorted(notebooks)
                    for cell, text in outputs.get(nb, {}).items()
                    if holds(text, figure)
                ]
                if where:
                    problems.append(
                        f"{prose.name}:{number}: {shown!r} is in the stored "
                        f"output of notebook {where[0]}: link it to that cell"
                    )
    return problems


# ------------------------------------------------------ what a text points at
# Where a count or a pointer names notebooks and sections: "Notebook 03", "03 §6",
# "03 §6, 03 §7 and 05 §4", "03 §6 and §7", "02 §8 to §11", "in 03", "05's"; in a
# notebook's own text also "§6", "section 6", "sections 1 to 4" (or with an en dash).
_REF_TOKEN = re.compile(
    r"\b[Nn]otebooks?\s+(?P<named>0[1-5])\b(?:,?\s*(?:§\s?|section\s+)(?P<nsec>\d+))?"
    r"|(?<![\w.,:/-])(?P<nb>0[1-5])(?![\w.:/-]|,\d)(?:'s)?(?:\s*§\s?(?P<sec>\d+))?"
    r"|§\s?(?P<bare>\d+)"
    r"|\b[Ss]ections?\s+(?P<word>\d+)"
)
# What joins the references of one list: "03 §6, 03 §7 and 05 §4", "§1\u20134".
_REF_JOIN = re.compile(r"\s*(?:,\s*and|,|and|to|\u2013|-)\s*")
# Where a sentence names a group after a count: "three 2-node jobs in 03 §6".
_REF_AFTER = re.compile(r"\s*(?:in|of|from)\s+$")


@dataclass(frozen=True)
class Scope:
    """Notebooks, or sections of one, that a phrase is about: ``{"03": {"6", "7"},
    "05": set()}``; an empty set is the whole notebook."""

    parts: tuple[tuple[str, frozenset[str]], ...]

    def holds(self, notebook: str, section: str) -> bool:
        return any(
            nb == notebook and (not sections or section in sections)
            for nb, sections in self.parts
        )

    def __str__(self) -> str:
        return ", ".join(
            f"{nb} §{' §'.join(sorted(s, key=int))}" if s else f"notebook {nb}"
            for nb, s in self.parts
        )


def _ref_groups(text: str, notebook: str | None = None):
    """(start, end, Scope) of each list of notebook references in ``text``; a bare
    "§6" or "section 6" belongs to the notebook named before it in the list, or, in
    a notebook's own text, to that notebook."""
    groups: list[list] = []  # [start, end, {nb: set}, last notebook]
    for m in _REF_TOKEN.finditer(text):
        nb = m["named"] or m["nb"]
        section = m["nsec"] or m["sec"] or m["bare"] or m["word"]
        joined = (
            groups and _REF_JOIN.fullmatch(text[groups[-1][1] : m.start()])
        ) or None
        if not joined:
            groups.append([m.start(), m.end(), {}, notebook, None])
        group = groups[-1]
        group[1] = m.end()
        nb = nb or group[3]
        if nb is None:
            continue  # "§6" in a doc, with no notebook before it: test_docs.py's
        group[3] = nb
        sections = group[2].setdefault(nb, set())
        if section:
            previous = group[4]
            ranged = joined and re.search(r"to|\u2013|-", joined.group(0))
            if ranged and previous and previous[0] == nb:  # "§7 to §9", en dash too
                sections.update(
                    str(n) for n in range(int(previous[1]) + 1, int(section))
                )
            sections.add(section)
            group[4] = (nb, section)
    for start, end, parts, _, _ in groups:
        if parts:
            yield (
                start,
                end,
                Scope(tuple((nb, frozenset(s)) for nb, s in sorted(parts.items()))),
            )


def _scope_at(sentence: str, start: int, end: int, default: str | None) -> Scope | None:
    """What the phrase at ``sentence[start:end]`` is about: the references right
    after it ("three 2-node jobs in 03 §6"), else the last list of references
    before it in its sentence, else ``default`` (the notebook of the text, or the
    one its paragraph is about), else nothing."""
    groups = list(_ref_groups(sentence, default))
    for g_start, _, scope in groups:
        between = sentence[end:g_start]
        if g_start >= end and len(between) < 8 and _REF_AFTER.fullmatch(between + " "):
            return scope
    before = [scope for _, g_end, scope in groups if g_end <= start]
    if before:
        return before[-1]
    return Scope(((default, frozenset()),)) if default else None


def _sentences(prose: Prose, keep_paths: bool = False):
    """(first line, sentence, default notebook) of a text, code spans and fenced
    code removed (``keep_paths``: a code span that is only a path keeps its text):
    in a notebook's cell its notebook, in a doc the notebook its section or
    paragraph is about (see :func:`_sections`)."""
    if prose.notebook:
        parts = [(1, prose.text, prose.notebook)]
    else:
        parts = list(_sections(prose.text))
    for first, text, subject in parts:
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        if keep_paths:
            text = re.sub(r"`([\w.-]*/[\w./-]*)`", r"\1", text)
        for sentence in SENTENCE_END.split(re.sub(r"`[^`]*`", "", text)):
            yield first, " ".join(sentence.split()), subject


# ------------------------------------------------------ jobs a notebook submits
@dataclass(frozen=True)
class Submission:
    """One job a notebook's code submits to Slurm (see :func:`submissions`)."""

    notebook: str
    section: str  # the numbered section ("## 6. ...") its cell is in
    cell: str
    script: str  # "slurm/hello_ranks.sbatch", "--wrap", or the argument given
    nodes: int
    minutes: float | None  # its time limit; None where neither call nor script sets one
    fate: str  # "run", "cancelled" (scancel'ed while it runs) or "held" (never runs)


# A submission: a call of the workshop's submit helper, or sbatch run from a "!"
# line or by subprocess. sbatch --test-only creates no job, so it is none.
_SUBMIT_CALL = re.compile(r"(?<![\w.])(?:workshop\.cluster\.|cluster\.)?submit\(")
_SBATCH_SHELL = re.compile(r"^\s*(?:\w+(?:\[[^\]]*\])?\s*=\s*)?!\s*sbatch\b")
_SBATCH_PROCESS = re.compile(r"""subprocess\.\w+\(\s*\[\s*["']sbatch["']""")
_NODES = re.compile(r"(?<![\w-])(?:--nodes[= ]|nodes=|-N\s*)[\"']?(\d+)")
_TIME = re.compile(r"(?<![\w-])(?:--time[= ]|time=|-t\s*)[\"']?([\d:-]+)(?![\w{])")


def slurm_minutes(limit: str) -> float | None:
    """Slurm's ``--time`` in minutes: "MM", "MM:SS", "HH:MM:SS", "D-HH",
    "D-HH:MM", "D-HH:MM:SS"; None for anything else."""
    days, _, rest = limit.rpartition("-")
    if days and not days.isdigit():
        return None
    parts = rest.split(":")
    if not all(p.isdigit() for p in parts) or len(parts) > 3:
        return None
    values = [int(p) for p in parts]
    if days:
        hours, minutes, seconds = [*values, 0, 0][:3]
        return int(days) * 1440 + hours * 60 + minutes + seconds / 60
    if len(values) == 3:
        return values[0] * 60 + values[1] + values[2] / 60
    return values[0] + (values[1] / 60 if len(values) == 2 else 0)


def _statement(lines: list[str], i: int, start: int) -> str:
    """The text of the statement that begins at ``lines[i][start:]``: up to the
    bracket that closes the call, or to the end of a "\\"-continued line."""
    text, depth = "", 0
    for line in lines[i:]:
        part = line[start:] if not text else line
        text += part + "\n"
        depth += part.count("(") + part.count("[") - part.count(")") - part.count("]")
        if depth <= 0 and not part.rstrip().endswith("\\"):
            return text
        start = 0
    return text


def _loop_count(lines: list[str], i: int, cell: str) -> int:
    """How many times the loops around ``lines[i]`` run: each enclosing ``for`` must
    go over a literal list, tuple or ``range(N)``, or the count is unknowable."""
    import ast

    count, indent = 1, len(lines[i]) - len(lines[i].lstrip())
    for line in reversed(lines[:i]):
        if not line.strip() or len(line) - len(line.lstrip()) >= indent:
            continue
        indent = len(line) - len(line.lstrip())
        loop = re.match(r"\s*for\s+.+?\s+in\s+(.+?):\s*(?:#.*)?$", line)
        if not loop:
            continue
        over = loop[1].strip()
        ranged = re.fullmatch(r"range\((\d+)\)", over)
        try:
            count *= int(ranged[1]) if ranged else len(ast.literal_eval(over))
        except (ValueError, SyntaxError) as e:
            raise ValueError(
                f"cell {cell}: a job submitted in the loop {line.strip()!r}, over "
                "something that is not a literal list or range(N): the count of jobs "
                "cannot be read; loop over a literal, or teach submissions() the loop"
            ) from e
    return count


def _assignments(sources: list[str], name: str) -> list[str]:
    """The text of every assignment ``name = ...`` in ``sources``, last first."""
    found = []
    for source in sources:
        lines = source.splitlines()
        for i, line in enumerate(lines):
            m = re.match(rf"\s*{re.escape(name)}\s*=(?!=)", line)
            if m:
                found.append(_statement(lines, i, m.end()))
    return found[::-1]


def _names(statement: str) -> list[str]:
    """The Python names a statement passes on: ``{options}`` of a "!" line, the
    arguments of a call (``**small``, ``job.script``)."""
    names = re.findall(r"\{(\w+)", statement)
    call = (
        "(" + statement.partition("(")[2] if "!" not in statement.split("(")[0] else ""
    )
    names += re.findall(r"(?:\*\*|(?<=[(,\s]))([A-Za-z_]\w*)(?=[.,)\s]|$)", call)
    keywords = {"nodes", "time", "options", "True", "False", "None", "str", "int"}
    return [n for n in dict.fromkeys(names) if n not in keywords]


def _script_option(script: Path, pattern: re.Pattern) -> str | None:
    if not script.is_file():
        return None
    for line in script.read_text().splitlines():
        if line.startswith("#SBATCH"):
            m = pattern.search(line)
            if m:
                return m[1]
    return None


def submissions(folder: Path | None = None) -> list[Submission]:
    """Every job the notebooks' code cells submit, one per job (a submission in a
    loop over three items is three).

    The counting rule:

    - A submission is a call of ``workshop.cluster.submit`` (or of ``submit`` /
      ``cluster.submit``), an ``sbatch`` run from a ``!`` line, or ``sbatch`` run by
      ``subprocess``. ``sbatch --test-only`` creates no job and is not counted.
    - Inside ``for X in <literal>:`` it counts once per item (nested loops
      multiply); a loop over anything else is an error, not a guess.
    - Its fate: ``--hold`` is *held* (it never runs); a job whose variable a later
      line passes to ``scancel`` is *cancelled*; any other *runs*.
    - Its nodes: ``nodes=N`` or ``--nodes=N`` in the statement, else in the
      assignments of the names it passes on (``**small``, ``{options}``, ``job``
      of ``job.script``, one level further), else the script's ``#SBATCH --nodes``,
      else 1 (Slurm's default). Its time limit likewise (``--time``/``time=``),
      else None.
    """
    folder = folder or NOTEBOOKS
    found = []
    for path in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
        nb, section, earlier = path.name[:2], "", []
        cells = json.loads(path.read_text())["cells"]
        for index, cell in enumerate(cells):
            source = "".join(cell["source"])
            if cell["cell_type"] == "markdown":
                heading = re.findall(r"^#{1,3}\s+(\d+)\.\s", source, re.M)
                section = heading[-1] if heading else section
                continue
            if cell["cell_type"] != "code":
                continue
            later = "\n".join(
                "".join(c["source"]) for c in cells[index:] if c["cell_type"] == "code"
            )
            lines = source.splitlines()
            for i, line in enumerate(lines):
                call = _SUBMIT_CALL.search(line)
                shell = _SBATCH_SHELL.match(line) or _SBATCH_PROCESS.search(line)
                if line.lstrip().startswith("#") or not (call or shell):
                    continue
                statement = _statement(lines, i, (call or shell).start())
                if "--test-only" in statement:
                    continue
                target = re.match(r"\s*([A-Za-z_]\w*)(?:\[[^\]]*\])?\s*=", line)
                texts = [statement]
                for name in _names(statement):
                    for text in _assignments([*earlier, "\n".join(lines[:i])], name)[
                        :1
                    ]:
                        texts.append(text)
                        texts += [
                            t
                            for more in _names(text)
                            for t in _assignments(
                                [*earlier, "\n".join(lines[:i])], more
                            )[:1]
                        ]
                scripts = re.findall(r"[\w./-]+\.sbatch\b", " ".join(texts))
                script = scripts[0].removeprefix("../") if scripts else None
                nodes = next(
                    (m[1] for t in texts for m in [_NODES.search(t)] if m), None
                )
                limit = next(
                    (m[1] for t in texts for m in [_TIME.search(t)] if m), None
                )
                if script:
                    nodes = nodes or _script_option(ROOT / script, _NODES)
                    limit = limit or _script_option(ROOT / script, _TIME)
                if "--hold" in statement:
                    fate = "held"
                elif target and re.search(
                    rf"scancel\b[^\n]*(?:\{{{target[1]}\}}|\b{target[1]}\b)",
                    later.replace(statement, ""),
                ):
                    fate = "cancelled"
                else:
                    fate = "run"
                what = script or (
                    "--wrap" if "--wrap" in statement else statement.split("(")[1]
                )
                job = Submission(
                    nb,
                    section,
                    cell.get("id", ""),
                    what.split(",")[0].strip().strip("\"'"),
                    int(nodes or 1),
                    slurm_minutes(limit) if limit else None,
                    fate,
                )
                found += [job] * _loop_count(lines, i, job.cell)
            earlier.append(source)
    return found


# Counts of jobs: "four that run", "submits twelve more", "three 2-node jobs", "the
# two hybrid jobs", "six held ones". Only these qualifiers are understood; "two
# pending jobs" (what squeue shows at one moment) is not a count of submissions.
_JOB_QUALIFIER = (
    rf"more|other|batch|Slurm|held|cancelled|hybrid|hello|scaling|staging"
    rf"|train_ddp|(?:{_COUNT_NUM})-node"
)
JOB_COUNT = re.compile(
    rf"\b(?P<n>{_COUNT_NUM})\s+(?P<qual>(?:(?:{_JOB_QUALIFIER})\s+){{0,2}})"
    r"(?P<noun>jobs?|ones)\b(?P<run>\s+that\s+run\b)?"
    rf"|\b(?P<n_run>{_COUNT_NUM})\s+that\s+run\b"
    rf"|\bsubmits?\s+(?P<n_more>{_COUNT_NUM})\s+more\b",
    re.IGNORECASE,
)
# The nodes of a named job: "hello on 2 nodes", "slurm/stage_data.sbatch: 1 node".
JOB_NODES = re.compile(
    r"\b(?P<name>hello|hybrid|train_ddp|scaling|stage_data|slurm/[\w.-]+\.sbatch)"
    rf"(?:\s+jobs?)?(?:\s*:\s*|\s+(?:on|asks(?:\s+for)?)\s+)(?P<n>{_COUNT_NUM})"
    r"\s+nodes?\b"
)
# Job phrases the rules above match but cannot check, with why: (file, phrase).
JOBS_NOT_CHECKED = {
    ("benchmarks.md", "40 hello jobs"): "a stress test of the test suite's own, run "
    "outside the notebooks; its log is the record",
}


def _is_job_of(job: Submission, name: str) -> bool:
    stem = Path(job.script).stem
    return job.script == name or stem == name or stem.startswith(name + "_")


def job_count_phrases(doc: Path | Prose):
    """(where, phrase, scope, filter description, predicate, claimed) of every count
    of jobs in ``doc`` that a rule of :data:`JOB_COUNT` reads."""
    prose = _as_prose(doc)
    for first, sentence, subject in _sentences(prose):
        for m in JOB_COUNT.finditer(sentence):
            if m["noun"] and m["noun"].lower() == "ones" and not m["qual"]:
                continue  # "the ones" of anything: only "held ones" is about jobs
            if (prose_key(prose), m.group(0)) in JOBS_NOT_CHECKED:
                continue
            words = (m["qual"] or "").lower().split()
            plain = not m["n_run"] and not m["run"] and not m["n_more"]
            plain = plain and set(words) <= {"batch", "slurm", "other", "more"}
            # "two jobs never mix", "submit one job": a plain count of jobs is one
            # of a notebook's submissions only in a sentence about submitting some.
            if plain and (m["noun"] != "jobs" or not re.search(r"\bsubmit", sentence)):
                continue
            scope = _scope_at(sentence, m.start(), m.end(), subject)
            if scope is None:
                continue  # about no notebook: a site's jobs, the hub's
            fate = "run" if m["n_run"] or m["run"] else None
            size = name = None
            kind = "jobs that run" if fate else "jobs"
            for word in words:
                if word in ("held", "cancelled"):
                    fate, kind = word, f"{word} jobs"
                elif word.endswith("-node"):
                    size = _number(word.removesuffix("-node"))
                    kind = f"{size}-node jobs"
                elif word in ("hybrid", "hello", "scaling", "train_ddp", "staging"):
                    name = "stage_data" if word == "staging" else word
                    kind = f"{word} jobs"

            def test(job: Submission, fate=fate, size=size, name=name) -> bool:
                return (
                    (fate is None or job.fate == fate)
                    and (size is None or job.nodes == size)
                    and (name is None or _is_job_of(job, name))
                )

            claimed = _number(m["n"] or m["n_run"] or m["n_more"])
            yield f"{prose.name}:{first}", m.group(0), scope, kind, test, claimed


def wrong_job_counts(doc: Path | Prose, jobs: list[Submission]) -> list[str]:
    """Counts of jobs, and nodes of named jobs, that are not what the notebooks'
    code submits (see :func:`submissions` for how they are counted)."""
    problems = []
    for where, phrase, scope, kind, test, claimed in job_count_phrases(doc):
        found = [j for j in jobs if scope.holds(j.notebook, j.section) and test(j)]
        if len(found) != claimed:
            problems.append(
                f"{where}: {phrase!r} says {claimed} {kind} in {scope}, but its code "
                f"submits {len(found)} ({', '.join(_job_names(found)) or 'none'})"
            )
    prose = _as_prose(doc)
    for first, sentence, subject in _sentences(prose):
        for m in JOB_NODES.finditer(sentence):
            scope = _scope_at(sentence, m.start(), m.end(), subject)
            if scope is None:
                continue
            found = [
                j
                for j in jobs
                if scope.holds(j.notebook, j.section) and _is_job_of(j, m["name"])
            ]
            sizes = sorted({j.nodes for j in found})
            if sizes != [_number(m["n"])]:
                problems.append(
                    f"{prose.name}:{first}: {m.group(0)!r} says {m['name']} asks for "
                    f"{_number(m['n'])} node(s) in {scope}, but its code asks for "
                    f"{sizes or 'no such job'}"
                )
    return problems


def _job_names(jobs: list[Submission]) -> list[str]:
    names: dict[str, int] = {}
    for job in jobs:
        key = f"{job.notebook} §{job.section} {Path(job.script).stem} ({job.fate})"
        names[key] = names.get(key, 0) + 1
    return [f"{n} x {k}" if n > 1 else k for k, n in names.items()]


# ------------------------------------------------- files: their lines, a folder's
# "a four-line script, `slurm/local_rank.py`", "the 40-line script
# slurm/ddp_minimal.py", "`slurm/ddp_minimal.py` (about 80 lines": a file's lines.
_PATH = r"(?:\.\./)?(?:slurm|scripts|workshop|tests|docs|notebooks)/[\w./-]+\.\w+"
FILE_LINES = re.compile(
    rf"(?P<about>\babout\s+)?\b(?P<n>{_COUNT_NUM})-line\s+(?:[a-z]+,?\s+){{0,2}}?"
    rf"(?P<path>{_PATH})|(?P<path2>{_PATH})\s*\((?P<about2>about\s+)?"
    rf"(?P<n2>{_COUNT_NUM})\s+lines\b",
    re.IGNORECASE,
)
# "the seven scripts in slurm/", "the eight batch scripts in `slurm/`": a folder's
# files of that kind.
FOLDER_COUNT = re.compile(
    rf"\b(?P<n>{_COUNT_NUM})\s+(?P<kind>batch scripts|scripts|notebooks|modules|files)"
    r"\s+(?:in|under)\s+`?(?P<folder>(?:slurm|scripts|workshop|tests|docs|notebooks)"
    r"(?:/\w[\w.-]*)*)/?`?",
    re.IGNORECASE,
)
_KINDS = {
    "batch scripts": ("*.sbatch",),
    "scripts": ("*.sbatch", "*.py", "*.sh"),
    "notebooks": ("*.ipynb",),
    "modules": ("*.py",),
    "files": ("*",),
}


def _file_lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def _folder_files(folder: Path, kind: str) -> list[Path]:
    return sorted(
        {p for pattern in _KINDS[kind.lower()] for p in folder.glob(pattern)}
        - {p for p in folder.glob("*") if not p.is_file()}
    )


def wrong_file_counts(doc: Path | Prose) -> list[str]:
    """Lines of a named file, and files of a named folder, that are not what the
    file or the folder holds. "about N" lines is right within a tenth of N (at
    least 2); a plain count must be exact."""
    prose = _as_prose(doc)
    problems = []
    for first, sentence, _ in _sentences(prose, keep_paths=True):
        for m in FILE_LINES.finditer(sentence):
            named = m["path"] or m["path2"]
            path = ROOT / named.removeprefix("../")
            claimed = _number(m["n"] or m["n2"])
            if not path.is_file():
                problems.append(
                    f"{prose.name}:{first}: {m.group(0)!r} names {named}, which "
                    "does not exist"
                )
                continue
            lines = _file_lines(path)
            slack = max(2, claimed // 10) if (m["about"] or m["about2"]) else 0
            if abs(lines - claimed) > slack:
                problems.append(
                    f"{prose.name}:{first}: {m.group(0)!r} says {claimed} lines, but "
                    f"{named} has {lines}"
                )
        for m in FOLDER_COUNT.finditer(sentence):
            folder = ROOT / m["folder"]
            files = _folder_files(folder, m["kind"]) if folder.is_dir() else []
            if len(files) != _number(m["n"]):
                problems.append(
                    f"{prose.name}:{first}: {m.group(0)!r} says {_number(m['n'])} "
                    f"{m['kind']}, but {m['folder']}/ holds {len(files)}"
                    f" ({', '.join(p.name for p in files)})"
                )
    return problems


# A table that lists a folder: "The batch scripts in `slurm/` ...:" then a table whose
# first column names each file. Every file of that kind in the folder must be a row.
LISTED_FOLDER = re.compile(
    r"^[^\n|]*?\b(?P<kind>batch scripts|scripts|notebooks|modules)\s+in\s+`(?P<folder>"
    r"[\w/.-]+?)/?`[^\n]*(?:\n[^\n|]+)*\n\n(?P<table>(?:\|[^\n]*\n?)+)",
    re.MULTILINE,
)


def unlisted_files(doc: Path | Prose) -> list[str]:
    """Files of a folder that a table introduced as listing that folder leaves out
    (or lists though they are not there)."""
    prose = _as_prose(doc)
    problems = []
    for m in LISTED_FOLDER.finditer(prose.text):
        folder = ROOT / m["folder"]
        rows = re.findall(r"^\|\s*`?([\w.-]+)`?\s*\|", m["table"], re.M)
        listed = {r for r in rows if "." in r}
        there = {p.name for p in _folder_files(folder, m["kind"])}
        line = prose.text[: m.start()].count("\n") + 1
        if listed != there:
            problems.append(
                f"{prose.name}:{line}: the table of the {m['kind']} in {m['folder']}/ "
                f"lacks {sorted(there - listed)} and lists {sorted(listed - there)} "
                "that are not there"
            )
    return problems


# ------------------------------------------------------------------ pointers
# "see the top of this file", "(at the top of [notebooks.md](notebooks.md))".
TOP_OF = re.compile(
    r"\b(?:see\s+|at\s+)?the\s+top\s+of\s+(?:(?P<this>this\s+(?:file|page|script))"
    r"|\[[^\]]*\]\((?P<link>[^)#\s]+)\)|`?(?P<code>(?:\.\./)?[\w.-]+/[\w./-]*\w)`?)"
)
# "the next cell", "the cell below", "the cell before", "the previous cell".
ADJACENT = re.compile(
    r"\bthe\s+(?:(?P<before>previous|preceding|next|following)\s+cell"
    r"|cell\s+(?P<after>below|above|before|after))\b",
    re.IGNORECASE,
)
_DOWN = {"next", "following", "below", "after"}


def _notebook_cells(notebook: str) -> list[dict]:
    path = next(NOTEBOOKS.glob(f"{notebook}_*.ipynb"))
    return json.loads(path.read_text())["cells"]


def _top(path: Path) -> str:
    """What a reader finds at the top of a file: a Markdown page's text before its
    second heading; a script's opening comment or docstring."""
    text = path.read_text()
    if path.suffix == ".md":
        body = re.sub(r"```.*?```", "", text, flags=re.S)
        headings = [m.start() for m in re.finditer(r"^#{1,6} ", body, re.M)]
        return body[: headings[1]] if len(headings) > 1 else body
    lines = text.splitlines()
    top = []
    for line in lines[1:] if lines and lines[0].startswith("#!") else lines:
        if line.startswith("#") or (top and top[0].startswith('"""')):
            top.append(line)
            if top[0].startswith('"""') and len(top) > 1 and line.endswith('"""'):
                break
        elif line.startswith('"""'):
            top.append(line)
            if line.count('"""') == 2:
                break
        else:
            break
    return "\n".join(top)


def _section_numbers(notebook: str) -> set[str]:
    """The numbers of a notebook's sections: "6" of "## 6. Slurm", "6.1" of
    "### 6.1 What the waiting rank sees"."""
    found = set()
    for cell in _notebook_cells(notebook):
        if cell["cell_type"] == "markdown":
            found |= set(
                re.findall(
                    r"^#{1,6}\s+(\d+(?:\.\d+)?)\.?\s", "".join(cell["source"]), re.M
                )
            )
    return found


def broken_pointers(doc: Path | Prose) -> list[str]:
    """Pointers that lead nowhere: "the top of" a file whose top does not hold the
    figures the sentence quotes (or that has no top: no opening text, comment or
    docstring); a section "§N" or "section N" of a notebook's own text that its
    notebook lacks (docs' "03 §6" are test_docs.py's); "the next cell" or "the cell
    before" in a notebook whose neighbour that way is no code cell; and a link of a
    notebook's markdown to a file or a heading that does not exist (docs' links are
    test_docs.py's)."""
    prose = _as_prose(doc)
    problems = []
    base = NOTEBOOKS if prose.notebook else DOCS
    for first, sentence, _ in _sentences(prose, keep_paths=True):
        for m in TOP_OF.finditer(sentence):
            if m["this"]:
                target = ROOT / prose.name if prose.name == "README.md" else None
                target = target or (None if prose.notebook else DOCS / prose.name)
            else:
                name = m["link"] or m["code"]
                target = (
                    (base / name).resolve()
                    if m["link"]
                    else ROOT / name.removeprefix("../")
                )
            if target is None:
                continue  # "the top of this notebook": its title cell is always there
            if not target.is_file():
                problems.append(
                    f"{prose.name}:{first}: {m.group(0)!r} points at {target.name}, "
                    "which does not exist"
                )
                continue
            top = _top(target)
            figures = [f for f, _, _ in _figures(sentence[: m.start()])]
            missing = [f for f in figures if not holds(top, f)]
            if not top.strip() or missing:
                shown = target.resolve()
                if shown.is_relative_to(ROOT.resolve()):
                    shown = shown.relative_to(ROOT.resolve())
                problems.append(
                    f"{prose.name}:{first}: {m.group(0)!r}, but the top of {shown} "
                    + (
                        f"does not hold {', '.join(missing)}"
                        if top.strip()
                        else "has no opening comment or text"
                    )
                )
        if not prose.notebook:
            continue
        for _start, _end, scope in _ref_groups(sentence, prose.notebook):
            for nb, sections in scope.parts:
                lacking = sorted(sections - _section_numbers(nb), key=float)
                if lacking:
                    problems.append(
                        f"{prose.name}: {sentence[:60]!r} cites section(s) "
                        f"{', '.join(lacking)} of notebook {nb}, which has "
                        f"{sorted(_section_numbers(nb), key=float)}"
                    )
    if prose.notebook:
        problems += _neighbour_problems(prose) + _link_problems(prose)
    return problems


def _neighbour_problems(prose: Prose) -> list[str]:
    cells = _notebook_cells(prose.notebook)
    cell_id = prose.name.rpartition(" cell ")[2]
    index = next((i for i, c in enumerate(cells) if c.get("id") == cell_id), None)
    if index is None:
        return []
    problems = []
    text = re.sub(r"```.*?```", "", prose.text, flags=re.S)
    for m in ADJACENT.finditer(text):
        down = (m["before"] or m["after"]).lower() in _DOWN
        near = index + 1 if down else index - 1
        said = m.group(0)
        if not 0 <= near < len(cells) or cells[near]["cell_type"] != "code":
            kind = cells[near]["cell_type"] if 0 <= near < len(cells) else "nothing"
            problems.append(
                f"{prose.name}: {said!r} points at the {'next' if down else 'previous'}"
                f" cell, which is a {kind} cell, not code"
            )
            continue
        # What the sentence says the cell does, where it says "prints" or "draws".
        rest = text[m.end() : m.end() + 80].split(".")[0]
        source = "".join(cells[near]["source"])
        outputs = cells[near].get("outputs", [])
        if re.search(r"\bdraws\b", rest) and not (
            any("image/png" in o.get("data", {}) for o in outputs)
            or re.search(r"\b(?:draw|plot)\w*\(", source)
        ):
            problems.append(
                f"{prose.name}: {said!r} draws, but cell {cells[near].get('id')} "
                "draws nothing"
            )
        if re.search(r"\bprints\b", rest) and "print" not in source and not outputs:
            problems.append(
                f"{prose.name}: {said!r} prints, but cell {cells[near].get('id')} "
                "prints nothing"
            )
    return problems


# An explicit anchor, alone on its line above a heading (docs/glossary.md's). A
# notebook is read in JupyterLab, which scrolls a Markdown page to a link's #name where
# an element has that id (its sanitizer keeps it as data-jupyter-id, where it looks);
# it names headings by their text ("DDP", "Slurm-job-step"), not by a git host's
# lower-case slug. A git host keeps the id too (user-content-NAME) and scrolls to
# #NAME, so one such anchor lands in both.
EXPLICIT_ANCHOR = re.compile(r'^<a id="([^"]+)"></a>$', re.M)


def _link_problems(prose: Prose) -> list[str]:
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", prose.text)):
        if target.startswith(("http://", "https://", "#", "mailto:")):
            continue
        name, _, anchor = target.partition("#")
        path = (NOTEBOOKS / name).resolve()
        if not path.exists():
            problems.append(f"{prose.name}: links to {target}: no such file")
        elif anchor and path.suffix == ".md":
            body = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
            if anchor not in EXPLICIT_ANCHOR.findall(body):
                problems.append(
                    f"{prose.name}: links to {target}: {name} has no "
                    f'<a id="{anchor}"></a> line, the anchor that JupyterLab '
                    "and a git host both scroll to"
                )
    return problems
