"""The build and setup files agree with each other and with the running interpreter.

requirements.txt holds the exact versions; environment.yml must repeat them for
conda users; pyproject.toml holds compatible ranges that admit a cluster's torch;
and the environment running the tests must be the pinned one (a stale .venv fails).
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "requirements.txt"
ENVIRONMENT = ROOT / "environment.yml"
PYPROJECT = ROOT / "pyproject.toml"
CI_RUN = ROOT / ".ci" / "run"
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"

_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;#]+)$")


def _parse_pins(lines: list[str], where: str) -> dict[str, str]:
    """Return {canonical name: version} from `name==version` lines.

    Blank lines and comments are skipped; any other line raises ValueError, so a
    `>=` or a stray option cannot slip into a pinned list.
    """
    pins: dict[str, str] = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = _PIN.match(line)
        if not match:
            raise ValueError(f"{where}: {line!r} is not an exact pin (name==version)")
        name = canonicalize_name(match["name"])
        if name in pins:
            raise ValueError(f"{where}: {match['name']} is pinned twice")
        pins[name] = match["version"]
    return pins


def _requirements() -> dict[str, str]:
    return _parse_pins(REQUIREMENTS.read_text().splitlines(), "requirements.txt")


def _environment_pip_lines() -> list[str]:
    """The entries of environment.yml's `- pip:` list, without the leading `- `.

    A small parser for the one shape this file has, so that no YAML library is needed.
    """
    entries: list[str] = []
    pip_indent: int | None = None
    for raw in ENVIRONMENT.read_text().splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(raw) - len(raw.lstrip())
        if pip_indent is None:
            if stripped == "- pip:":
                pip_indent = indent
            continue
        if indent <= pip_indent:
            break
        assert stripped.startswith("- "), f"environment.yml: unexpected line {raw!r}"
        entries.append(stripped[2:].strip())
    assert pip_indent is not None, "environment.yml has no '- pip:' section"
    return entries


def _environment_pins() -> dict[str, str]:
    lines = [e for e in _environment_pip_lines() if e != "-e ."]
    return _parse_pins(lines, "environment.yml pip section")


def test_requirements_and_environment_pin_the_same_versions() -> None:
    req, env = _requirements(), _environment_pins()
    differ = []
    for name in sorted(set(req) | set(env)):
        if name not in env:
            differ.append(f"{name}=={req[name]} only in requirements.txt")
        elif name not in req:
            differ.append(f"{name}=={env[name]} only in environment.yml")
        elif req[name] != env[name]:
            differ.append(
                f"{name}: requirements.txt {req[name]}, environment.yml {env[name]}"
            )
    assert not differ, f"requirements.txt and environment.yml differ: {differ}"


def test_environment_installs_the_package_editable() -> None:
    entries = _environment_pip_lines()
    assert "-e ." in entries, f"environment.yml's pip section lacks '-e .': {entries}"


def test_requirements_pin_torch_and_torchvision_exactly() -> None:
    # _requirements() already raises on any line that is not name==version.
    req = _requirements()
    assert req.get("torch") == "2.15.0", f"torch pinned to {req.get('torch')}"
    assert req.get("torchvision") == "0.29.2", (
        f"torchvision pinned to {req.get('torchvision')}"
    )


def test_requirements_reject_anything_but_exact_pins() -> None:
    with pytest.raises(ValueError, match=r"'torch>=2.4' is not an exact pin"):
        _parse_pins(["torch>=2.4"], "example")


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="Python 3.10 has no tomllib")
    with PYPROJECT.open("rb") as f:
        return tomllib.load(f)


def test_pyproject_dependencies_are_ranges_that_admit_torch_2_4() -> None:
    deps = [Requirement(d) for d in _pyproject()["project"]["dependencies"]]
    pinned = [
        str(d) for d in deps if any(s.operator in ("==", "===") for s in d.specifier)
    ]
    assert not pinned, (
        f"pyproject.toml dependencies must be ranges, found pins: {pinned}"
    )
    torch = [d for d in deps if canonicalize_name(d.name) == "torch"]
    assert torch, "pyproject.toml does not depend on torch"
    assert torch[0].specifier.contains(Version("2.4.0")), (
        f"pyproject.toml's torch range {torch[0].specifier} rejects torch 2.4.0, "
        "which cluster modules still provide"
    )


def test_pinned_versions_lie_inside_pyproject_ranges() -> None:
    project = _pyproject()["project"]
    ranges = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        ranges += extra
    req = _requirements()
    outside = []
    for spec in map(Requirement, ranges):
        version = req.get(canonicalize_name(spec.name))
        if version is not None and not spec.specifier.contains(Version(version)):
            outside.append(f"{spec.name}=={version} not in {spec.specifier}")
    assert not outside, (
        f"requirements.txt pins outside pyproject.toml ranges: {outside}"
    )


# A stand-in for make: logs its arguments, and fails for the targets FAIL names.
FAKE_MAKE = """#!/bin/sh
echo "$*" >> "$MAKE_LOG"
case " $FAIL " in *" $1 "*) exit 2;; esac
exit 0
"""


@pytest.mark.parametrize(
    ("fail", "status"),
    [("", 0), ("test", 2), ("test-site", 2), ("test test-site", 2)],
)
def test_ci_runs_make_test_then_make_test_site(fail, status, tmp_path) -> None:
    import subprocess

    bin_dir, log = tmp_path / "bin", tmp_path / "make.log"
    bin_dir.mkdir()
    (bin_dir / "make").write_text(FAKE_MAKE)
    (bin_dir / "make").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MAKE_LOG": str(log), "FAIL": fail}
    run = subprocess.run(
        ["bash", str(CI_RUN)], env=env, capture_output=True, text=True, timeout=60
    )
    # Both run, in this order, whichever fails: one landing shows both results.
    assert log.read_text().splitlines() == ["test", "test-site"], run.stderr
    assert run.returncode == status, run.stderr
    assert ("failed" in run.stderr) == bool(status)


def test_sanitiser_replaces_what_changes_between_runs() -> None:
    from nbval.plugin import get_sanitize_patterns

    patterns = get_sanitize_patterns(SANITIZE.read_text())
    assert len(patterns) == 15, f"nbval read {len(patterns)} patterns: {patterns}"

    def sanitize(text: str) -> str:
        for regex, replace in patterns:
            text = re.sub(regex, replace, text)
        return text

    cases = {
        "step took 0.123 s": "step took TIME",
        "epoch in 1.2s": "epoch in TIME",
        "listening on port 29500": "listening on port PORT",
        "MASTER_PORT=29511": "MASTER_PORT=PORT",
        "rank 1 pid 4242": "rank 1 pid PID",
        "<Tensor at 0x7f3a2c1b4d60>": "<Tensor at 0xADDRESS>",
        "4 steps, rank 3": "4 steps, rank 3",
        "rank 0: local rank 0 on node 0 (host vm), cpu": (
            "rank 0: local rank 0 on node 0 (host HOST), cpu"
        ),
        "--rdzv_endpoint=127.0.0.1:59133": "--rdzv_endpoint=127.0.0.1:PORT",
        "Sending process 21133 closing signal": "Sending process PID closing signal",
        "    cell In[15], line 5, in fn": "    cell In[N], line 5, in fn",
        "   CPUAlloc=0 CPUTot=2 CPULoad=1.43": "   CPUAlloc=0 CPUTot=2 CPULoad=N",
        "   RealMemory=1000 FreeMem=19685": "   RealMemory=1000 FreeMem=N",
        "  available         22.8 GiB available (all of this machine's)": (
            "  available         N GiB available (all of this machine's)"
        ),
        "activations: 12.5 GiB": "activations: 12.5 GiB",
        # A training run's digits, by their shape; the claim printed beside them is
        # left alone (tests/test_stored_outputs_integration.py runs a cell on other
        # CPUs).
        "epoch 2/3  loss 0.326  accuracy 0.952  eval accuracy 0.972": (
            "epoch 2/3  loss N.NNN  accuracy N.NNN  eval accuracy N.NNN"
        ),
        "    2  0.326     0.952          0.972": (
            "    2  N.NNN     N.NNN          N.NNN"
        ),
        "eval accuracy above 0.95 after 3 epochs: True": (
            "eval accuracy above 0.95 after 3 epochs: True"
        ),
        "done: weight checksum 258.096515": "done: weight checksum N",
        "  lo counted 16.02 MB per rank, headers and acks included; within 5% above: "
        "True": "  lo counted N MB per rank, headers and acks included; within 5% "
        "above: True",
        "2 ranks: 16.00 MB sent per rank": "2 ranks: 16.00 MB sent per rank",
        "USDT:2026-11-26 03:29:48 11317:11317 SyncActivityProfilerHandler.cpp:39] x": (
            "USDT:TIME PID SyncActivityProfilerHandler.cpp:39] x"
        ),
    }
    got = {text: sanitize(text) for text in cases}
    assert got == cases, f"sanitised outputs differ from expected: {got}"


def _in_pinned_environment() -> bool:
    """True in this project's .venv or the conda environment from environment.yml."""
    prefix = Path(sys.prefix).resolve()
    return prefix == (ROOT / ".venv").resolve() or prefix.name == "scaling-pytorch-hpc"


@pytest.mark.skipif(
    not _in_pinned_environment(),
    reason=f"not the workshop's pinned environment (sys.prefix={sys.prefix}); "
    "installed versions are checked only in .venv or the conda environment",
)
def test_installed_versions_match_requirements() -> None:
    stale = {}
    for name, pinned in _requirements().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "not installed"
        # torch and torchvision report a local build tag, e.g. 2.15.0+cu132.
        if installed.split("+", 1)[0] != pinned:
            stale[name] = f"installed {installed}, requirements.txt {pinned}"
    assert not stale, f"{sys.prefix} is stale, run `make setup`: {stale}"
