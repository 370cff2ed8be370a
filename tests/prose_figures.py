"""What the prose claims about the notebooks' stored outputs, checked against them.

The prose is README.md, every Markdown file under docs/ and every markdown cell of
the notebooks. Four kinds of claim are checked:

1. **A figure linked to a cell.** A figure quoted from a stored output is written as
   a link whose title names the cell by its id, so a reader can find it and this
   check can read it::

       [x10.2](../notebooks/01_single_node_multi_gpu.ipynb "cell 5f1c2a9e")

   Every number of the link text must be in the cell's output. After a colon the
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
_COUNT_NUM = rf"(?:{'|'.join(WORDS)}|[1-9]\d*)"
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
            return ["the link text quotes no number"]
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
                if said != right:
                    whose = f"notebook {about}" if about else "all the notebooks"
                    problems.append(
                        f"{prose.name}:{first}: {m.group(0)!r} but {whose} "
                        f"{'has' if about else 'have'} {' to '.join(map(str, right))} "
                        f"{kind}"
                    )
    return problems


def _number(word: str) -> int:
    return int(word) if word.isdigit() else WORDS.index(word.lower()) + 1


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
    # notebook 04
    ("04", "9"): DERIVED + ": NVLink's 450 GB/s over the NIC's 50, both printed by "
    "the cell",
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
    ("benchmarks.md", "41.0"): RUN_TIME + " (make test-site, notebook 01's cell 15; "
    "04's published-runs table prints a 41.0% of Meta's by coincidence)",
    ("benchmarks.md", "16.3"): RUN_TIME,
    ("benchmarks.md", "19.0"): RUN_TIME,
    ("benchmarks.md", "36.4"): RUN_TIME,
    ("benchmarks.md", "39.5"): RUN_TIME,
    ("benchmarks.md", "1.4"): "CPU-seconds a fresh rank spent importing torch._dynamo, "
    "measured beside the suite (notebook 01's 1.4 is another figure)",
    ("benchmarks.md", "2.4"): DERIVED + ": alpha on 4 ranks / on 2, 1083 / 455 us",
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
