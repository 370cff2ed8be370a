"""The package's architecture, read from its imports: one wing (subpackage) per concern,
each importing only the wings below it, so that the tree reads as the design.

Every ``import`` is counted, those inside functions and under ``TYPE_CHECKING`` too: a
lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "workshop"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"

# The modules at the top of workshop/ that every wing may read.
BASE = {
    "env",
    "allocation",
    "features",
    "_procs",
    "_version",
    "_exports",
    "_cli",
    "checks",
    "_house",
}
# What sits above every wing: the public API, the commands, and the gallery (which
# runs examples to draw them).
TOP = {"", "__main__", "gallery"}
# Each wing and the wings it may import, lowest first. "base" is BASE above.
ALLOWED = {
    "sources": {"base"},
    "comm": {"base"},
    "draw": {"base", "comm"},
    "ranks": {"base", "comm"},
    "cluster": {"base", "ranks"},
    "training": {"base", "ranks"},
    "planner": {"base", "sources", "comm", "draw", "ranks", "training"},
    "parallel": {"base", "comm", "training", "planner"},
    "lessons": {
        "base",
        "sources",
        "comm",
        "draw",
        "ranks",
        "training",
        "planner",
        "parallel",
    },
    "bench": {"base", "sources", "comm", "draw", "ranks", "training"},
    "machine": {"base", "sources", "comm", "draw", "ranks", "training", "bench"},
    "instructor": {
        "base",
        "sources",
        "comm",
        "draw",
        "ranks",
        "cluster",
        "training",
        "bench",
        "machine",
    },
}
# One concern per module, split by concept and never to meet a length: a 500-line
# module with one concern beats two halves that must be read together. Past about 600
# lines a module holds more than one concern. A module a learner opens beside notebook
# 04 (parallel/) stays small enough to read in one sitting, as picotron's are.
MAX_LINES = 620
MAX_LESSON_LINES = 420


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """``workshop/ranks/launcher.py`` -> ``ranks.launcher``; the package is ""."""
    parts = list(path.relative_to(package).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def wing_of(module: str) -> str:
    """The wing a module belongs to: its subpackage, "base" or "top"."""
    if module in TOP:
        return "top"
    if module in BASE:
        return "base"
    head = module.split(".")[0]
    if head not in ALLOWED:
        raise AssertionError(
            f"workshop/{module.replace('.', '/')}.py belongs to no wing; put it in one "
            f"of {sorted(ALLOWED)}, or add it to BASE or TOP in this test"
        )
    return head


def imported_modules(source: str, module: str, is_package: bool) -> set[str]:
    """The package's own modules that ``source`` (module ``module``) imports."""
    here = module.split(".") if module else []
    if not is_package:
        here = here[:-1]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module == "workshop" or (node.module or "").startswith(
                "workshop."
            ):
                target = node.module.removeprefix("workshop").lstrip(".")
            else:
                continue
            # "from . import sweep" imports a module; "from .env import X" does not.
            names = [f"{target}.{a.name}".lstrip(".") for a in node.names]
            names = [n if n in MODULES else target for n in names]
        else:
            continue
        for name in names:
            if node.__class__ is ast.Import:
                if name != "workshop" and not name.startswith("workshop."):
                    continue
                name = name.removeprefix("workshop").lstrip(".")
            found.add(name)
    return found


def torch_imports(source: str) -> set[str]:
    """Names of torch modules that ``source`` imports."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "torch"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "torch"
        ):
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


FILES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
MODULES = {module_name(p): p for p in FILES}
IMPORTS = {
    m: imported_modules(p.read_text(), m, p.name == "__init__.py")
    for m, p in MODULES.items()
}


def violations(imports: dict[str, set[str]]) -> list[str]:
    """Each import that goes sideways or up between wings, as a readable line."""
    bad = []
    for module, targets in sorted(imports.items()):
        wing = wing_of(module)
        if wing == "top":
            continue
        for target in sorted(targets):
            to = wing_of(target)
            if to == wing and wing != "base":
                continue
            if wing == "base" and to == "base":
                continue
            if to not in ALLOWED.get(wing, set()):
                bad.append(f"{module or 'workshop'} ({wing}) imports {target} ({to})")
    return bad


def test_every_module_belongs_to_a_wing_and_imports_only_wings_below_it():
    assert violations(IMPORTS) == []


def test_the_check_catches_an_import_that_goes_up_or_sideways():
    fake = dict(IMPORTS)
    fake["draw.fake"] = imported_modules(
        "def f():\n    from ..ranks.launcher import launch\n", "draw.fake", False
    )
    fake["comm.other"] = imported_modules(
        "import workshop.draw.plots\n", "comm.x", False
    )
    assert violations(fake) == [
        "comm.other (comm) imports draw.plots (draw)",
        "draw.fake (draw) imports ranks.launcher (ranks)",
    ]


def test_no_import_cycle_between_wings():
    # ALLOWED being acyclic is what keeps the real imports acyclic.
    graph = {wing: set(below) - {"base"} for wing, below in ALLOWED.items()}
    order: list[str] = []
    while graph:
        free = sorted(w for w, below in graph.items() if not below - set(order))
        assert free, f"a cycle among {sorted(graph)}"
        order += free
        for w in free:
            del graph[w]
    assert order[0] == "comm"  # sources sits beside comm
    # The two tops: the learners' lessons and the instructors' tools; nothing
    # imports either.
    assert order[-2:] == ["instructor", "lessons"]
    assert not {"instructor", "lessons"} & set().union(*ALLOWED.values())


def module_cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The circles among modules: each group of modules that reach one another
    through imports (Tarjan's strongly connected components), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(imports.get(module, ())):
            if target not in imports:
                continue
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1 or module in imports.get(module, ()):
                found.append(sorted(group))

    for module in sorted(imports):
        if module not in index:
            visit(module)
    return sorted(found)


def test_no_import_cycle_between_modules():
    # A module that must import back from the one that imports it was split at the
    # wrong place: what both need belongs in a third module below them.
    assert module_cycles(IMPORTS) == []


def test_the_cycle_check_finds_a_circle_through_a_lazy_import():
    fake = {
        "ranks.a": imported_modules("from .b import x\n", "ranks.a", False),
        "ranks.b": imported_modules(
            "def f():\n    from .c import y\n", "ranks.b", False
        ),
        "ranks.c": imported_modules(
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from .a import z\n",
            "ranks.c",
            False,
        ),
        "ranks.d": imported_modules("from .a import x\n", "ranks.d", False),
    }
    assert module_cycles(fake) == [["ranks.a", "ranks.b", "ranks.c"]]


def test_every_import_comes_before_the_code():
    # An import at the bottom of a file (after its functions) is how a circle is
    # usually hidden; none is needed.
    late = []
    for path in MODULES.values():
        tree = ast.parse(path.read_text())
        code = [
            node.lineno
            for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        ]
        late += [
            f"workshop/{path.relative_to(PACKAGE)}:{node.lineno}"
            for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom))
            and code
            and node.lineno > code[0]
        ]
    assert late == []


def test_docs_architecture_has_this_table_of_wings():
    # docs/architecture.md is the page a maintainer reads; it must say what this
    # test enforces: its rows "| `wing` | what it holds | `base`, `comm` |".
    text = ARCHITECTURE.read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)` \| [^|]+ \| ((?:`\w+`(?:, )?)+) \|$", text, re.M)
    documented = {wing: set(re.findall(r"`(\w+)`", below)) for wing, below in rows}
    assert documented == ALLOWED
    # And its list of the bottom modules is BASE.
    base = text.split("At the bottom, `base` is", 1)[1].split("\n\n", 1)[0]
    assert set(re.findall(r"`(\w+)\.py`", base)) == BASE


def test_draw_never_starts_ranks_nor_imports_torch_distributed():
    # Everything draw reaches, through the package's own modules: a picture can be
    # redrawn from a saved file on a machine where torch.distributed is unusable.
    reached, todo = set(), [m for m in MODULES if wing_of(m) == "draw"]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += IMPORTS[module]
    assert {wing_of(m) for m in reached} <= {"draw", "comm", "base"}
    assert not {m for m in reached if wing_of(m) in ("ranks", "cluster")}
    for module in sorted(reached):
        if wing_of(module) == "draw":
            distributed = {
                t
                for t in torch_imports(MODULES[module].read_text())
                if t.startswith("torch.distributed")
            }
            assert not distributed, f"{module} imports {sorted(distributed)}"


def test_the_estimate_reads_only_formulas_and_no_launching_code():
    # The planner's estimate is formulas: it loads in a kernel that started nothing,
    # and a reader follows it through the planner's formula files and the models and
    # buckets they count (docs/architecture.md, "The flow of one plan"); a rule by
    # concept, not a count of files. Every import counts, those inside functions too.
    reached, todo = set(), ["planner.estimator"]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += IMPORTS[module]
    formulas = {"estimator", "layout", "hardware", "memory", "operations", "step_time"}
    assert {m for m in reached if wing_of(m) == "planner"} <= {
        f"planner.{name}" for name in formulas
    }, sorted(reached)
    assert {wing_of(m) for m in reached} <= {
        "planner", "sources", "comm", "training", "base"
    }  # fmt: skip
    assert not reached & {"env", "allocation", "_procs"}


def test_launch_reads_only_the_launching_wings():
    # What the old "eight files at most" count stood for, as a rule by concept: a
    # launch follows the rank environment, the process primitives and the ranks
    # wing (docs/architecture.md, "The flow of one launch"), plus the bottom-level
    # modules every wing shares. It never loads the planner, the benchmarks, the
    # instructor's tools, the lessons or the pictures: those would make every
    # launch slower to import and a reader's path longer. Every import counts,
    # those inside functions too (the failure path and the worker's are part of it).
    reached, todo = set(), ["ranks.launcher"]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += IMPORTS[module]
    wings = {wing_of(m) for m in reached}
    assert wings <= {"ranks", "comm", "base"}, sorted(reached)
    assert not wings & {"planner", "bench", "instructor", "lessons", "draw"}
    # comm only for the recorder a rank may switch on (comm.tracing), nothing more.
    assert {m for m in reached if wing_of(m) == "comm"} <= {"comm.tracing"}


@pytest.mark.parametrize("wing", sorted(ALLOWED))
def test_each_wing_says_what_it_is_for_and_imports_nothing_itself(wing):
    init = PACKAGE / wing / "__init__.py"
    tree = ast.parse(init.read_text())
    doc = ast.get_docstring(tree)
    assert doc and "import" in doc.lower(), (
        f"{init}: say what the wing is for and imports"
    )
    # An __init__ that imports none of its modules keeps "from ..comm import tracing"
    # cheap and the wings free of cycles through their __init__: a topic offers its
    # names through _exports.offer, which imports each one when it is first used.
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [(n.level, n.module) for n in imports] in ([], [(2, "_exports")])


def test_each_name_a_topic_offers_is_defined_in_the_module_it_names():
    import workshop

    for wing in sorted(ALLOWED):
        topic = importlib.import_module(f"workshop.{wing}")
        names = getattr(topic, "_NAMES", {})
        assert sorted(names) == sorted(getattr(topic, "__all__", [])), wing
        # A name that is also a module of the wing would be the module or the name
        # depending on what was imported first.
        modules = {m.split(".")[1] for m in MODULES if m.startswith(f"{wing}.")}
        assert set(names) & modules == set(), wing
        for name, module in names.items():
            source = MODULES[f"{wing}.{module}"].read_text()
            assert re.search(rf"^(def|class) {name}\b|^{name}\b.*=", source, re.M), (
                f"workshop.{wing}.{name} is not defined in workshop/{wing}/{module}.py"
            )
            assert getattr(topic, name) is getattr(
                importlib.import_module(f"workshop.{wing}.{module}"), name
            )
    assert workshop.planner.estimate.__module__ == "workshop.planner.estimator"


def test_a_module_lists_in_its_all_only_what_it_defines():
    # One definition, re-exported at most once (by a topic): no module passes on
    # another's names, so "go to definition" lands where the name is defined.
    passed_on = {}
    for module, path in MODULES.items():
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        defined, listed = set(), []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else ([node.target] if isinstance(node, ast.AnnAssign) else [])
            )
            for target in targets:
                if isinstance(target, ast.Name):
                    defined.add(target.id)
                    if target.id == "__all__":
                        listed = [e.value for e in node.value.elts]
        if set(listed) - defined:
            passed_on[module] = sorted(set(listed) - defined)
    assert passed_on == {}


def test_no_module_is_much_over_600_lines_nor_a_lesson_module_over_400():
    long = {
        f"workshop/{p.relative_to(PACKAGE)}": n
        for p in FILES
        if (n := len(p.read_text().splitlines()))
        > (MAX_LESSON_LINES if wing_of(module_name(p)) == "parallel" else MAX_LINES)
    }
    assert long == {}


def test_the_tests_mirror_the_wings():
    tests = Path(__file__).resolve().parent
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name in ALLOWED}
    assert folders == set(ALLOWED)
    for wing in ALLOWED:
        assert list((tests / wing).glob("test_*.py")), f"tests/{wing} has no tests"


# What a learner types in every notebook; the rest is reached by topic.
TOP_NAMES = {
    "ranks": ["launch", "LaunchError", "process_group", "rank_device", "backend_name",
              "RankInfo"],
    "training": ["digits", "cifar10", "make_loader", "per_rank_batch", "SmallCNN",
                 "resnet", "count_parameters", "train", "train_step", "evaluate",
                 "Progress", "save_checkpoint", "load_checkpoint", "has_collective"],
    "the workshop": ["doctor", "check", "quiz", "progress", "raise_hand", "lower_hand",
                     "hand"],
    "topics": ["draw", "comm", "bench", "cluster", "parallel", "planner", "training",
               "machine", "lessons", "sources"],
}  # fmt: skip


def test_the_package_offers_a_learner_s_names_and_its_topics():
    import pydoc

    import workshop

    expected = sorted(set().union(*map(set, TOP_NAMES.values())))
    assert sorted(workshop.__all__) == expected
    assert len(workshop.__all__) <= 40
    # help(workshop) reads as a table of contents: every name and every topic in it.
    text = pydoc.render_doc(workshop, renderer=pydoc.plaintext)
    contents = text.split("PACKAGE CONTENTS")[0]
    missing = [n for n in expected if not re.search(rf"\b{n}\b", contents)]
    assert missing == []
    for topic in TOP_NAMES["topics"]:
        module = getattr(workshop, topic)
        assert module.__doc__ and set(module.__all__) <= set(dir(module))
        doc = module.__doc__
        missing = [n for n in module.__all__ if not re.search(rf"\b{n}\b", doc)]
        assert missing == [], f"workshop.{topic}'s docstring does not name {missing}"


# Names each module of a kind defines for the same role: a command line's
# (add_arguments, run_from_args, main, its table of COMMANDS) and a notebook's lesson
# module's (its EXERCISES, QUESTIONS and QUIZ, gathered by lessons/).
PROTOCOL = {"main", "add_arguments", "run_from_args", "__all__", "COMMANDS"}
PROTOCOL |= {"EXERCISES", "QUESTIONS", "QUIZ"}
# A copy kept on purpose, and why: module -> names.
COPIES = {
    # Runs as `python workshop/instructor/site_env.py` with the standard library
    # alone, on a Python that cannot import the package yet.
    "instructor.site_env": {"ROOT"},
}


def twin_names(modules: dict[str, str]) -> dict[str, list[str]]:
    """Public names (functions, classes, and constants too) that more than one of
    ``modules`` (name -> source) defines at the top level: a copied constant, or a
    name that means two things."""
    where: dict[str, list[str]] = {}
    for module, source in modules.items():
        for node in ast.parse(source).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                continue
            value = getattr(node, "value", None)
            if isinstance(value, ast.Call) and ast.unparse(value.func) == "TypeVar":
                continue  # T = TypeVar("T"): a placeholder of each module's own
            for name in names:
                if not name.startswith("_") and name not in COPIES.get(module, ()):
                    where.setdefault(name, []).append(module)
    return {n: m for n, m in where.items() if len(m) > 1 and n not in PROTOCOL}


def test_no_two_modules_define_the_same_public_name():
    # One name, one meaning, one home: per_rank_batch meant two things once, and
    # WIDTH = 88 was written in five modules. A constant two modules need lives in
    # one and the other imports it (an import defines nothing here).
    sources = {module: path.read_text() for module, path in MODULES.items()}
    assert twin_names(sources) == {}


def test_the_twin_check_catches_a_copied_constant_and_a_name_of_two_meanings():
    fake = {
        "draw.a": "WIDTH = 88\nLIVE: set = set()\nfrom .b import ROOT\n",
        "draw.b": "ROOT = 1\nWIDTH = 88\n",
        "cluster.c": "LIVE: set = set()\ndef main(): pass\n_WIDTH = 88\n",
        "cluster.d": "def main(): pass\n",
    }
    assert twin_names(fake) == {"WIDTH": ["draw.a", "draw.b"], "LIVE": ["draw.a",
                                "cluster.c"]}  # fmt: skip
