"""Every cross-reference in the package's docstrings leads somewhere.

A docstring names other code with Sphinx's roles: ``:func:`workshop.x.y```,
``:class:`~workshop.x.Y```, or relative to its own module, ``:func:`.y``` and
``:data:`Z```. When a name moves to another module, the references to it go stale
without any error; this test follows each one: it imports the module the target
names and looks the rest up attribute by attribute. Targets outside the package
(``torch.*``, the standard library) are not followed.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import io
import os
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "workshop"
ROLE = re.compile(r":(func|mod|class|meth|data|attr|exc):`([^`]+)`")
# Extras a machine may lack (pyproject.toml's portal extra): a reference into a
# module that needs one is skipped there, and followed where it is installed.
OPTIONAL = {"jupyterhub", "batchspawner"}


def _module_name(path: Path) -> str:
    parts = ["workshop", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def references(source: str) -> list[tuple[int, str, str, str | None]]:
    """``(line, role, target, enclosing class)`` for each role in a docstring of
    ``source`` (the module's, a class's or a function's)."""
    found = []

    def visit(node: ast.AST, cls: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = child.name if isinstance(child, ast.ClassDef) else cls
                doc = ast.get_docstring(child, clean=False)
                if doc:
                    line = child.body[0].lineno
                    found.extend((line, r, t, inner) for r, t in ROLE.findall(doc))
                visit(child, inner)

    tree = ast.parse(source)
    doc = ast.get_docstring(tree, clean=False)
    if doc:
        found.extend((1, r, t, None) for r, t in ROLE.findall(doc))
    visit(tree, None)
    return found


def _lookup(dotted: str) -> object:
    """The object ``dotted`` names: the longest importable module, then attributes.

    Raises:
        LookupError: naming the part that is missing.
        ModuleNotFoundError: a module the target's module needs is not installed.
    """
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # Only "no such module" moves on to a shorter prefix; a module that
            # exists but needs something missing is reported.
            if exc.name is not None and (
                exc.name == name or name.startswith(exc.name + ".")
            ):
                continue
            raise
        for i, attr in enumerate(parts[cut:], start=cut):
            if not hasattr(obj, attr):
                raise LookupError(f"{'.'.join(parts[:i])} has no {attr}")
            obj = getattr(obj, attr)
        return obj
    raise LookupError(f"no module {parts[0]}")


def resolve(target: str, module: str, cls: str | None) -> object | None:
    """What ``target``, written in ``module`` (inside class ``cls``), refers to;
    None for a target outside the package. Raises LookupError when it is nowhere."""
    target = target.lstrip("~!")
    if "<" in target:  # "text <target>": the target is inside the brackets
        target = target.split("<", 1)[1].rstrip(">").lstrip("~!")
    if target.startswith("workshop.") or target == "workshop":
        return _lookup(target)
    # Relative (".name") or bare ("name"): the enclosing class, the module, then the
    # module's package, as Sphinx searches from where the reference is written.
    name = target.lstrip(".")
    package = module.rsplit(".", 1)[0]
    places = ([f"{module}.{cls}"] if cls else []) + [module, package, "workshop"]
    for place in places:
        try:
            return _lookup(f"{place}.{name}")
        except LookupError:
            continue
    if not target.startswith(".") and name.split(".")[0] not in ("workshop",):
        head = name.split(".")[0]
        try:
            importlib.import_module(head)
        except ImportError:
            pass
        else:
            return None  # another package's name (torch.*, os.*): not followed
    raise LookupError(f"{target} is not in {module}, its class or its package")


def _all_references() -> list[tuple[str, int, str, str, str | None]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        module = _module_name(path)
        for line, role, target, cls in references(path.read_text()):
            found.append((module, line, role, target, cls))
    return found


REFERENCES = _all_references()


def test_the_package_has_references_to_follow():
    # Guards the scan itself: a regular expression that stopped matching would
    # make the test below pass on nothing.
    assert len(REFERENCES) > 100
    assert {role for _, _, role, _, _ in REFERENCES} >= {"func", "class", "mod"}


def test_every_docstring_reference_resolves():
    stale = []
    for module, line, role, target, cls in REFERENCES:
        try:
            resolve(target, module, cls)
        except LookupError as exc:
            path = module.replace(".", "/")
            stale.append(f"{path}.py:{line}: :{role}:`{target}`: {exc}")
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.split(".")[0] in OPTIONAL:
                continue  # the portal's extras are not installed here
            raise
    assert stale == []


@pytest.mark.parametrize(
    ("target", "module", "cls", "wanted"),
    [
        ("workshop.ranks.launcher.launch", "workshop.draw.plots", None,
         "workshop.ranks.launcher.launch"),
        ("~workshop.planner.estimator.estimate", "workshop.draw", None,
         "workshop.planner.estimator.estimate"),
        (".step_time.DEFAULT_MFU", "workshop.planner.estimator", None,
         "workshop.planner.step_time.DEFAULT_MFU"),
        ("table", "workshop.planner.estimator", None,
         "workshop.planner.estimator.table"),
        ("memory_total", "workshop.planner.estimator", "Estimate",
         "workshop.planner.estimator.Estimate.memory_total"),
        ("os.path.join", "workshop.draw.plots", None, None),
    ],
)  # fmt: skip
def test_a_reference_is_followed_the_way_sphinx_would(target, module, cls, wanted):
    found = resolve(target, module, cls)
    assert found is (None if wanted is None else _lookup(wanted))


@pytest.mark.parametrize(
    ("target", "module"),
    [
        ("workshop.ranks.launcher.no_such_name", "workshop.draw.plots"),
        ("workshop.no_such_module.launch", "workshop.draw.plots"),
        (".no_such_name", "workshop.ranks.session"),
    ],
)
def test_a_stale_reference_is_caught(target, module):
    with pytest.raises(LookupError):
        resolve(target, module, None)


def run_examples(module_names: list[str]) -> str:
    """Run the docstring examples of each module (those not marked "+SKIP"), from
    the project's root, whose paths they use ("slurm/train_ddp.py"); what failed,
    as doctest reports it ("" when none did). A module that needs a missing extra
    of the portal is passed over."""
    os.chdir(PACKAGE.parent)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report = io.StringIO()
    for name in module_names:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.split(".")[0] in OPTIONAL:
                continue
            raise
        # Only the module's own docstrings, not those of the names it imports.
        for test in doctest.DocTestFinder().find(module):
            runner.run(test, out=report.write)
    return report.getvalue() if runner.failures else ""


# Every module of the package, whose examples tests/test_docstrings_integration.py
# runs in a fresh process (some run a backward pass, which the suite keeps out of
# its own process).
MODULES = sorted(
    {_module_name(p) for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
)


def test_the_example_check_runs_examples_and_reports_a_wrong_one(tmp_path, monkeypatch):
    (tmp_path / "examples_here.py").write_text(
        'def right():\n    """\n    >>> 1 + 1\n    2\n    """\n\n\n'
        'def wrong():\n    """\n    >>> 1 + 1\n    3\n    """\n\n\n'
        'def skipped():\n    """\n    >>> 1 / 0  # doctest: +SKIP\n    """\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)  # run_examples moves to the project's root
    report = run_examples(["examples_here"])
    assert "examples_here.wrong" in report and "Expected:\n    3\nGot:\n    2" in report
    assert "examples_here.right" not in report and "skipped" not in report
    assert len(MODULES) > 100 and "workshop.ranks.launcher" in MODULES
