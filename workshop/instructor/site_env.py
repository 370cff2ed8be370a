"""Make the workshop's ``.venv`` on top of a site's Python that already has torch.

A venv made with ``--system-site-packages`` on top of a site's venv sees the *base*
interpreter's packages, not the venv's torch (pip then wanted to download torch), so
this prints the lines that make ``.venv`` see them (a ``.pth`` file). Run it with the
site's Python; it needs only the standard library::

    module load pytorch
    python workshop/instructor/site_env.py          # the site's Python; the lines
    python workshop/instructor/site_env.py --apply  # make .venv so, check its torch

``python -m workshop site-env`` is the same, where the package already imports.

Torch's requirements that this Python does not meet would send pip to an index, so
they are read here without ``packaging`` (often missing): release numbers only, and
what cannot be read is left out.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import operator
import os
import platform
import re
import shlex
import site
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "OTHER_REQUIREMENTS",
    "SiteEnvError",
    "SitePython",
    "add_arguments",
    "apply",
    "check_site_python",
    "describe_python",
    "find_package",
    "kind_of",
    "run_from_args",
    "unmet_requirements",
]

MIN_TORCH = (2, 4)  # pyproject.toml: torch>=2.4
MIN_PYTHON = (3, 10)  # pyproject.toml: requires-python
PTH_NAME = "workshop-site.pth"
# workshop._house's ROOT, written again: this file runs as a script of the standard
# library alone (see the top), where the package cannot be imported.
ROOT = Path(__file__).resolve().parents[2]
# The project, or the current folder where this file came out of the workshop's wheel.
HERE = ROOT if (ROOT / "pyproject.toml").is_file() else Path()
WHEELHOUSE = HERE / "wheelhouse"  # from make wheelhouse: wheels for a node offline
SETUP_TIMEOUT_S = 600  # a venv with pip takes 7 s on a slow 2-core machine


class SiteEnvError(RuntimeError):
    """The site's Python cannot carry the workshop, or ``.venv`` came out wrong."""


@dataclass(frozen=True)
class SitePython:
    """What a Python interpreter is and where its torch lies (paths as text)."""

    executable: str
    version: tuple[int, int]
    kind: str  # "plain", "conda" or "venv"
    prefix: str
    base_prefix: str
    sees_base: bool  # the base's site-packages are on its path (always, unless a venv)
    own_site_dirs: tuple[str, ...]  # a venv's own site-packages, which venv hides
    torch_version: str | None
    torch_dir: str | None  # the folder on sys.path that holds torch/
    torch_metadata: bool  # torch's dist-info is there: pip sees torch as installed
    torchvision_version: str | None
    has_setuptools: bool
    torch_unmet: tuple[str, ...] = ()  # its requirements this Python does not meet


def kind_of(prefix: str | Path, base_prefix: str | Path) -> str:
    """``"venv"`` if ``prefix`` is a virtual environment on ``base_prefix``, else
    ``"conda"`` (it has ``conda-meta/``) or ``"plain"``.

    Example:
        >>> kind_of(sys.prefix, sys.base_prefix)  # in a venv  # doctest: +SKIP
        'venv'
    """
    if Path(prefix).resolve() != Path(base_prefix).resolve():
        return "venv"
    return "conda" if (Path(prefix) / "conda-meta").is_dir() else "plain"


# pyproject.toml's dependencies and [lab,test] extras but torch and torchvision, for
# an install with --no-deps (tests/instructor/test_site_env.py checks
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
        Its version (``"unknown"`` without dist-info), its sys.path folder, and
        whether its metadata is there; ``(None, None, False)`` where there is none.

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
    names = ("system", "machine", "release", "version", "python_implementation")
    return {
        "python_version": "{}.{}".format(*sys.version_info),
        "python_full_version": platform.python_version(),
        **{f"platform_{name}": getattr(platform, name)() for name in names},
        "implementation_name": sys.implementation.name,
        "sys_platform": sys.platform,
        "os_name": os.name,
        "extra": "",
    }


def _marker_holds(marker: str) -> bool:
    """Whether a Requires-Dist marker (comparisons joined by ``and``, ``or``) holds
    here; ValueError for one it cannot read."""
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
    not meet (pip would look for them on an index).

    Args:
        name: the installed distribution whose Requires-Dist is read.
        path: the folders to look in (default ``sys.path``).

    Returns:
        Each unmet requirement with what is there, such as
        ``"setuptools<82 (found 82.0)"``; one it cannot read is left out.

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


def describe_python() -> SitePython:
    """What the running Python is: its kind, where its packages are, its torch.

    Returns:
        A :class:`SitePython` of ``sys.executable``.

    Example:
        >>> describe_python().kind  # doctest: +SKIP
        'venv'
    """
    kind = kind_of(sys.prefix, sys.base_prefix)
    sees_base, own = True, {}
    if kind == "venv":
        config = Path(sys.prefix) / "pyvenv.cfg"
        text = config.read_text() if config.is_file() else ""
        found = re.search(r"^include-system-site-packages\s*=\s*(\w+)", text, re.M)
        sees_base = bool(found) and found.group(1).lower() == "true"
        prefix = Path(sys.prefix).resolve()
        for folder in site.getsitepackages():  # lib64 is often a link to lib
            real = Path(folder).resolve()
            if real.is_dir() and real.is_relative_to(prefix):
                own.setdefault(real, folder)
    torch_version, torch_dir, metadata = find_package("torch")
    return SitePython(
        executable=sys.executable,
        version=sys.version_info[:2],
        kind=kind,
        prefix=sys.prefix,
        base_prefix=sys.base_prefix,
        sees_base=sees_base,
        own_site_dirs=tuple(own.values()),
        torch_version=torch_version,
        torch_dir=None if torch_dir is None else str(torch_dir),
        torch_metadata=metadata,
        torchvision_version=find_package("torchvision")[0],
        has_setuptools=importlib.util.find_spec("setuptools") is not None,
        torch_unmet=unmet_requirements("torch") if metadata else (),
    )


def check_site_python(python: SitePython, venv: Path) -> None:
    """Raise :class:`SiteEnvError` unless ``python`` can carry the workshop.

    Args:
        python: the site's Python, from :func:`describe_python`.
        venv: the virtual environment to make on top of it.

    Raises:
        SiteEnvError: Python older than 3.10, no torch, torch older than 2.4, or
            ``python`` is ``venv``'s own.

    Example:
        >>> check_site_python(describe_python(), Path(".venv"))  # doctest: +SKIP
    """
    where = f"{python.executable} (Python {'.'.join(map(str, python.version))})"
    if python.version < MIN_PYTHON:
        raise SiteEnvError(
            f"{where} is older than Python 3.10, the workshop's oldest.\n"
            "HINT: load a newer PyTorch module (module avail pytorch)."
        )
    if python.torch_version is None:
        raise SiteEnvError(
            f"{where} cannot import torch: it is a {python.kind} Python at "
            f"{python.prefix}.\nHINT: load the site's PyTorch module first (module "
            "load pytorch), or run this with the Python that has torch: "
            "/path/to/python workshop/instructor/site_env.py"
        )
    release = tuple(int(n) for n in re.findall(r"\d+", python.torch_version)[:2])
    if python.torch_version != "unknown" and release < MIN_TORCH:
        raise SiteEnvError(
            f"{where} has torch {python.torch_version} (in {python.torch_dir}); the "
            "workshop needs torch 2.4 or newer.\n"
            "HINT: load a newer PyTorch module (module avail pytorch)."
        )
    if _same(python.prefix, str(venv)):
        raise SiteEnvError(
            f"{where} is the Python of {venv} itself.\nHINT: run this with the "
            "site's Python: module load pytorch; python workshop/instructor/site_env.py"
        )


def _shown(path: Path, tail: str = "") -> str:
    """``path`` (relative when inside the current folder) and ``tail``, quoted."""
    try:
        text = str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        text = str(path)
    return shlex.quote(text + tail)


def _make_lines(python: SitePython, venv: Path) -> list[str]:
    """The shell lines that make ``venv`` on top of ``python`` (``--apply`` runs
    them): ``python -m venv``, a ``.pth`` for a site venv's own folders, and the
    removal of a setuptools that would hide the site's."""
    flag = " --system-site-packages" if python.sees_base else ""
    lines = [f"{shlex.quote(python.executable)} -m venv{flag} {_shown(venv)}"]
    if python.own_site_dirs:
        lib = f"python{python.version[0]}.{python.version[1]}"
        pth = venv / "lib" / lib / "site-packages" / PTH_NAME
        # json.dumps writes a Python string literal in double quotes: ' quotes it.
        add = [
            f"import site; site.addsitedir({json.dumps(d)})"
            for d in python.own_site_dirs
        ]
        lines.append(
            f"printf '%s\\n' {' '.join(map(shlex.quote, add))} > {_shown(pth)}"
        )
    # Below 3.12, a new venv gets its own setuptools (65 on 3.11), which hides the
    # site's; torch 2.15 asks for setuptools>=77.0.3, so pip would want another one.
    if python.version < (3, 12) and python.has_setuptools:
        lines.append(f"{_shown(venv)}/bin/python -m pip uninstall -y -q setuptools")
    return lines


def _install_lines(python: SitePython, venv: Path) -> list[str]:
    """pip lines for the workshop: from wheelhouse/ if any, else PyPI (torch kept)."""
    pip, tree = f"{_shown(venv)}/bin/pip", HERE == ROOT
    package = f"-e {_shown(ROOT)}" if tree else "scaling-pytorch-hpc"
    listed = WHEELHOUSE / "requirements-offline.txt"  # make wheelhouse writes it first
    if listed.is_file() and any(WHEELHOUSE.glob("*.whl")):
        wheels = f"--no-index --find-links {_shown(WHEELHOUSE)}"
        return [
            f"{pip} install {wheels} -r {_shown(listed)}",
            f"{pip} install {wheels} --no-deps {package}",
        ]
    if not python.torch_metadata or python.torch_unmet:  # pip must not see torch's
        others = " ".join(map(shlex.quote, OTHER_REQUIREMENTS))
        return [f"{pip} install {others}", f"{pip} install --no-deps {package}"]
    # pip takes PATH[extras]: '.[lab,test]'
    extras = f"-e {_shown(ROOT, '[lab,test]')}" if tree else f"'{package}[lab,test]'"
    return [f"{pip} install {extras} torch=={python.torch_version}"]


def _report(python: SitePython, venv: Path) -> str:
    """What the site's Python is, and the lines that put the workshop on top of it."""
    version = ".".join(map(str, python.version))
    kinds = {"plain": "a plain Python install", "conda": "a conda environment"}
    kinds["venv"] = "a virtual environment"
    text = [f"The site's Python: {python.executable} (Python {version}),"]
    text.append(f"  {kinds[python.kind]} at {python.prefix}")
    if python.kind == "venv":
        base = kinds[kind_of(python.base_prefix, python.base_prefix)]
        seen = "seeing" if python.sees_base else "not seeing"
        text.append(f"  made from {base} at {python.base_prefix}, {seen} its packages")
    text.append(f"  torch {python.torch_version} in {python.torch_dir}")
    text.append(f"  torchvision {python.torchvision_version or '(none)'}")
    if python.kind == "venv":
        text.append(
            "A venv made from a venv is made from its base: --system-site-packages "
            "would show\n.venv the base's packages, not this venv's. A .pth file "
            "in .venv adds this venv's\nsite-packages, so Python and pip see its torch."
        )
    elif python.kind == "conda":
        text.append(
            "Keep the environment active (conda activate, or the module) while you "
            "use .venv:\nits activation may set the library paths torch needs."
        )
    text.append(f"\nMake {_shown(venv)} (--apply runs these lines and checks):")
    text += [f"  {line}" for line in _make_lines(python, venv)]
    install = _install_lines(python, venv)
    where = "wheelhouse/, with no index" if "--no-index" in install[0] else "PyPI"
    text.append(f"Then install the workshop into it from {where}:")
    text += [f"  {line}" for line in install]
    return "\n".join(text + _warnings(python))


def _warnings(python: SitePython) -> list[str]:
    found = []
    if not python.torch_metadata:
        found.append(
            f"WARNING: torch in {python.torch_dir} has no dist-info: pip cannot see "
            "it, and would\ndownload torch. HINT: the workshop with --no-deps, as "
            "above, after its other requirements."
        )
    if python.torch_unmet:
        found.append(
            f"WARNING: torch {python.torch_version} asks for what this Python lacks: "
            f"{', '.join(python.torch_unmet)}.\npip, resolving torch's requirements, "
            'would download them (with no index: "Could not find a version").\n'
            "HINT: the workshop with --no-deps, as above; the site's torch stays."
        )
    if python.torchvision_version is None:
        found.append(
            "WARNING: no torchvision here; pip would fetch one built for PyPI's "
            "torch.\nHINT: ask for a module with it, or pip install the torchvision "
            "made for this torch."
        )
    pythonpath = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if python.torch_dir and _same(python.torch_dir, *filter(None, pythonpath)):
        found.append(
            "NOTE: torch comes from PYTHONPATH: .venv sees it only while PYTHONPATH "
            "is set, so\nload the module before you use .venv."
        )
    return found


def _same(path: str, *others: str) -> bool:
    """Whether ``path`` is one of ``others``, links resolved."""
    return Path(path).resolve() in {Path(other).resolve() for other in others}


def _run(command: list[str], what: str, hint: str) -> str:
    """Run ``command``; its output, or :class:`SiteEnvError` with ``hint``."""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=SETUP_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as e:
        raise SiteEnvError(f"{what} took over {SETUP_TIMEOUT_S} s: {command}") from e
    if done.returncode != 0:
        raise SiteEnvError(
            f"{what} failed (exit status {done.returncode}):\n{done.stderr.strip()}\n"
            f"HINT: {hint}"
        )
    return done.stdout


def apply(python: SitePython, venv: Path) -> SitePython:
    """Make ``venv`` on top of ``python`` and check that it sees the same torch.

    Args:
        python: the running (site's) Python, from :func:`describe_python`.
        venv: the virtual environment to make; it must not exist yet.

    Returns:
        What ``venv``'s Python is, as :func:`describe_python` sees it from there.

    Raises:
        SiteEnvError: ``venv`` exists, making it failed, or it sees another torch.

    Example:
        >>> apply(describe_python(), Path(".venv")).torch_dir  # doctest: +SKIP
        '/site/venv/lib/python3.12/site-packages'
    """
    if venv.exists():
        raise SiteEnvError(
            f"{venv} exists already.\nHINT: remove it (rm -rf {_shown(venv)}) or "
            "name another with --venv PATH."
        )
    lines = _make_lines(python, venv)
    print("\n".join(f"+ {line}" for line in lines), flush=True)
    _run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(lines)],
        f"making {venv}",
        f"a Debian or Ubuntu system Python needs python3-venv. Remove {venv} before "
        "you try again, or take the form without a venv (pip install --target) in "
        "docs/install.md.",
    )
    made = venv / "bin" / "python"
    asked = _run([str(made), __file__, "--json"], "asking it for torch", "see above")
    seen = SitePython(**json.loads(asked))
    same = bool(seen.torch_dir) and _same(seen.torch_dir or "", python.torch_dir or "")
    if not same or seen.torch_version != python.torch_version:
        raise SiteEnvError(
            f"{made} sees torch {seen.torch_version} in {seen.torch_dir}, not the "
            f"site's {python.torch_version} in {python.torch_dir}.\n"
            f"HINT: remove {venv} and report this, with the output above."
        )
    return seen


def _venv_arg(text: str) -> Path:
    """--venv: a folder that is, or can be made (not workshop._cli's: this file runs
    without the package)."""
    path = Path(os.path.abspath(text or "."))
    above = next(p for p in (path, *path.parents) if p.exists())
    if not text:
        why = "no path was given"
    elif above == path and not path.is_dir():
        why = "it is a file, not a folder"
    elif not above.is_dir():
        why = f"{above} is a file, not a folder"
    elif above != path and not os.access(above, os.W_OK | os.X_OK):
        # Only where it is to be made: an existing folder is refused later with the
        # reason that holds (it exists already, or it is this Python's own venv).
        why = f"the folder {above} cannot be written by you"
    else:
        return Path(text)
    what = f"cannot make {text}: {why}" if text else why
    raise argparse.ArgumentTypeError(f"{what}; e.g. --venv .venv")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``site-env``'s options to ``parser``."""
    default = HERE / ".venv"
    parser.add_argument(
        "--venv",
        type=_venv_arg,
        default=default,
        metavar="PATH",
        help=f"the virtual environment to make (default {_shown(default)})",
    )
    parser.add_argument(
        "--apply", action="store_true", help="make it, and check its torch"
    )
    parser.add_argument(
        "--json", action="store_true", help="print what this Python is, as JSON"
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Print the lines (or, with ``--apply``, run them) for ``args.venv``.

    Returns:
        0, or 1 after saying why.

    Example:
        >>> run_from_args(argparse.Namespace(venv=Path(".venv"), apply=False,
        ...               json=False))  # doctest: +SKIP
        0
    """
    python = describe_python()
    if args.json:
        print(json.dumps(asdict(python), indent=1))
        return 0
    try:
        check_site_python(python, args.venv)
        if args.apply:
            seen = apply(python, args.venv)
            print(f"{args.venv} sees torch {seen.torch_version} in {seen.torch_dir}.")
            print("Now install the workshop into it:")
            lines = [f"  {line}" for line in _install_lines(python, args.venv)]
            print("\n".join(lines + _warnings(python)))
        else:
            print(_report(python, args.venv))
    except SiteEnvError as e:
        print(f"site-env: ERROR: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # python workshop/instructor/site_env.py [--apply]
    _parser = argparse.ArgumentParser(
        prog="python workshop/instructor/site_env.py",
        description=__doc__.split("\n\n")[0],
    )
    add_arguments(_parser)
    sys.exit(run_from_args(_parser.parse_args()))
