"""workshop.instructor.site_requirements: what this Python has installed, and which of
torch's requirements it does not meet, read as pip reads them with the standard
library only. Installed distributions are stood in for by dist-info folders (a
METADATA file each) in a temporary folder, the path the functions look in.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from workshop.instructor.site_requirements import (
    OTHER_REQUIREMENTS,
    find_package,
    unmet_requirements,
)


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
