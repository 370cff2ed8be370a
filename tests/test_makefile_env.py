"""Which Python `make lab` and `make test` use, and when they set anything up.

Where there is a .venv, it is used (setup.sh keeps it up to date). Where there is
none and python3 already has everything (a site's torch module plus pip install, or
pip install --target with PYTHONPATH, as on a GPU node without internet), that
python3 is used and nothing is set up. Else setup.sh creates .venv. A .venv made
another way (no stamp of setup.sh) that is complete is left as it is, and an
apt-get that fails outside CI is said, not fatal. The check asks for what `make lab`
and `make test` need, not the portal's hub; and where python3 is a Python that the
pins have no wheels for, setup finds one they have, or says which to get, before it
downloads anything.

Each test works in a folder of its own holding the Makefile, setup.sh,
pyproject.toml and a stand-in workshop package, with stand-in pythons that run this
test's interpreter: nothing is installed, nothing is downloaded.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _project(tmp_path: Path) -> Path:
    """A project folder: the real Makefile, setup.sh, pyproject.toml and
    requirements.txt, and an empty workshop package (found, never imported)."""
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    for name in ("Makefile", "pyproject.toml", "requirements.txt", "scripts/setup.sh"):
        shutil.copy(ROOT / name, project / name)
    (project / "workshop").mkdir()
    (project / "workshop" / "__init__.py").write_text("")
    return project


def _python(path: Path, *options: str, log: Path | None = None) -> Path:
    """A python at ``path`` that runs this test's interpreter (with ``options``),
    writing its arguments to ``log`` first when given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = f'echo "$*" >> "{log}"\n' if log else ""
    path.write_text(
        f'#!/bin/sh\n{record}exec "{sys.executable}" {" ".join(options)} "$@"\n'
    )
    path.chmod(0o755)
    return path


def _env(project: Path, bin_dir: Path | None = None, **extra: str) -> dict[str, str]:
    """This environment with ``project`` importable first (not this checkout),
    ``bin_dir`` first on PATH, no CI variable, and ``extra``."""
    before = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    kept = [p for p in before if p and Path(p).resolve() != ROOT]
    # Not CI's variable, nor those of a make this suite may run under (make exports
    # a variable given on its command line, as in `make test TEST_WORKERS=1`).
    dropped = ("CI", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "TEST_WORKERS", "PYTEST_ARGS")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["PYTHONPATH"] = os.pathsep.join([str(project), *kept])
    if bin_dir is not None:
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return {**env, **extra}


def _run(command: list[str], project: Path, env: dict[str, str]):
    return subprocess.run(
        command, cwd=project, env=env, capture_output=True, text=True, timeout=120
    )


def _versions() -> str:
    """What setup.sh --check says of this test's interpreter, after its path."""
    python = ".".join(map(str, sys.version_info[:3]))
    return f"Python {python}, torch {metadata.version('torch')}"


# --- setup.sh --check: has this python everything? ------------------------------


def test_check_says_a_complete_python_has_everything(tmp_path):
    project = _project(tmp_path)
    python3 = _python(tmp_path / "bin" / "python3")
    done = _run(
        ["bash", "scripts/setup.sh", "--check", "python3"],
        project,
        _env(project, python3.parent),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{python3} {_versions()}\n"


def test_check_names_what_is_missing(tmp_path):
    project = _project(tmp_path)
    # No site-packages (-S): torch and the others are not there.
    bare = _python(tmp_path / "bin" / "python3", "-S")
    done = _run(["bash", "scripts/setup.sh", "--check", str(bare)], project,
                _env(project))  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"{bare} lacks: ")
    assert "torch (not importable)" in done.stderr
    # Too old: an nbval 0.1 found first.
    old = tmp_path / "old"
    (old / "nbval").mkdir(parents=True)
    (old / "nbval" / "__init__.py").write_text("")
    (old / "nbval-0.1.dist-info").mkdir()
    (old / "nbval-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: nbval\nVersion: 0.1\n"
    )
    python3 = _python(tmp_path / "bin" / "python3")
    env = _env(project, PYTHONPATH=f"{project}{os.pathsep}{old}{os.pathsep}"
               + _env(project)["PYTHONPATH"])  # fmt: skip
    done = _run(["bash", "scripts/setup.sh", "--check", str(python3)], project, env)
    assert done.returncode == 1
    assert "nbval>=0.10 (found 0.1)" in done.stderr, done.stderr


def _python_without(tmp_path: Path, hidden: tuple[str, ...]) -> tuple[Path, str]:
    """A python3 that has what this test's interpreter has but the distributions
    ``hidden``, and the PYTHONPATH it needs: its sys.path but the standard library,
    as one folder of links (no site-packages: -S), with ``hidden`` left out."""
    standard = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
    standard.add(os.path.join(sysconfig.get_paths()["platstdlib"], "lib-dynload"))
    found = tmp_path / "found"
    found.mkdir()
    for entry in map(Path, sys.path):
        if str(entry) in standard or not entry.is_dir():
            continue
        if entry.resolve() in (ROOT, ROOT / "tests"):  # the project stands in for it
            continue
        for child in entry.iterdir():
            name = re.split(r"[-.]", child.name, maxsplit=1)[0].lower()
            if name not in hidden and not (found / child.name).exists():
                (found / child.name).symlink_to(child)
    return _python(tmp_path / "bin" / "python3", "-S"), str(found)


@pytest.mark.parametrize(
    ("hidden", "lacks"),
    [
        (("jupyterhub", "batchspawner"), None),  # the portal's: a GPU node's wheelhouse
        (("nbval",), "nbval (not importable)"),  # the test extra
        (("jupyterlab",), "jupyterlab (not importable)"),  # the lab extra
    ],
)
def test_check_asks_for_the_lab_and_test_extras_not_the_portals(
    tmp_path, hidden, lacks
):
    project = _project(tmp_path)
    python3, found = _python_without(tmp_path, hidden)
    env = _env(project, PYTHONPATH=f"{project}{os.pathsep}{found}")
    where = "import importlib.util as u, sys; print([u.find_spec(n) for n in sys.argv])"
    done = _run([str(python3), "-c", where, *hidden], project, env)
    # sys.argv[0] is "-c", which is no module either.
    assert done.stdout == f"{[None] * (1 + len(hidden))}\n", done.stdout + done.stderr
    done = _run(["bash", "scripts/setup.sh", "--check", str(python3)], project, env)
    if lacks is None:
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"{python3} {_versions()}\n"
    else:
        assert done.returncode == 1
        assert done.stderr == f"{python3} lacks: {lacks}\n"


def test_check_wants_the_workshop_of_this_checkout(tmp_path):
    project = _project(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "workshop").mkdir(parents=True)
    (elsewhere / "workshop" / "__init__.py").write_text("")
    python3 = _python(tmp_path / "bin" / "python3")
    env = _env(project)
    env["PYTHONPATH"] = env["PYTHONPATH"].replace(str(project), str(elsewhere), 1)
    done = _run(["bash", "scripts/setup.sh", "--check", str(python3)], project, env)
    assert done.returncode == 1
    assert (
        f"the workshop package of this checkout ({project.resolve()}/workshop; it "
        f"imports {elsewhere}/workshop instead)"
    ) in done.stderr, done.stderr


# --- the Makefile's choice ---------------------------------------------------------


def test_make_uses_a_complete_python3_and_sets_nothing_up(tmp_path):
    project = _project(tmp_path)
    python3 = _python(tmp_path / "bin" / "python3")
    env = _env(project, python3.parent)
    for target, command in [
        ("lab", f"{python3} -m jupyterlab --ip=127.0.0.1 "),
        ("test", f"{python3} -m pytest --timeout=600 "),
        ("lint", f"{python3} -m ruff check ."),
    ]:
        done = _run(["make", "--no-print-directory", "-n", target], project, env)
        assert done.returncode == 0, done.stderr
        assert command in done.stdout, done.stdout
        assert "setup.sh" not in done.stdout, done.stdout
    done = _run(["make", "--no-print-directory", "environment"], project, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"make: no .venv, and python3 has everything the workshop needs "
        f"({_versions()}): using {python3}, no set-up\n"
    )
    assert not (project / ".venv").exists()


def test_make_sets_up_where_python3_lacks_something(tmp_path):
    # A fresh clone on a CI machine: python3 is a plain Python, setup.sh runs.
    project = _project(tmp_path)
    bare = _python(tmp_path / "bin" / "python3", "-S")
    done = _run(["make", "--no-print-directory", "-n", "lab"], project,
                _env(project, bare.parent))  # fmt: skip
    assert done.returncode == 0, done.stderr
    setup, lab = done.stdout.splitlines()[:2]
    assert setup == "bash scripts/setup.sh"
    root = ["--allow-root"] if os.geteuid() == 0 else []
    settings = f'--LabApp.app_settings_dir="{project}/scripts/lab-settings"'
    # The project is the server's root (the notebooks' ../docs/ links open) and the
    # page opens on notebooks/.
    tree = [
        f'--ServerApp.root_dir="{project}"',
        "--LabApp.default_url=/lab/tree/notebooks",
    ]
    assert lab.split() == [
        ".venv/bin/python", "-m", "jupyterlab", "--ip=127.0.0.1", settings, *tree,
        *root,
    ]  # fmt: skip


def test_make_prefers_the_venv_where_there_is_one(tmp_path):
    project = _project(tmp_path)
    _python(project / ".venv" / "bin" / "python")
    python3 = _python(tmp_path / "bin" / "python3")  # complete too, but not chosen
    done = _run(["make", "--no-print-directory", "-n", "test"], project,
                _env(project, python3.parent))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("bash scripts/setup.sh\n"), done.stdout
    assert ".venv/bin/python -m pytest --timeout=600" in done.stdout
    assert str(python3) not in done.stdout
    # The package is compiled once before the suite starts its many fresh Pythons.
    assert ".venv/bin/python -m compileall -q workshop" in done.stdout
    # OpenMP's threads sleep between parallel regions, unless told otherwise.
    assert "export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}" in done.stdout
    # The suite keeps no record of the lessons in the home of whoever runs it.
    assert "export WORKSHOP_PROGRESS=off" in done.stdout


def test_make_test_shares_the_files_between_workers_where_xdist_is_there(tmp_path):
    # Three workers by default; one process with TEST_WORKERS=1, or where the Python
    # has no pytest-xdist (it is in requirements.txt, not in the test extra).
    project = _project(tmp_path)
    python3 = _python(tmp_path / "bin" / "python3")
    env = _env(project, python3.parent)
    # A package that fails on import hides the real one.
    stand_in = tmp_path / "no-xdist"
    (stand_in / "xdist").mkdir(parents=True)
    (stand_in / "xdist" / "__init__.py").write_text("raise ImportError('hidden')")
    hidden = f"{stand_in}{os.pathsep}{env['PYTHONPATH']}"
    one = "--durations=20  --nbval"
    here = importlib.util.find_spec("xdist") is not None  # else none of them has it
    for args, path, workers in [
        ([], env["PYTHONPATH"], "-n 3 --dist loadfile --nbval" if here else one),
        (
            ["TEST_WORKERS=2"],
            env["PYTHONPATH"],
            "-n 2 --dist loadfile --nbval" if here else one,
        ),
        (["TEST_WORKERS=1"], env["PYTHONPATH"], one),
        ([], hidden, one),
    ]:
        done = _run(["make", "--no-print-directory", "-n", "test", *args], project,
                    {**env, "PYTHONPATH": path})  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert workers in done.stdout, (args, path, done.stdout)


# --- setup.sh: a .venv made another way; apt-get without network ---------------------


def _fake_root_bin(tmp_path: Path) -> Path:
    """A PATH of its own: ``id -u`` says 0 (root), apt-get fails as it does without
    network (and notes each call), and none of the system packages are there."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    real_id = shutil.which("id")
    (bin_dir / "id").write_text(
        f'#!/bin/sh\n[ "$1" = -u ] && echo 0 && exit 0\nexec {real_id} "$@"\n'
    )
    (bin_dir / "apt-get").write_text(
        f'#!/bin/sh\necho "apt-get $*" >> "{tmp_path}/apt.log"\n'
        'echo "E: Could not resolve deb.debian.org" >&2\nexit 100\n'
    )
    for name in ("id", "apt-get"):
        (bin_dir / name).chmod(0o755)
    (bin_dir / "dirname").symlink_to(shutil.which("dirname"))
    return bin_dir


def test_setup_leaves_a_complete_venv_made_another_way(tmp_path):
    project = _project(tmp_path)
    calls = tmp_path / "python-calls.log"
    _python(project / ".venv" / "bin" / "python", log=calls)
    bin_dir = _fake_root_bin(tmp_path)
    env = _env(project, PATH=str(bin_dir))
    done = _run([shutil.which("bash"), "scripts/setup.sh"], project, env)
    assert done.returncode == 0, done.stdout + done.stderr
    venv = project.resolve() / ".venv"
    assert (
        f"[setup] found {venv} made another way (it has no stamp of this script) "
        "and complete:\n"
    ) in done.stdout
    assert "leaving it as it is" in done.stdout
    # Asked (python -c), never installed into (python -m pip); no stamp written.
    asked = calls.read_text().splitlines()
    assert asked[0].startswith("-c ")
    assert not [line for line in asked if line.startswith("-m ")], asked
    assert not (venv / ".workshop-setup-stamp").exists()
    # apt-get failed (no network here): said, and setup went on.
    assert (tmp_path / "apt.log").read_text() == "apt-get update -qq\n"
    packages = (
        "openmpi-bin slurm-wlm munge shellcheck chromium chromium-driver nodejs npm"
    )
    assert (
        "[setup] apt-get update failed; is the package mirror reachable?\n"
        f"[setup]   Going on without {packages}: not in CI, and the notebooks do "
        "not need them;\n"
    ) in done.stdout, done.stdout
    assert f"To have them later: apt-get update && apt-get install {packages}\n" in (
        done.stdout
    )


def test_setup_stops_when_apt_get_fails_in_ci(tmp_path):
    project = _project(tmp_path)
    _python(project / ".venv" / "bin" / "python")
    bin_dir = _fake_root_bin(tmp_path)
    done = _run([shutil.which("bash"), "scripts/setup.sh"], project,
                _env(project, PATH=str(bin_dir), CI="true"))  # fmt: skip
    assert done.returncode == 1
    assert (
        "[setup] ERROR: apt-get update failed; is the package mirror reachable?\n"
        "HINT: run it by hand to see why: apt-get update && apt-get install "
        "openmpi-bin slurm-wlm munge shellcheck chromium chromium-driver"
    ) in done.stderr, done.stderr
    assert "made another way" not in done.stdout


# --- setup.sh: a python3 that the pins have no wheels for (3.10) -------------------

# The Pythons (X.Y) setup.sh says requirements.txt's pins have wheels for.
PINNED = re.search(
    r"^PINNED_PYTHONS=\(([^)]*)\)$", (ROOT / "scripts/setup.sh").read_text(), re.M
)[1].split()
NEEDED = f"they need {PINNED[0]} to {PINNED[-1]}"


def _versioned_python(path: Path, version: str, log: Path) -> Path:
    """A python at ``path`` that notes each call in ``log``, says it is ``version``
    when setup asks (python -c ...), and fails anything else (-m venv, -m pip)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'#!/bin/sh\necho "$0 $*" >> "{log}"\n'
        f'[ "$1" = -c ] && echo {version} && exit 0\nexit 1\n'
    )
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("where", ["PATH", "pyenv"])
def test_setup_picks_a_python_the_pins_support(tmp_path, where):
    assert "3.10" not in PINNED
    project = _project(tmp_path)
    bin_dir = _fake_root_bin(tmp_path)
    log = tmp_path / "python-calls.log"
    _versioned_python(bin_dir / "python3", "3.10.12", log)  # Ubuntu 22.04's
    # A pyenv shim of a version pyenv has not active: it does not run.
    (bin_dir / f"python{PINNED[-1]}").write_text("#!/bin/sh\nexit 127\n")
    (bin_dir / f"python{PINNED[-1]}").chmod(0o755)
    pyenv = tmp_path / "pyenv" / "versions"
    if where == "PATH":
        version = f"{PINNED[0]}.9"
        chosen = _versioned_python(bin_dir / f"python{PINNED[0]}", version, log)
    else:  # the newest patch, and never a free-threaded build (3.X.Yt)
        for name in (f"{PINNED[0]}.4", f"{PINNED[0]}.10", f"{PINNED[-1]}.0t"):
            minor = name.rsplit(".", 1)[0]
            _versioned_python(pyenv / name / "bin" / f"python{minor}", name, log)
        chosen = pyenv / f"{PINNED[0]}.10" / "bin" / f"python{PINNED[0]}"
        version = f"{PINNED[0]}.10"
    env = _env(project, PATH=str(bin_dir), HOME=str(tmp_path),
               PYENV_ROOT=str(pyenv.parent))  # fmt: skip
    done = _run([shutil.which("bash"), "scripts/setup.sh"], project, env)
    # Chosen first, in one line; then the venv is made with it (and fails: a stand-in).
    assert done.stdout.splitlines()[0] == (
        f"[setup] python3 is Python 3.10.12, which requirements.txt's pins have no "
        f"wheels for ({NEEDED}): using {chosen} (Python {version}) instead"
    ), done.stdout
    venv = project.resolve() / ".venv"
    assert f"{chosen} -m venv {venv}" in log.read_text().splitlines()
    assert done.returncode == 1
    assert f"'{chosen} -m venv' failed." in done.stderr


@pytest.mark.parametrize("given", [False, True])
def test_setup_says_which_python_it_needs_and_downloads_nothing(tmp_path, given):
    project = _project(tmp_path)
    bin_dir = _fake_root_bin(tmp_path)
    log = tmp_path / "python-calls.log"
    _versioned_python(bin_dir / "python3", "3.10.12", log)
    extra = {"PYTHON": "python3"} if given else {}
    if given:  # PYTHON=... is the user's choice: refused, never replaced
        _versioned_python(bin_dir / f"python{PINNED[0]}", f"{PINNED[0]}.9", log)
    env = _env(project, PATH=str(bin_dir), HOME=str(tmp_path),
               PYENV_ROOT=str(tmp_path / "no-pyenv"), **extra)  # fmt: skip
    done = _run([shutil.which("bash"), "scripts/setup.sh"], project, env)
    assert done.returncode == 1 and done.stdout == ""
    none = f", and no python{PINNED[0]}..{PINNED[-1]} is on PATH or in pyenv"
    assert done.stderr == (
        f"[setup] ERROR: python3 is Python 3.10.12, which requirements.txt's pins "
        f"have no wheels for ({NEEDED}){'' if given else none}. HINT: apt install "
        "python3.11 python3.11-venv (Ubuntu 22.04), pyenv install 3.12, or module "
        "load python/3.12 (a cluster); then PYTHON=python3.11 make setup\n"
    )
    # Asked its version only; no apt-get, no venv, no pip.
    assert [line.split()[1] for line in log.read_text().splitlines()] == ["-c"]
    assert not (tmp_path / "apt.log").exists()
    assert not (project / ".venv").exists()


def test_setup_refuses_an_unknown_argument(tmp_path):
    project = _project(tmp_path)
    done = _run(["bash", "scripts/setup.sh", "--chek"], project, _env(project))
    assert done.returncode == 1
    assert "unknown argument '--chek'" in done.stderr


# --- make test-fast: the unit tests alone ---------------------------------------------


def test_make_test_fast_leaves_out_every_integration_file_and_the_notebooks(tmp_path):
    # The slow tests live in *_integration.py files beside the unit tests; make
    # test-fast runs tests/ without them, and without the notebooks (make test runs
    # all of it).
    project = _project(tmp_path)
    python3 = _python(tmp_path / "bin" / "python3")
    done = _run(["make", "--no-print-directory", "-n", "test-fast"], project,
                _env(project, python3.parent))  # fmt: skip
    assert done.returncode == 0, done.stderr
    command = next(line for line in done.stdout.splitlines() if " -m pytest " in line)
    assert "--ignore-glob='*_integration.py' tests/" in command, command
    assert "--nbval" not in command and "notebooks" not in command, command


def _starts_shared(path: Path) -> bool:
    """Whether a test file asks for the run's private Slurm cluster or its make lab
    (a fixture argument, or request.getfixturevalue) or imports the browser's
    helpers."""
    shared = {"private_slurm", "make_lab"}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.arg) and node.arg in shared:
            return True
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "getfixturevalue"
            and any(getattr(a, "value", None) in shared for a in node.args)
        ):
            return True
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [node.module] if isinstance(node, ast.ImportFrom) else []
            modules += [alias.name for alias in getattr(node, "names", [])]
            if "browser_helpers" in modules:
                return True
    return False


def test_what_starts_the_runs_cluster_lab_or_browser_is_an_integration_file():
    # A test that uses the run's private Slurm cluster, its make lab or a browser
    # would start them in make test-fast: it belongs in a *_integration.py file.
    found = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "tests").rglob("test_*.py"))
        if not path.stem.endswith("_integration") and _starts_shared(path)
    ]
    assert found == [], "move these tests to *_integration.py files beside them"
