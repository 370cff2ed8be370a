"""workshop.instructor.site_env: ``.venv`` on top of a site's Python that has torch.

The site's Python is stood in for, for real: a venv whose site-packages links every
package this Python sees (copying torch would take 5 GB), like a GPU node's
``python3`` that was a venv holding torch; and this Python's base interpreter, as a
plain install (or a conda environment, by its prefix), with torch on PYTHONPATH as
some modules put it. Each test makes its venvs in a temporary
folder and runs the lines the script prints, or its ``--apply``. Nothing downloads:
pip runs with PIP_NO_INDEX=1.

What this Python has installed, and which of torch's requirements it does not meet
(read as pip reads them, with the standard library only), is tried on stand-ins:
installed distributions as dist-info folders (a METADATA file each) in a temporary
folder, the path the functions look in.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import ROOT

from workshop.__main__ import main
from workshop.instructor import site_env
from workshop.instructor.site_env import (
    OTHER_REQUIREMENTS,
    SiteEnvError,
    SitePython,
    check_site_python,
    find_package,
    kind_of,
    unmet_requirements,
)

SCRIPT = ROOT / "workshop" / "instructor" / "site_env.py"
PY = f"python{sys.version_info.major}.{sys.version_info.minor}"
# This torch, and the Python this one was made from.
TORCH_VERSION = importlib.metadata.version("torch")
BASE_PYTHON = Path(sys.base_prefix) / "bin" / PY


def _env(**extra: str) -> dict[str, str]:
    """This environment without what would show a child other packages or change
    pip's ways, and with pip kept off the network."""
    hidden = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in hidden and not k.startswith("PIP_")
    }
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def _run(
    command: list[str | Path], cwd: Path, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in command],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _printed_lines(out: str, header: str) -> list[str]:
    """The indented lines under the first line of ``out`` that starts with
    ``header``."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    found = []
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        found.append(line.strip())
    return found


def _torch_origin(python: Path, cwd: Path, **env: str) -> str:
    """Where ``python`` finds torch, without importing it: "None" where it does not."""
    code = "import importlib.util as u; s = u.find_spec('torch'); print(s and s.origin)"
    done = _run([python, "-c", code], cwd, **env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_python_install_without_torch_is_told_to_load_the_module(tmp_path):
    if _torch_origin(BASE_PYTHON, tmp_path) != "None":
        pytest.skip(f"{BASE_PYTHON} has a torch of its own")
    done = _run([BASE_PYTHON, SCRIPT], tmp_path)
    assert done.returncode == 1
    assert "cannot import torch" in done.stderr
    assert "HINT: load the site's PyTorch module first" in done.stderr


def test_kind_of_tells_a_conda_prefix_from_a_plain_one_and_a_venv(tmp_path):
    assert kind_of(tmp_path, tmp_path) == "plain"
    (tmp_path / "conda-meta").mkdir()
    assert kind_of(tmp_path, tmp_path) == "conda"
    assert kind_of(tmp_path / "venv", tmp_path) == "venv"


# ------------------------------------------------------------------ in this process
def _python(**changes: object) -> SitePython:
    found = SitePython(
        executable="/site/bin/python",
        version=(3, 12),
        kind="venv",
        prefix="/site",
        base_prefix="/usr",
        sees_base=False,
        own_site_dirs=("/site/lib/python3.12/site-packages",),
        torch_version="2.11.0+cu130",
        torch_dir="/site/lib/python3.12/site-packages",
        torch_metadata=True,
        torchvision_version="0.26.0+cu130",
        has_setuptools=True,
    )
    return replace(found, **changes)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"version": (3, 9)}, r"\(Python 3\.9\) is older than Python 3\.10"),
        ({"torch_version": None}, r"cannot import torch.*\nHINT: load the site's"),
        ({"torch_version": "2.3.1"}, r"has torch 2\.3\.1 .*needs torch 2\.4 or newer"),
        ({"prefix": "/work/.venv"}, r"is the Python of /work/\.venv itself\.\nHINT"),
    ],
)
def test_check_refuses_what_cannot_carry_the_workshop(changes, message):
    with pytest.raises(SiteEnvError, match=message):
        check_site_python(_python(**changes), Path("/work/.venv"))


@pytest.mark.parametrize("version", ["2.4.0", "2.11.0+cu130", "unknown"])
def test_check_takes_torch_2_4_and_newer(version):
    check_site_python(_python(torch_version=version), Path("/work/.venv"))


def test_python_m_workshop_site_env_describes_this_python(capsys):
    assert main(["site-env", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["kind"] == kind_of(sys.prefix, sys.base_prefix)
    assert found["torch_version"] == TORCH_VERSION
    assert main(["site-env", "--venv", sys.prefix]) == 1
    assert "itself" in capsys.readouterr().err


def test_with_a_wheelhouse_the_install_lines_use_no_index(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(site_env, "WHEELHOUSE", tmp_path / "wheelhouse")
    monkeypatch.setattr(site_env, "unmet_requirements", lambda name: ())  # all met
    (tmp_path / "wheelhouse").mkdir()
    (tmp_path / "wheelhouse" / "requirements-offline.txt").write_text("numpy\n")
    assert main(["site-env", "--venv", "v"]) == 0  # a list, no wheels: PyPI
    out = capsys.readouterr().out
    assert f"v/bin/pip install -e '{ROOT}[lab,test]' torch=={TORCH_VERSION}" in out
    (tmp_path / "wheelhouse" / "numpy-2.0-py3-none-any.whl").write_text("")
    assert main(["site-env", "--venv", "v"]) == 0
    lines = _printed_lines(capsys.readouterr().out, "Then install")
    assert lines == [
        "v/bin/pip install --no-index --find-links wheelhouse "
        "-r wheelhouse/requirements-offline.txt",
        f"v/bin/pip install --no-index --find-links wheelhouse --no-deps -e {ROOT}",
    ]


# ------------------------------------------------------- torch's own requirements
def test_a_torch_with_unmet_requirements_gets_the_workshop_with_no_deps(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(site_env, "WHEELHOUSE", tmp_path / "wheelhouse")
    unmet = ("setuptools<82 (found 82.0)",)
    monkeypatch.setattr(site_env, "unmet_requirements", lambda name: unmet)
    assert main(["site-env", "--venv", "v"]) == 0
    out = capsys.readouterr().out
    others = " ".join(f"'{r}'" for r in site_env.OTHER_REQUIREMENTS)
    assert _printed_lines(out, "Then install") == [
        f"v/bin/pip install {others}",
        f"v/bin/pip install --no-deps -e {ROOT}",
    ]
    assert (
        f"WARNING: torch {TORCH_VERSION} asks for what this Python lacks: "
        "setuptools<82 (found 82.0).\npip, resolving torch's requirements, would "
        "download them" in out
    )
    assert "HINT: the workshop with --no-deps, as above" in out


# ---- what this Python has installed, and torch's unmet requirements -------------


def _dist_info(folder: Path, name: str, version: str, *requires: str) -> None:
    """An installed distribution as importlib.metadata finds it: a dist-info."""
    info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n\nA description.\n")


def test_unmet_requirements_reads_markers_and_versions_as_pip_does(tmp_path):
    # The GPU node's case first: torch 2.11 asks for setuptools<82 beside 82.0.
    _dist_info(
        tmp_path,
        "torch",
        "2.11.0+cu130",
        'setuptools<82; python_version >= "3.10"',
        "filelock",
        "sympy>=1.13.3",
        "networkx (>=2.5.1)",
        'triton~=3.5.0; python_version < "4" or os_name == "nonesuch"',
        'nvidia-nccl-cu13==2.27.*; python_version >= "3" and os_name != "nonesuch"',
        "cuda-toolkit[cublas,cudart]==13.0.2",
        "site-env-stand-in<2,>=1.0",
        'old-python-only<1; python_version < "3.10"',  # not for this Python
        'optree>=0.13.0; extra == "optree"',  # only with torch[optree]
        'odd>=1; (python_version >= "3")',  # brackets: not read, left out
    )
    _dist_info(tmp_path, "setuptools", "82.0")
    _dist_info(tmp_path, "filelock", "3.20.0")
    _dist_info(tmp_path, "sympy", "1.14.0")
    _dist_info(tmp_path, "networkx", "2.5")
    _dist_info(tmp_path, "triton", "3.5.1")
    _dist_info(tmp_path, "nvidia-nccl-cu13", "2.28.9")
    _dist_info(tmp_path, "cuda-toolkit", "13.0.2")
    assert unmet_requirements("torch", [str(tmp_path)]) == (
        "setuptools<82 (found 82.0)",
        "networkx>=2.5.1 (found 2.5)",
        "nvidia-nccl-cu13==2.27.* (found 2.28.9)",
        "site-env-stand-in<2,>=1.0 (not installed)",
    )
    assert unmet_requirements("absent", [str(tmp_path)]) == ()


@pytest.mark.parametrize(
    ("version", "clause", "met"),
    [
        ("82.0", "<82", False),
        ("81.9.1", "<82", True),
        ("82", "==82.0", True),
        ("2.11.0+cu130", ">=2.4", True),
        ("2.11.0+cu130", "==2.11.0", True),
        ("3.10", ">3.9", True),  # by number, not as text
        ("3.5.9", "~=3.5.0", True),
        ("3.6.0", "~=3.5.0", False),
        ("2.28.9", "!=2.27.*", True),
        ("1.0", "===1.0", True),
        ("1.0", "<=0.9", False),
    ],
)
def test_each_version_operator(tmp_path, version, clause, met):
    _dist_info(tmp_path, "torch", "2.11.0", f"needed{clause}")
    _dist_info(tmp_path, "needed", version)
    unmet = unmet_requirements("torch", [str(tmp_path)])
    assert unmet == (() if met else (f"needed{clause} (found {version})",))


@pytest.mark.parametrize(
    ("marker", "applies"),
    [
        (f'python_version == "{sys.version_info[0]}.{sys.version_info[1]}"', True),
        ('python_version < "3.10"', False),
        (f"sys_platform == '{sys.platform}' and os_name != 'nonesuch'", True),
        ('os_name == "nonesuch" or python_full_version >= "3.10.0"', True),
        ('"linux" in sys_platform or "linux" not in sys_platform', True),
        ('extra == "test"', False),
        ('platform_machine == "nonesuch"', False),
    ],
)
def test_markers_for_this_python(tmp_path, marker, applies):
    _dist_info(tmp_path, "torch", "2.11.0", f"missing>=1; {marker}")
    unmet = unmet_requirements("torch", [str(tmp_path)])
    assert unmet == (("missing>=1 (not installed)",) if applies else ())


def test_find_package_without_importing_it():
    version, folder, metadata = find_package("cloudpickle")
    assert metadata and (folder / "cloudpickle" / "__init__.py").is_file()
    assert version == importlib.metadata.version("cloudpickle")
    assert find_package("site_env_no_such_package") == (None, None, False)


def test_the_other_requirements_are_pyprojects_but_torch_and_torchvision():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and newer
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [*project["dependencies"], *extras["lab"], *extras["test"]]
    name = re.compile(r"[A-Za-z0-9][\w.-]*")
    rest = [r for r in wanted if name.match(r)[0] not in ("torch", "torchvision")]
    assert list(OTHER_REQUIREMENTS) == rest
