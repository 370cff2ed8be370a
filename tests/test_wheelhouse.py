"""scripts/wheelhouse.sh and `make wheelhouse`: wheels for a compute node offline.

Nothing here downloads: every run is a dry run (--dry-run or DRY_RUN=1), which
prints the pip commands and the requirement list it would write, or an error.
pip runs on this interpreter (WHEELHOUSE_PYTHON), so PY is its version unless a
test is about a different one.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "wheelhouse.sh"
WHEELHOUSE = ROOT / "wheelhouse"
THIS_PY = f"{sys.version_info.major}.{sys.version_info.minor}"
TORCH_FAMILY = ("torch", "torchvision", "torchaudio", "triton")


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PY", "PLATFORM", "DRY_RUN", "WHEELHOUSE_PYTHON")
    }
    env["WHEELHOUSE_PYTHON"] = sys.executable
    env.update(extra)
    return env


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _dry_run(**env: str) -> str:
    result = _run("--dry-run", **env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _command(out: str, pip_verb: str) -> list[str]:
    """The printed command line that runs `python -m pip <pip_verb>`, split."""
    for line in out.splitlines():
        words = shlex.split(line)
        if words[1:4] == ["-m", "pip", pip_verb]:
            return words
    raise AssertionError(f"no 'pip {pip_verb}' command in:\n{out}")


def _options(words: list[str], name: str) -> list[str]:
    return [words[i + 1] for i, w in enumerate(words) if w == name]


def _listed_requirements(out: str) -> list[str]:
    """The lines the dry run says it would write to requirements-offline.txt."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "would write" in line)
    end = next(i for i, line in enumerate(lines) if "and run:" in line)
    return [line.strip() for line in lines[start + 1 : end]]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = str(req.specifier)
    return pins


def _is_torch_family(name: str) -> bool:
    name = canonicalize_name(name)
    return name in TORCH_FAMILY or name.startswith(("nvidia-", "cuda-"))


def test_dry_run_prints_pip_download_for_the_node_python_and_platform() -> None:
    out = _dry_run(PY=THIS_PY, PLATFORM="manylinux_2_28_x86_64")
    words = _command(out, "download")
    assert words[0] == sys.executable
    assert "--only-binary=:all:" in words
    assert _options(words, "--python-version") == [THIS_PY]
    assert _options(words, "--implementation") == ["cp"]
    assert _options(words, "--dest") == [str(WHEELHOUSE)]
    assert _options(words, "-r") == [str(WHEELHOUSE / "requirements-offline.txt")]
    platforms = _options(words, "--platform")
    # A glibc 2.28 node takes every manylinux tag up to 2.28, the legacy names
    # included (pip does not widen manylinux_2_28 by itself), and nothing newer.
    assert platforms[0] == "manylinux_2_28_x86_64"
    for tag in (
        "manylinux_2_27_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux_2_5_x86_64",
        "manylinux2014_x86_64",
        "manylinux2010_x86_64",
        "manylinux1_x86_64",
    ):
        assert tag in platforms, f"{tag} missing from {platforms}"
    assert "manylinux_2_29_x86_64" not in platforms
    assert len(platforms) == len(set(platforms)) == 24 + 3
    # setuptools, so that `pip install --no-index --find-links wheelhouse -e .` can
    # build the editable install on the node.
    assert "setuptools>=64" in words

    wheel = _command(out, "wheel")
    assert wheel[4:] == ["--no-deps", "--wheel-dir", str(WHEELHOUSE), str(ROOT)]


def test_dry_run_lists_every_pin_but_torch_and_writes_nothing() -> None:
    before = sorted(WHEELHOUSE.iterdir()) if WHEELHOUSE.exists() else None
    out = _dry_run(PY=THIS_PY)
    after = sorted(WHEELHOUSE.iterdir()) if WHEELHOUSE.exists() else None
    assert before == after, "a dry run changed wheelhouse/"

    listed = {
        canonicalize_name(Requirement(r).name): r for r in _listed_requirements(out)
    }
    # JupyterHub and batchspawner serve make portal's private hub, not a node.
    portal = {"jupyterhub", "batchspawner"}
    expected = {n for n in _pins() if not _is_torch_family(n) and n not in portal}
    assert set(listed) == expected
    for name, line in listed.items():
        assert line == f"{Requirement(line).name}{_pins()[name]}", "pin changed"
    assert not [n for n in listed if _is_torch_family(n)]


def test_the_package_dependencies_and_extras_are_all_in_the_wheelhouse_list() -> None:
    tomllib = pytest.importorskip("tomllib", reason="Python 3.10 has no tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in ("lab", "test"):
        wanted += project["optional-dependencies"][extra]
    names = {canonicalize_name(Requirement(r).name) for r in wanted}
    listed = {
        canonicalize_name(Requirement(r).name)
        for r in _listed_requirements(_dry_run(PY=THIS_PY))
    }
    assert names - listed == {"torch", "torchvision"}


def test_an_arm_platform_gives_arm_tags_from_glibc_2_17() -> None:
    words = _command(
        _dry_run(PY=THIS_PY, PLATFORM="manylinux_2_28_aarch64"), "download"
    )
    platforms = _options(words, "--platform")
    assert all(p.endswith("_aarch64") for p in platforms), platforms
    assert platforms[0] == "manylinux_2_28_aarch64"
    assert platforms[-2:] == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]
    assert not [p for p in platforms if p.startswith(("manylinux1", "manylinux2010"))]


def test_default_platform_is_glibc_2_28_x86_64() -> None:
    words = _command(_dry_run(PY=THIS_PY), "download")
    assert _options(words, "--platform")[0] == "manylinux_2_28_x86_64"


@pytest.mark.parametrize(
    ("py", "platform", "message"),
    [
        ("3.8", "", r"PY=3\.8 is below the workshop's minimum, Python 3\.10"),
        ("2.7", "", r"PY=2\.7 is below the workshop's minimum"),
        ("312", "", r"PY='312' is not a Python version\.\nHINT: .*PY=3\.12"),
        ("python3.12", "", r"PY='python3\.12' is not a Python version"),
        (THIS_PY, "win_amd64", r"PLATFORM='win_amd64' is not a manylinux platform"),
        (THIS_PY, "manylinux_2_28_sparc", r"unknown CPU 'sparc'"),
        (THIS_PY, "manylinux2010_aarch64", r"no aarch64 wheels for glibc older"),
    ],
)
def test_bad_py_or_platform_is_refused_with_a_hint(
    py: str, platform: str, message: str
) -> None:
    result = _run("--dry-run", PY=py, PLATFORM=platform)
    assert result.returncode == 1
    assert "[wheelhouse] ERROR:" in result.stderr
    assert re.search(message, result.stderr), result.stderr
    assert "HINT:" in result.stderr
    assert "pip download" not in result.stdout


@pytest.mark.skipif(sys.version_info < (3, 11), reason="needs a Python above 3.10")
def test_pip_on_a_newer_python_than_the_node_is_refused() -> None:
    # pip resolves environment markers for the Python it runs on: on 3.11+ it would
    # leave out tomli and exceptiongroup, which pytest needs on 3.10.
    older = f"3.{sys.version_info.minor - 1}"
    result = _run("--dry-run", PY=older)
    assert result.returncode == 1
    assert f"resolves for {THIS_PY}, not PY={older}" in result.stderr
    assert f"WHEELHOUSE_PYTHON=/path/to/python{older}" in result.stderr


def test_pip_on_an_older_python_than_the_node_only_warns() -> None:
    newer = f"3.{sys.version_info.minor + 1}"
    out = _dry_run(PY=newer)
    assert f"adds a few wheels only {THIS_PY} needs" in out
    assert _options(_command(out, "download"), "--python-version") == [newer]


def test_unknown_argument_is_refused() -> None:
    result = _run("--download-torch")
    assert result.returncode == 1
    assert "unknown argument '--download-torch'" in result.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_wheelhouse_passes_py_platform_and_dry_run_through() -> None:
    result = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-C",
            str(ROOT),
            "wheelhouse",
            "DRY_RUN=1",
            f"PY={THIS_PY}",
            "PLATFORM=manylinux_2_34_aarch64",
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    words = _command(result.stdout, "download")
    assert _options(words, "--python-version") == [THIS_PY]
    assert _options(words, "--platform")[0] == "manylinux_2_34_aarch64"
    assert "dry run: would write" in result.stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_wheelhouse_is_git_ignored() -> None:
    result = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "-q", "wheelhouse/numpy.whl"],
        capture_output=True,
        timeout=30,
    )
    if result.returncode == 128:
        pytest.skip("not a git checkout")
    assert result.returncode == 0, "wheelhouse/ is not in .gitignore"


def test_the_closing_lines_make_the_venv_with_site_env_not_a_bare_venv(
    tmp_path: Path,
) -> None:
    # A real run ends with print_instructions; sourcing the script defines it and runs
    # nothing else. A venv made with --system-site-packages on top of a module whose
    # Python is itself a venv does not see its torch (a GPU node, issue 23).
    (tmp_path / "scaling_pytorch_hpc-0.1.0-py3-none-any.whl").write_bytes(b"")
    call = 'source "$1"; DEST="$2" PY=3.12 print_instructions'
    result = subprocess.run(
        ["bash", "-c", call, "_", str(SCRIPT), str(tmp_path)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("[wheelhouse] done: 1 wheels, "), "main ran"
    commands = [
        line.strip()
        for line in result.stdout.splitlines()
        if line.startswith("  ") and not line.strip().startswith("#")
    ]
    start = commands.index(
        "module load pytorch                  # its Python must be 3.12"
    )
    assert commands[start + 1 : start + 4] == [
        "python workshop/instructor/site_env.py --apply",
        ".venv/bin/pip install --no-index --find-links wheelhouse "
        "-r wheelhouse/requirements-offline.txt",
        ".venv/bin/pip install --no-index --find-links wheelhouse --no-deps -e .",
    ]
    assert not [c for c in commands if "-m venv" in c], "a bare venv is back"
    # The path named is the script's, in the tree and inside the workshop's wheel.
    wheel_copy = "python workshop-wheel/workshop/instructor/site_env.py --apply"
    assert wheel_copy in commands
    assert (ROOT / "workshop" / "instructor" / "site_env.py").is_file()
