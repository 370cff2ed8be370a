"""docs/instructor.md, docs/glossary.md and docs/portal.md against the project they
describe.

Every notebook section they cite ("02 §5", "03 §6 *Slurm: batch jobs*") is a heading
of that notebook; every link, `make` target, file path, ``workshop.<name>``,
``python -m workshop`` command and exercise name exists; the glossary has a heading
for each term the notebooks rely on, listed by anchor at its top, each with an
explicit anchor that every link to the glossary names; the schedules'
times follow each other and add up to the totals their headings state; and the
guide's snippet that prints the quiz answers runs and prints them all.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT
from prose_figures import EXPLICIT_ANCHOR

import workshop
from workshop.lessons.exercises import EXERCISES

DOCS = ROOT / "docs"
GUIDE = DOCS / "instructor.md"
GLOSSARY = DOCS / "glossary.md"
PORTAL = DOCS / "portal.md"
ARCHITECTURE = DOCS / "architecture.md"
README = ROOT / "README.md"
# Every page of the project's text: its links, paths, names and sections are checked.
PAGES = (README, *sorted(DOCS.glob("*.md")))

# Terms the notebooks and the other docs link to: their anchors must exist.
REQUIRED_TERMS = (
    "rank",
    "local-rank",
    "world-size",
    "node-rank",
    "backend",
    "process-group",
    "collective",
    "rendezvous",
    "bucket",
    "bus-bandwidth",
    "bubble",
    "shard",
    "all-reduce",
    "ring-all-reduce",
    "ddp",
    "nccl",
    "gloo",
    "torchrun",
    "slurm-job",
    "slurm-job-step",
    "slurm-task",
    "micro-batch",
    "tensor-parallelism",
    "pipeline-parallelism",
    "zero",
    "fsdp",
    "parameter-server",
    "straggler",
    "staging",
)

# "02 §5", "02 §7 to §9", "05 §1, §3 and §5": a notebook and one or more sections.
_SECTION = r"§\d+(?:\.\d+)?"
SECTION_REF = re.compile(
    rf"(?<![\d:.])(0[1-9]) ({_SECTION}(?:(?:, and |, | and | to ){_SECTION})*)"
)
# "03 §6 *Slurm: batch jobs*" or "03 *Quiz*": a section named by its heading.
TITLED_REF = re.compile(r"(?<![\d:.])(0[1-9])(?: §(\d+(?:\.\d+)?))? \*([^*\n]+)\*")
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`]+)`")
# A fenced block, also indented inside a list item.
FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.S | re.M)
WORKSHOP_NAME = re.compile(r"\bworkshop((?:\.[A-Za-z_]\w*)+)")
PROJECT_PATH = re.compile(
    r"(?<![\w/.$-])((?:slurm|scripts|workshop|docs|notebooks|tests)/[\w.-]+"
    r"(?:/[\w.-]+)*)"
)
MAKE_TARGET = re.compile(r"\bmake\s+([a-z][\w-]*)")
EXERCISE = re.compile(r"\b0\d\.[a-z][a-z0-9_]*\b")


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _code(text: str) -> list[str]:
    """The inline code spans and fenced blocks of a markdown text."""
    blocks = FENCE.findall(text)
    rest = FENCE.sub("", text)
    return blocks + CODE_SPAN.findall(rest)


def _slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _md_anchors(page: Path) -> list[str]:
    text = FENCE.sub("", _text(page))
    return [_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.M)]


def _notebook(number: str) -> Path:
    found = sorted((ROOT / "notebooks").glob(f"{number}_*.ipynb"))
    assert found, f"no notebook {number}_*.ipynb in notebooks/"
    return found[0]


def _headings(number: str) -> list[str]:
    """The markdown headings of notebook ``number``, without their #s."""
    cells = json.loads(_notebook(number).read_text(encoding="utf-8"))["cells"]
    heads = []
    for cell in cells:
        if cell["cell_type"] == "markdown":
            source = "".join(cell["source"])
            heads += re.findall(r"^#{1,6} (.+?)\s*$", source, re.M)
    return heads


def _sections(number: str) -> dict[str, str]:
    """Numbered headings of a notebook: {"5": "The ring all-reduce", "6.1": ...}."""
    numbered = {}
    for head in _headings(number):
        match = re.match(r"(\d+(?:\.\d+)?)\.? (.+)$", head)
        if match:
            numbered[match.group(1)] = match.group(2)
    return numbered


def _explicit_anchors(page: Path) -> list[str]:
    """The ``<a id="NAME"></a>`` lines of a page (prose_figures.EXPLICIT_ANCHOR says
    why links to the glossary use them)."""
    return EXPLICIT_ANCHOR.findall(FENCE.sub("", _text(page)))


def _glossary_headings() -> list[tuple[str | None, str, str]]:
    """Each glossary heading: the explicit anchor on the line above it (None if
    there is none), its text, and the text under it."""
    parts = re.split(
        r'^(?:<a id="([^"]*)"></a>\n)?## (.+)$', _text(GLOSSARY), flags=re.M
    )
    return [tuple(parts[i : i + 3]) for i in range(1, len(parts), 3)]


def _glossary_entries() -> dict[str, str]:
    """Each glossary heading's anchor and the text under it."""
    return {_slug(heading): body for _, heading, body in _glossary_headings()}


# ------------------------------------------------------------------ the glossary
def test_glossary_has_a_heading_for_every_required_term():
    entries = _glossary_entries()
    missing = [term for term in REQUIRED_TERMS if term not in entries]
    assert not missing, f"glossary.md has no '## ' heading for {missing}"


def test_every_glossary_heading_has_an_explicit_anchor_named_as_a_git_host_would():
    # The anchor JupyterLab scrolls to; named as a git host names the heading, so a
    # renderer that dropped it would still land there, and nothing else bears one.
    headings = _glossary_headings()
    assert len(headings) >= len(REQUIRED_TERMS)
    for anchor, heading, _ in headings:
        assert anchor == _slug(heading), (
            f'glossary.md: write <a id="{_slug(heading)}"></a> alone on the line '
            f"above '## {heading}' (found {anchor!r})"
        )
    explicit = _explicit_anchors(GLOSSARY)
    assert sorted(explicit) == sorted(a for a, _, _ in headings), (
        "glossary.md: an explicit anchor that is not above a heading, or one twice"
    )


def test_glossary_anchor_list_is_every_heading_in_order():
    text = _text(GLOSSARY)
    top = text[: text.index("\n## ")]
    listed = re.findall(r"\]\(#([\w-]+)\)", top)
    headings = list(_glossary_entries())
    assert listed == headings, "the anchor list at the top must name every heading"
    assert listed == sorted(listed), "keep the glossary alphabetical"


def test_every_glossary_entry_is_short_and_says_where_it_is_taught():
    for anchor, body in _glossary_entries().items():
        words = len(body.split())
        assert 10 <= words <= 90, (
            f"glossary #{anchor}: {words} words; keep 1-3 sentences"
        )
        assert SECTION_REF.search(body), (
            f"glossary #{anchor} cites no notebook section (write e.g. '02 §5')"
        )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_section_named_by_title_has_that_heading(page):
    named = TITLED_REF.findall(_text(page))
    if page == GUIDE:
        assert len(named) > 40, "the schedules name their sections by heading"
    for number, section, title in named:
        if section:
            actual = _sections(number).get(section)
            assert actual == title, (
                f"{page.name}: {number} §{section} is headed {actual!r}, not {title!r}"
            )
        else:
            assert title in _headings(number), (
                f"{page.name}: notebook {number} has no heading {title!r}"
            )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_leads_to_a_file_and_anchor_that_exist(page):
    links = LINK.findall(_text(page))
    assert links, f"{page.name} links nowhere"
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{page.name} links to {link}: no such file"
        if anchor:
            assert path.suffix == ".md", f"{page.name}: anchor on a non-markdown {link}"
            assert anchor in _md_anchors(path), f"{page.name}: no heading for {link}"
        if anchor and path == GLOSSARY:
            # Also read in JupyterLab (the notebooks link here), which does not
            # scroll to a git host's heading names; the notebooks' links are
            # prose_figures.py's.
            assert anchor in _explicit_anchors(GLOSSARY), (
                f'{page.name} links to {link}: glossary.md has no <a id="{anchor}">'
                "</a> line, the anchor that JupyterLab and a git host both scroll to"
            )


def test_the_guide_links_every_notebook_and_the_glossary():
    links = {link.split("#")[0] for link in LINK.findall(_text(GUIDE))}
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    for notebook in notebooks:
        assert f"../notebooks/{notebook.name}" in links, f"no link to {notebook.name}"
    assert "glossary.md" in links
    assert "portal.md" in links


def test_the_portal_guide_keeps_its_private_portal_section():
    assert "try-it-here-a-private-portal" in _md_anchors(PORTAL)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_project_path_in_code_exists(page):
    # What a command is told to write (``--out PREFIX``) need not exist yet.
    paths = {
        found.rstrip(".")
        for code in _code(_text(page))
        for found in PROJECT_PATH.findall(re.sub(r"--out[ =]\S+", "", code))
    }
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"{page.name} names files that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_workshop_name_exists(page):
    for dotted in sorted(set(WORKSHOP_NAME.findall(_text(page)))):
        parts = dotted.strip(".").split(".")
        # The longest importable module prefix, then attributes.
        obj, rest = workshop, parts
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module("workshop." + ".".join(parts[:i]))
            except ModuleNotFoundError as error:
                # A module of an extra (the board: jupyterhub) where the extra is
                # not installed, as on a GPU node: its file is there, its names
                # cannot be read here.
                source = ROOT.joinpath("workshop", *parts[:i]).with_suffix(".py")
                if not str(error.name).startswith("workshop") and source.is_file():
                    rest = []
                    break
                continue
            except ImportError:
                continue
            rest = parts[i:]
            break
        for name in rest:
            assert hasattr(obj, name), f"{page.name}: workshop{dotted} does not exist"
            obj = getattr(obj, name)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_every_make_target_in_the_guide_exists():
    targets = {t for code in _code(_text(GUIDE)) for t in MAKE_TARGET.findall(code)}
    assert {"check-node", "wheelhouse"} <= targets
    for target in sorted(targets):
        done = subprocess.run(
            ["make", "-n", target],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"make -n {target}: {done.stderr.strip()}"


def test_the_guide_names_exactly_the_exercises_there_are():
    named = {e for code in _code(_text(GUIDE)) for e in EXERCISE.findall(code)}
    assert named == set(EXERCISES), (
        f"in the guide, not in the package: {sorted(named - set(EXERCISES))}; "
        f"in the package, not in the guide: {sorted(set(EXERCISES) - named)}"
    )
    stated = re.search(r"There are (\d+) exercises", _text(GUIDE))
    assert stated and int(stated.group(1)) == len(EXERCISES)


# ------------------------------------------------------------------ schedules
def _minutes(clock: str) -> int:
    hours, minutes = clock.split(":")
    return int(hours) * 60 + int(minutes)


def _schedule(title: str) -> tuple[float, int, list[list[str]]]:
    """The hours and minutes a schedule's heading states, and its table's rows."""
    text = _text(GUIDE)
    head = re.search(
        rf"^### {title}: ([\d.]+) h \((\d+) min\)\n(.*?)(?=^#)", text, re.M | re.S
    )
    assert head, f"no '### {title}: H h (M min)' section in instructor.md"
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in head.group(3).splitlines()
        if re.match(r"\| \d\d:\d\d \|", line)
    ]
    return float(head.group(1)), int(head.group(2)), rows


@pytest.mark.parametrize("title, about_hours", [("Half day", 3.5), ("Full day", 6.5)])
def test_a_schedule_runs_on_and_adds_up_to_its_stated_total(title, about_hours):
    hours, total, rows = _schedule(title)
    assert hours == about_hours and total == round(hours * 60)
    assert len(rows) >= 10
    counted = 0
    for row, following in zip(rows, [*rows[1:], None], strict=True):
        start, length, section = _minutes(row[0]), int(row[1]), row[2]
        if following is not None:
            assert start + length == _minutes(following[0]), (
                f"{title}: {row[0]} + {length} min is not {following[0]}"
            )
        if not section.startswith("Lunch"):
            counted += length
    assert counted == total, f"{title}: the rows add up to {counted}, not {total} min"
    breaks = [row for row in rows if row[2] == "Break"]
    assert breaks, f"{title} has no break"
    for row in rows:
        if row[2] != "Break" and not row[2].startswith("Lunch"):
            assert TITLED_REF.search(row[2]), f"{title}: {row[2]!r} names no section"


def test_the_led_times_add_up_to_what_the_guide_says():
    text = _text(GUIDE)
    led = 0
    for line in text.splitlines():
        # "105 min", "2 h" or "2 h 20 min"
        match = re.match(
            r"\| \[0\d [^]]+\]\([^)]+\) \| (?:(\d+) h)? ?(?:(\d+) min)? \|", line
        )
        if match and (match.group(1) or match.group(2)):
            led += int(match.group(1) or 0) * 60 + int(match.group(2) or 0)
    # "about 9 h 35 min", or "about 10 h" on the hour
    stated = re.search(r"led times add up to about (\d+)\s+h(?:\s+(\d+)\s+min)?", text)
    assert stated, "the guide states the led times' total"
    assert led == int(stated.group(1)) * 60 + int(stated.group(2) or 0)


def test_the_notebook_times_are_printed_once_from_the_recordings():
    # docs/notebooks.md's table is printed from the notebooks' recordings
    # (scripts/record.py, tests/test_recording.py): "| 01 | 51 s | ...". A time typed
    # anywhere else goes stale at the next recording, so the instructor's guide
    # points at that table instead of copying its column.
    page = (DOCS / "notebooks.md").read_text(encoding="utf-8")
    measured = dict(re.findall(r"^\| (0\d) \| (\d+(?:\.\d)?) s \|", page, re.M))
    assert len(measured) == 5, (
        "docs/notebooks.md's table gives no time for some notebooks: record them "
        "(make record)"
    )
    guide = _text(GUIDE)
    copied = re.findall(r"^\| \[0\d [^\n]*\| \d+(?:\.\d)? s \|$", guide, re.M)
    assert not copied, f"docs/instructor.md copies notebook times: {copied}"
    assert "(notebooks.md)" in guide.split("## ")[0], (
        "docs/instructor.md's opening points at docs/notebooks.md's table of times"
    )


def test_the_readme_starts_with_the_two_commands_and_stays_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail to docs/"
    first_screen = "\n".join(lines[:40])
    blocks = FENCE.findall(first_screen + "\n")
    assert any(
        re.search(r"^make lab\b", b, re.M) and re.search(r"^make test\b", b, re.M)
        for b in blocks
    ), "the two commands, make lab and make test, in a code block of the first 40 lines"
    text = "\n".join(lines)
    for target in ("test-notebooks", "test-cpus"):
        assert f"make {target}" in text
    # Every page of docs/ is reachable from the README.
    linked = set(LINK.findall(text))
    assert {f"docs/{p.name}" for p in DOCS.glob("*.md")} <= linked
