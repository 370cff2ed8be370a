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
import shutil
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
# The workshop's own install: the stand-in site must not carry it.
OWN = ("__editable__", "scaling_pytorch_hpc", "_scaling_pytorch_hpc", "workshop")


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


def _packages(venv: Path) -> Path:
    return venv / "lib" / PY / "site-packages"


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


def _package_folders() -> list[Path]:
    """The folders on this Python's path that hold installed distributions: its
    site-packages, and the folders on PYTHONPATH that pip --target filled."""
    folders = []
    for entry in dict.fromkeys(sys.path):
        folder = Path(entry or ".")
        if folder.is_dir() and any(folder.glob("*.dist-info")):
            folders.append(folder)
    return folders


def _make_site(venv: Path, asks: str | None = None) -> Path:
    """A venv whose site-packages links every package this Python sees; ``asks``,
    a requirement added to its torch's metadata."""
    made = _run([sys.executable, "-m", "venv", "--without-pip", venv], venv.parent)
    assert made.returncode == 0, made.stderr
    packages = _packages(venv)
    # What Python would find first, first: a name, or a project's metadata, is taken
    # from the first folder that has it.
    names, projects = set(), set()
    for folder in _package_folders():
        for entry in sorted(folder.iterdir()):
            name = entry.name
            if name.startswith(OWN) or entry.suffix == ".pth" or name in names:
                continue
            if entry.suffix in (".dist-info", ".egg-info"):
                project = name.split("-")[0].lower().replace("_", "-")
                if project in projects:
                    continue
                projects.add(project)
            if name != "__pycache__":
                names.add(name)
                (packages / name).symlink_to(entry)
    # A .pth of its own, as a real one may have: .venv must see what it adds too.
    extra = venv / "extra"
    extra.mkdir()
    (extra / "site_env_marker.py").write_text("")
    (packages / "extra.pth").write_text(f"{extra}\n")
    if asks:  # torch's dist-info, its files linked but METADATA, which asks more
        linked = next(packages.glob("torch-*.dist-info"))
        info = linked.resolve()
        linked.unlink()
        linked.mkdir()
        for entry in info.iterdir():
            if entry.name != "METADATA":
                (linked / entry.name).symlink_to(entry)
        head, rest = (info / "METADATA").read_text().split("\n\n", 1)
        text = f"{head}\nRequires-Dist: {asks}\n\n{rest}"
        (linked / "METADATA").write_text(text)
    return venv


@pytest.fixture(scope="module")
def site_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stand-in for a node's ``python3`` that is a venv holding torch."""
    if importlib.util.find_spec("ensurepip") is None:
        pytest.skip("this Python has no ensurepip to make venvs with pip")
    return _make_site(tmp_path_factory.mktemp("site") / "venv")


# A requirement no index has, that the torch of site_venv_asking asks for.
ASKED = "site-env-stand-in>=1.0"


@pytest.fixture(scope="module")
def site_venv_asking(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As site_venv, its torch asking for a package that is not there: as the GPU
    node's torch 2.11 asked for setuptools<82, which its Python did not have."""
    if importlib.util.find_spec("ensurepip") is None:
        pytest.skip("this Python has no ensurepip to make venvs with pip")
    return _make_site(tmp_path_factory.mktemp("asking") / "venv", asks=ASKED)


def _copy_project(into: Path) -> Path:
    """The project's package and metadata, to install without touching the checkout."""
    project = into / "project"
    shutil.copytree(
        ROOT / "workshop",
        project / "workshop",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    return project


# ------------------------------------------------------------------ the node's finding
def test_a_venv_made_from_a_venv_does_not_see_its_torch(site_venv, tmp_path):
    python = site_venv / "bin" / "python"
    assert _torch_origin(python, tmp_path).startswith(str(_packages(site_venv)))
    if _torch_origin(BASE_PYTHON, tmp_path) != "None":
        pytest.skip(f"{BASE_PYTHON} has a torch of its own")
    made = _run(
        [python, "-m", "venv", "--without-pip", "--system-site-packages", "c"],
        tmp_path,
    )
    assert made.returncode == 0, made.stderr
    # It is made from the base, so it sees the base's packages, not the site venv's.
    assert _torch_origin(tmp_path / "c" / "bin" / "python", tmp_path) == "None"


# ------------------------------------------------------------------ a venv as the site
def test_describe_finds_the_site_venv_and_its_torch(site_venv, tmp_path):
    done = _run([site_venv / "bin" / "python", SCRIPT, "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["kind"] == "venv"
    assert found["prefix"] == str(site_venv)
    assert found["sees_base"] is False
    assert found["own_site_dirs"] == [str(_packages(site_venv))]
    assert found["torch_dir"] == str(_packages(site_venv))
    assert found["torch_version"] == TORCH_VERSION
    assert found["torch_metadata"] is True


def _project(requirement: str) -> str:
    """The normalised project name of a requirement: Site_Env.x>=1 is site-env-x."""
    name = re.match(r"[A-Za-z0-9][\w.-]*", requirement).group()
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.parametrize("site", ["site_venv", "site_venv_asking"])
def test_the_printed_lines_give_a_venv_on_the_site_torch_that_pip_sees(
    site, request, tmp_path
):
    site_venv = request.getfixturevalue(site)
    python = site_venv / "bin" / "python"
    seen = _run([python, SCRIPT, "--json"], tmp_path)
    assert seen.returncode == 0, seen.stderr
    # torch's requirements that the site does not meet: none here, ASKED where it is
    # asked for; on the GPU node setuptools<82, beside a newer setuptools.
    unmet = json.loads(seen.stdout)["torch_unmet"]
    if site == "site_venv_asking":
        assert f"{ASKED} (not installed)" in unmet
    shown = _run([python, SCRIPT, "--venv", ".venv"], tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "A .pth file in .venv adds this venv's" in shown.stdout
    lines = _printed_lines(shown.stdout, "Make .venv")
    assert lines[0] == f"{python} -m venv .venv"
    assert lines[1].endswith(f"> .venv/lib/{PY}/site-packages/workshop-site.pth")
    script = "set -euo pipefail\n" + "\n".join(lines)
    made = _run(["bash", "-c", script], tmp_path, timeout=300)
    assert made.returncode == 0, made.stderr
    venv_python = tmp_path / ".venv" / "bin" / "python"
    packages = str(_packages(site_venv))

    # pip resolves the workshop's requirements with no index: torch>=2.4 is the
    # site's, seen through the .pth file; so are torch's own requirements, where
    # the site meets them.
    project = _copy_project(tmp_path)
    pip = [venv_python, "-m", "pip", "install", "--no-build-isolation"]
    done = _run([*pip, "-e", project], tmp_path, timeout=300)
    broken = _run([venv_python, "-m", "pip", "check"], tmp_path).stdout
    torch_broken = [line for line in broken.splitlines() if line.startswith("torch ")]
    if not unmet:
        assert done.returncode == 0, done.stdout + done.stderr
        satisfied = [
            line for line in done.stdout.splitlines() if "satisfied: torch>=2.4" in line
        ]
        assert satisfied and packages in satisfied[0], done.stdout
        assert not torch_broken, broken
        assert "WARNING: torch" not in shown.stdout
    else:
        # Where it does not, pip looks for them on an index and fails, as on the
        # node; site_env said so, and installs the workshop with --no-deps.
        assert done.returncode != 0, done.stdout
        assert "(from torch)" in done.stdout + done.stderr
        said = f"asks for what this Python lacks: {', '.join(unmet)}."
        assert said in shown.stdout
        install = _printed_lines(shown.stdout, "Then install")
        assert [line for line in install if f"--no-deps -e {ROOT}" in line], install
        done = _run([*pip, "--no-deps", "-e", project], tmp_path, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        # pip check sees the same: all it finds torch lacking, site_env named.
        lacking = {
            _project(re.search(r" (?:requires|has requirement) (\S+)", line)[1])
            for line in torch_broken
        }
        assert lacking and lacking <= {_project(u) for u in unmet}, broken
    # The wheelhouse's list, as make wheelhouse writes it: what the site has is kept.
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    pins = [f"{n}=={importlib.metadata.version(n)}" for n in ("numpy", "cloudpickle")]
    (wheelhouse / "requirements-offline.txt").write_text("\n".join(pins) + "\n")
    offline = [*pip, "--find-links", wheelhouse, "-r"]
    done = _run([*offline, wheelhouse / "requirements-offline.txt"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("Requirement already satisfied") == 2

    code = (
        "import site_env_marker, torch, workshop\n"
        "print(torch.__file__)\nprint(workshop.__file__)"
    )
    done = _run([venv_python, "-c", code], tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    torch_file, workshop_file = done.stdout.split()
    assert torch_file == f"{packages}/torch/__init__.py"
    assert workshop_file == str(project / "workshop" / "__init__.py")


def test_apply_makes_the_venv_checks_it_and_refuses_to_overwrite_it(
    site_venv, tmp_path
):
    python, venv = site_venv / "bin" / "python", tmp_path / "made"
    done = _run([python, SCRIPT, "--apply", "--venv", venv], tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    packages = str(_packages(site_venv))
    assert f"sees torch {TORCH_VERSION} in {packages}." in done.stdout
    assert "Now install the workshop into it:" in done.stdout
    pth = (_packages(venv) / "workshop-site.pth").read_text()
    assert pth == f"import site; site.addsitedir({json.dumps(packages)})\n"
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    origin = _torch_origin(venv / "bin" / "python", tmp_path)
    assert origin == f"{packages}/torch/__init__.py"

    again = _run([python, SCRIPT, "--apply", "--venv", venv], tmp_path)
    assert again.returncode == 1
    assert f"{venv} exists already.\nHINT: remove it" in again.stderr


# ------------------------------------------------------------------ plain and conda
def test_a_python_install_with_torch_on_pythonpath_gets_system_site_packages(
    site_venv, tmp_path
):
    packages = str(_packages(site_venv))
    venv = tmp_path / "made"
    command = [BASE_PYTHON, SCRIPT, "--apply", "--venv", venv]
    done = _run(command, tmp_path, timeout=300, PYTHONPATH=packages)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"sees torch {TORCH_VERSION} in {packages}." in done.stdout
    assert "NOTE: torch comes from PYTHONPATH" in done.stdout
    assert "include-system-site-packages = true" in (venv / "pyvenv.cfg").read_text()
    assert not (_packages(venv) / "workshop-site.pth").exists()


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


def test_a_conda_environment_gets_system_site_packages_and_no_pth(site_venv, tmp_path):
    # A conda environment is a prefix with conda-meta/: PYTHONHOME makes one of the
    # base Python's standard library.
    prefix = tmp_path / "conda-env"
    (prefix / "conda-meta").mkdir(parents=True)
    (prefix / "lib").mkdir()
    (prefix / "lib" / PY).symlink_to(Path(sys.base_prefix) / "lib" / PY)
    packages = str(_packages(site_venv))
    env = {"PYTHONHOME": str(prefix), "PYTHONPATH": packages}
    done = _run([BASE_PYTHON, SCRIPT, "--json"], tmp_path, **env)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert (found["kind"], found["prefix"]) == ("conda", str(prefix))
    assert found["torch_dir"] == packages

    done = _run([BASE_PYTHON, SCRIPT, "--venv", ".venv"], tmp_path, **env)
    assert done.returncode == 0, done.stderr
    assert f"a conda environment at {prefix}" in done.stdout
    assert "Keep the environment active" in done.stdout
    lines = _printed_lines(done.stdout, "Make .venv")
    assert lines[0] == f"{BASE_PYTHON} -m venv --system-site-packages .venv"
    assert not [line for line in lines if ".pth" in line]


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
