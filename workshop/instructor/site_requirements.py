"""What this Python has installed, read with the standard library only, for
:mod:`workshop.instructor.site_env` (which runs before anything is installed, often with
a Python that has no ``packaging``): where a package is and its version, and which
requirements of the installed torch this Python does not meet.

pip resolves the requirements of an installed torch too: one that this Python does
not meet (a GPU node's torch 2.11 asked for setuptools<82) sends pip to an index,
and with none it fails. This reads the markers and the version operators that
Requires-Dist uses (``<``, ``<=``, ``>``, ``>=``, ``==``, ``!=``, ``~=``, ``===``, and
``==2.4.*``), versions by their release numbers only (2.11.0+cu130 is 2.11.0). What it
cannot read (a marker with brackets, an unknown variable) it leaves out.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import operator
import os
import platform
import re
import sys
from pathlib import Path

__all__ = ["OTHER_REQUIREMENTS", "find_package", "unmet_requirements"]

# pyproject.toml's dependencies and [lab,test] extras but torch and torchvision, for
# an install with --no-deps (tests/instructor/test_site_requirements.py checks
# that they agree).
OTHER_REQUIREMENTS = (
    "cloudpickle>=2.2",
    "numpy>=1.24",
    "scikit-learn>=1.2",
    "jupyterlab>=4",
    "ipywidgets>=8",
    "matplotlib>=3.7",
    "pytest>=7",
    "pytest-timeout>=2",
    "nbval>=0.10",
)


def find_package(name: str) -> tuple[str | None, Path | None, bool]:
    """Where package ``name`` is, without importing it (torch takes seconds).

    Args:
        name: the import name of the package.

    Returns:
        Its version (``"unknown"`` for a build with no dist-info, copied or from
        source: pip cannot see it), the sys.path folder it is in, and whether its
        metadata is in that folder; ``(None, None, False)`` where there is none.

    Example:
        >>> find_package("torch")  # doctest: +SKIP
        ('2.11.0+cu130', PosixPath('/site/lib/python3.12/site-packages'), True)
    """
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None, None, False
    folder = Path(next(iter(spec.submodule_search_locations))).parent
    dist = next(importlib.metadata.distributions(name=name, path=[str(folder)]), None)
    return (dist.version if dist else "unknown"), folder, dist is not None


_REQUIREMENT = re.compile(
    r"([A-Za-z0-9][\w.-]*)\s*(?:\[[^\]]*\])?\s*\(?([^;()@]*?)\)?\s*(?:;(.*))?"
)
_CLAUSE = re.compile(r"(===|[=!<>~]=|<|>)(.+)")
_VALUE = r"""(\w+|"[^"]*"|'[^']*')"""
_COMPARISON = re.compile(rf"\s*{_VALUE}\s*(===|[=!<>~]=|<|>|not\s+in|in)\s*{_VALUE}\s*")
_COMPARE = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _release(version: str) -> tuple[int, ...]:
    found = re.match(r"v?(\d+(?:\.\d+)*)", version.strip())
    if not found:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(n) for n in found.group(1).split("."))


def _version_holds(version: str, op: str, wanted: str) -> bool:
    """Whether ``version`` satisfies one clause, such as ``<82`` or ``==3.9.*``."""
    if op == "===":
        return version == wanted
    have, want = _release(version), _release(wanted.removesuffix(".*"))
    if op == "~=":  # ~=3.9.0: >=3.9.0 and ==3.9.*
        return have >= want and have[: len(want) - 1] == want[:-1]
    if wanted.endswith(".*"):  # ==2.4.*: the first numbers agree
        return (have[: len(want)] == want) == (op == "==")
    size = max(len(have), len(want))  # 82 == 82.0
    have, want = have + (0,) * (size - len(have)), want + (0,) * (size - len(want))
    return _COMPARE[op](have, want)


def _marker_environment() -> dict[str, str]:
    """PEP 508's marker variables for this Python, with no extra asked for."""
    return {
        "python_version": "{}.{}".format(*sys.version_info),
        "python_full_version": platform.python_version(),
        "platform_system": platform.system(),
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_version": platform.version(),
        "platform_python_implementation": platform.python_implementation(),
        "implementation_name": sys.implementation.name,
        "sys_platform": sys.platform,
        "os_name": os.name,
        "extra": "",
    }


def _marker_holds(marker: str) -> bool:
    """Whether a Requires-Dist marker (``python_version >= "3.12"``) holds here:
    comparisons joined by ``and`` and ``or``.

    Raises:
        ValueError: a marker it cannot read (brackets, an unknown variable).
    """
    env = _marker_environment()

    def value(token: str) -> str:
        if token[:1] in ("'", '"'):
            return token[1:-1]
        if token not in env:
            raise ValueError(f"no marker variable {token!r} in {marker!r}")
        return env[token]

    def holds(comparison: str) -> bool:
        found = _COMPARISON.fullmatch(comparison)
        if not found:
            raise ValueError(f"cannot read {comparison!r} in the marker {marker!r}")
        left, right = value(found.group(1)), value(found.group(3))
        op = " ".join(found.group(2).split())  # "not  in": "not in"
        if op in ("in", "not in"):
            return (left in right) == (op == "in")
        try:
            return _version_holds(left, op, right)
        except ValueError:  # not versions: compared as text
            return _COMPARE[op](left, right)

    return any(
        all(holds(comparison) for comparison in re.split(r"\band\b", either))
        for either in re.split(r"\bor\b", marker)
    )


def unmet_requirements(
    name: str = "torch", path: list[str] | None = None
) -> tuple[str, ...]:
    """The requirements of the installed distribution ``name`` that this Python does
    not meet: those that pip, resolving them, would look for on an index.

    Args:
        name: the installed distribution whose Requires-Dist is read.
        path: the folders to look in (default ``sys.path``).

    Returns:
        Each unmet requirement with what is there, such as
        ``"setuptools<82 (found 82.0)"`` or ``"triton~=3.5 (not installed)"``;
        none where all are met or ``name`` is not installed. A requirement it
        cannot read (a marker or a version it does not know) is left out.

    Example:
        >>> unmet_requirements("torch")  # the GPU node's torch 2.11  # doctest: +SKIP
        ('setuptools<82 (found 82.0)',)
    """
    path = sys.path if path is None else path
    dist = next(importlib.metadata.distributions(name=name, path=path), None)
    unmet = []
    for line in (dist.requires or []) if dist else []:
        parsed = _REQUIREMENT.fullmatch(line.strip())
        if not parsed:  # name @ url
            continue
        needed, spec, marker = parsed.groups()
        spec = re.sub(r"\s+", "", spec)
        clauses = [_CLAUSE.fullmatch(clause) for clause in spec.split(",") if clause]
        there = next(importlib.metadata.distributions(name=needed, path=path), None)
        try:
            if None in clauses or (marker and not _marker_holds(marker)):
                continue
            if there and all(
                _version_holds(there.version, *c.groups()) for c in clauses
            ):
                continue
        except (ValueError, KeyError):
            continue
        seen = f"found {there.version}" if there else "not installed"
        unmet.append(f"{needed}{spec} ({seen})")
    return tuple(unmet)
