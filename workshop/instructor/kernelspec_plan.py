"""What a workshop kernel spec holds, decided and written: ``kernel.json`` and, with
environment modules, the wrapper that loads them (``python -m workshop kernel-spec``,
:mod:`workshop.instructor.kernelspec`, is the command), after asking the kernel's
Python what it has (:func:`probe`).

``module load`` is a shell function, so with ``--module`` the spec's ``argv`` runs
``kernel-wrapper.sh``, which loads the modules and then ``exec``s the kernel's Python
(so Jupyter's interrupts reach it). Where that Python cannot import the workshop (a
site's shared module), the spec puts this checkout first on ``PYTHONPATH``, ahead of
the server's ``${PYTHONPATH}``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import string
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .._house import ROOT
from .site_env import MIN_PYTHON

__all__ = [
    "KernelSpecError",
    "KernelSpecPlan",
    "kernels_dir",
    "parse_env",
    "plan_kernel_spec",
    "probe",
    "probe_with_shell_path",
    "wrapper_script",
    "write_kernel_spec",
]

DEFAULT_NAME = "scaling-pytorch-hpc"
DEFAULT_DISPLAY_NAME = "Scaling PyTorch on HPC"
WRAPPER = "kernel-wrapper.sh"
# A kernel that imports torch started in 5 s here; a shared file system is slower.
KERNEL_TIMEOUT_S = 120.0
_NAME = re.compile(r"[A-Za-z0-9._-]+")  # what Jupyter accepts as a kernel name
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Run by the kernel's Python (through the wrapper, with --module) before writing:
# what it has. find_spec imports nothing, so this takes a fraction of a second.
_PROBE = """\
import importlib.metadata as m, importlib.util as u, json, sys
def version(name):
    if u.find_spec(name) is None:
        return None
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return "found"
spec = u.find_spec("workshop")
print(json.dumps({"python": sys.executable, "version": sys.version_info[:2],
    "ipykernel": version("ipykernel"), "torch": version("torch"),
    "workshop": spec.origin if spec else None}))
"""
# Where sites keep the script that defines `module` (Lmod, Environment Modules).
_MODULE_INITS = (
    "${MODULESHOME:-/nonexistent}/init/bash",
    "/etc/profile.d/lmod.sh",
    "/etc/profile.d/z00_lmod.sh",
    "/etc/profile.d/modules.sh",
    "/usr/share/lmod/lmod/init/bash",
    "/usr/share/Modules/init/bash",
)


class KernelSpecError(ValueError):
    """A kernel spec that cannot be written as asked, or fails its check."""


@dataclass(frozen=True)
class KernelSpecPlan:
    """What :func:`write_kernel_spec` writes, and what the kernel's Python has."""

    name: str
    folder: Path
    kernel_json: dict
    wrapper: str | None
    python: str  # as the kernel runs it: a path, or a name found after module load
    torch_version: str
    workshop_file: str  # what `import workshop` will load
    notes: tuple[str, ...] = ()


def kernels_dir(
    user: bool = False, prefix: str | Path | None = None, sys_prefix: bool = False
) -> Path:
    """The kernel specs' folder, as ``jupyter kernelspec install`` chooses it
    (``--user`` by default).

    Args:
        user: this user's Jupyter data folder (``~/.local/share/jupyter/kernels``).
        prefix: ``PREFIX/share/jupyter/kernels``.
        sys_prefix: the same under this Python's ``sys.prefix``.

    Raises:
        KernelSpecError: more than one was given.

    Example:
        >>> kernels_dir(prefix="/opt/course")
        PosixPath('/opt/course/share/jupyter/kernels')
    """
    if user + (prefix is not None) + sys_prefix > 1:
        raise KernelSpecError("give one of --user, --prefix PATH and --sys-prefix")
    if prefix is not None:
        return Path(os.path.abspath(prefix)) / "share" / "jupyter" / "kernels"
    if sys_prefix:
        return Path(sys.prefix) / "share" / "jupyter" / "kernels"
    try:
        from jupyter_core.paths import jupyter_data_dir
    except ImportError:  # the same place on Linux, without jupyter_core
        data = os.environ.get("JUPYTER_DATA_DIR") or os.path.join(
            os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share"),
            "jupyter",
        )
        return Path(data) / "kernels"
    return Path(jupyter_data_dir()) / "kernels"


def parse_env(items: Sequence[str]) -> dict[str, str]:
    """``["OMP_NUM_THREADS=4", ...]`` as a dict, each name checked.

    Raises:
        KernelSpecError: no ``=``, a bad variable name, or a name given twice.

    Example:
        >>> parse_env(["OMP_NUM_THREADS=4", "NCCL_DEBUG="])
        {'OMP_NUM_THREADS': '4', 'NCCL_DEBUG': ''}
    """
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise KernelSpecError(
                f"--env {item!r} has no '='. HINT: write --env KEY=VALUE, e.g. "
                f"--env OMP_NUM_THREADS=4 (an empty value: --env {item}=)"
            )
        if not _ENV_KEY.fullmatch(key):
            raise KernelSpecError(
                f"--env {item!r}: {key!r} is not a variable name. HINT: letters, "
                "digits and '_', not starting with a digit, e.g. OMP_NUM_THREADS"
            )
        if key in env:
            raise KernelSpecError(
                f"--env {key} is given twice ({env[key]!r} and {value!r}). HINT: "
                "give each variable once"
            )
        env[key] = value
    return env


def _check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise KernelSpecError(
            f"kernel name {name!r}: Jupyter accepts only ASCII letters, digits, '.', "
            f"'_' and '-'. HINT: e.g. --name "
            f"{re.sub(r'[^A-Za-z0-9._-]+', '-', name).strip('-') or DEFAULT_NAME}"
        )
    return name.lower()  # Jupyter folds kernel names to lower case


def _python(python: str | None, venv: str | Path | None, modules: Sequence[str]) -> str:
    """The kernel's Python: an absolute path (unresolved: a venv's python links to
    its base), or with modules a bare name found after loading them."""
    if python is not None and venv is not None:
        raise KernelSpecError("give --python or --venv, not both")
    if venv is not None:
        path = Path(os.path.abspath(venv)) / "bin" / "python"
        if not path.is_file():
            raise KernelSpecError(
                f"--venv {venv}: there is no {path}. HINT: give the folder that "
                "'python -m venv' made (it holds bin/python), or --python PATH"
            )
        return str(path)
    if python is None:
        return sys.executable
    if "/" not in python:
        if modules:
            return python  # found on PATH once the modules are loaded
        found = shutil.which(python)
        if found is None:
            raise KernelSpecError(
                f"--python {python}: not found on PATH. HINT: give its full path, "
                "or the --module that provides it"
            )
        return os.path.abspath(found)
    path = os.path.abspath(os.path.expanduser(python))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise KernelSpecError(
            f"--python {python}: no executable file there. HINT: the Python that has "
            "torch and the workshop, e.g. --python ~/scaling-pytorch-hpc/.venv/bin/"
            "python, or --venv with its folder"
        )
    return path


# ------------------------------------------------------------------ the probe
def _substituted(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with ``${VAR}`` filled in from this environment, as Jupyter does."""
    return {k: string.Template(v).safe_substitute(os.environ) for k, v in env.items()}


def _shell_pythonpath() -> str:
    """This shell's existing ``PYTHONPATH`` folders, absolute."""
    folders = [
        os.path.abspath(folder)
        for folder in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if folder and os.path.isdir(folder)
    ]
    return os.pathsep.join(dict.fromkeys(folders))


def probe(argv: list[str], env: Mapping[str, str], timeout: float, shown: str) -> dict:
    """Run the probe with ``argv`` (the Python, or the wrapper) in an empty folder,
    without this shell's ``PYTHONPATH`` (the server's may not hold it)."""
    with tempfile.TemporaryDirectory(prefix="kernel-spec-") as tmp:
        try:
            done = subprocess.run(
                [*argv, "-c", _PROBE],
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=tmp,
                env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                | _substituted(env),
            )
        except subprocess.TimeoutExpired as e:
            raise KernelSpecError(
                f"{shown} did not answer within {timeout:.0f} s. HINT: a "
                "slow module load or file system: try again with a longer --timeout"
            ) from e
        except OSError as e:  # not a program (no #! line), or not yours to run
            raise KernelSpecError(
                f"cannot run {shown}: {e.strerror or e}. HINT: --python the Python "
                "that has torch and the workshop, or --venv its folder"
            ) from e
    if done.returncode != 0:
        said = "\n".join((done.stderr or done.stdout).strip().splitlines()[-12:])
        raise KernelSpecError(
            f"{shown} failed (exit status {done.returncode}); it said:"
            + (f"\n{said}" if said else " nothing")
        )
    last = (done.stdout.strip().splitlines() or [""])[-1]
    try:
        found = json.loads(last)
    except ValueError:
        found = None
    if not isinstance(found, dict):  # a program that is not Python, e.g. /bin/true
        raise KernelSpecError(
            f"{shown} did not run Python's -c (it printed {last[:60]!r}). HINT: "
            "--python the Python that has torch and the workshop, or --venv its folder"
        )
    return found


def probe_with_shell_path(
    argv: list[str], env: dict[str, str], timeout: float, shown: str, notes: list[str]
) -> dict:
    """What the probe found; where ipykernel or torch is found only through this
    shell's ``PYTHONPATH`` (a ``pip install --target``), that goes into ``env``,
    said in ``notes``."""
    found = probe(argv, env, timeout, shown)
    shell_path = _shell_pythonpath()
    if None not in (found["ipykernel"], found["torch"]) or not shell_path:
        return found
    if "PYTHONPATH" in env:
        return found  # the user's own --env PYTHONPATH is the one to use
    tried = probe(argv, {**env, "PYTHONPATH": shell_path}, timeout, shown)
    if None in (tried["ipykernel"], tried["torch"]):
        return found
    env["PYTHONPATH"] = shell_path
    notes.append(
        f"{shown} finds ipykernel and torch through this shell's PYTHONPATH only (a "
        f"pip --target install): the spec sets PYTHONPATH={shell_path}"
    )
    return tried


# ------------------------------------------------------------------ the wrapper
def wrapper_script(
    name: str, python: str, modules: Sequence[str], modules_init: str | None = None
) -> str:
    """The text of ``kernel-wrapper.sh``: define ``module``, load ``modules``, then
    ``exec python "$@"``; a failure exits 1 after one line on stderr.

    Example:
        >>> print(wrapper_script("k", "python3", ["pytorch/2.4"]))  # doctest: +SKIP
        #!/bin/bash
        ...
        exec python3 "$@"
    """
    inits = [modules_init] if modules_init else list(_MODULE_INITS)
    listed = " ".join(f'"{i}"' if i.startswith("$") else shlex.quote(i) for i in inits)

    def fail(message: str) -> str:
        return f"fail {shlex.quote(message)}"

    lines = [
        "#!/bin/bash",
        f"# Jupyter kernel {name!r} of the workshop Scaling PyTorch on HPC, written",
        "# by `python -m workshop kernel-spec`; the argv of kernel.json beside it runs",
        "# it. `module` is a shell function: define it, load the modules, then become",
        "# the kernel's Python (exec: Jupyter's interrupts and shutdowns reach it).",
        f'fail() {{ echo "kernel {name}: $1" >&2; exit 1; }}',
        "if ! type module >/dev/null 2>&1; then",
        f"    for init in {listed}; do",
        '        if [ -r "$init" ]; then . "$init"; break; fi',
        "    done",
        "fi",
        "type module >/dev/null 2>&1 || "
        + fail(
            "'module' is not defined in this shell (its init script was looked for "
            f"in: {' '.join(inits)}). HINT: --modules-init with the script that "
            "defines it on this site (its support knows), or --python without --module"
        ),
    ]
    for module in modules:
        lines.append(
            f"module load {shlex.quote(module)} || "
            + fail(
                f"'module load {module}' failed (its message is above). HINT: "
                f"'module avail {module.split('/')[0]}' lists the names this site has"
            )
        )
    quoted = shlex.quote(python)
    lines += [
        f"command -v {quoted} >/dev/null 2>&1 || "
        + fail(
            f"{python} is not there after loading the modules. HINT: --python, the "
            "Python that has torch and the workshop"
        ),
        f'exec {quoted} "$@"',
    ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the plan
def plan_kernel_spec(
    name: str = DEFAULT_NAME,
    display_name: str | None = None,
    python: str | None = None,
    venv: str | Path | None = None,
    modules: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    where: Path | None = None,
    modules_init: str | Path | None = None,
    timeout: float = KERNEL_TIMEOUT_S,
) -> KernelSpecPlan:
    """Decide what the kernel spec holds, after asking the kernel's Python (through
    the module loads) whether it has ipykernel, torch and the workshop.

    Args:
        name: the kernel's name, ``[A-Za-z0-9._-]``; Jupyter lower-cases it.
        display_name: its name in Jupyter's menus (the title and modules).
        python: the Python that has torch: a path, or with ``modules`` a name on the
            PATH they set (default: this Python).
        venv: a virtual environment, instead of ``python``.
        modules: environment modules to ``module load``, in order, before the kernel.
        env: variables for the kernel; ``${VAR}`` takes the server's value.
        where: the kernels folder (:func:`kernels_dir`); ``--user``'s by default.
        modules_init: the script that defines ``module``; common places otherwise.
        timeout: seconds the Python (with its module loads) may take to answer.

    Returns:
        The plan, for :func:`write_kernel_spec` or to print.

    Raises:
        KernelSpecError: a bad argument, or a Python that lacks ipykernel, torch
            or the workshop; each message says what to change.

    Example:
        >>> plan = plan_kernel_spec(modules=["pytorch/2.4"], python="python3")
        ... # doctest: +SKIP
        >>> plan.kernel_json["argv"][-2:]  # doctest: +SKIP
        ['-f', '{connection_file}']
    """
    kernel = _check_name(name)
    notes = []
    if kernel != name:
        notes.append(f"Jupyter folds kernel names to lower case: {kernel}")
    for module in modules:
        if not module or any(c.isspace() for c in module):
            raise KernelSpecError(
                f"--module {module!r}: one module name, without spaces. HINT: give "
                "each module its own --module, e.g. --module gcc/12 --module pytorch"
            )
    if modules_init is not None and not os.path.isfile(modules_init):
        raise KernelSpecError(
            f"--modules-init {modules_init}: not a file. HINT: the script that "
            "defines 'module', e.g. $MODULESHOME/init/bash"
        )
    exe = _python(python, venv, modules)
    env = dict(env or {})
    folder = (where or kernels_dir()) / kernel
    init = os.path.abspath(modules_init) if modules_init else None
    wrapper = wrapper_script(kernel, exe, modules, init) if modules else None
    with tempfile.TemporaryDirectory(prefix="kernel-spec-") as tmp:
        if wrapper is None:
            argv_python = [exe]
        else:
            trial = Path(tmp) / WRAPPER
            trial.write_text(wrapper)
            trial.chmod(0o755)
            argv_python = [str(trial)]
        shown = exe + (f" (after module load {' '.join(modules)})" if modules else "")
        found = probe_with_shell_path(argv_python, env, timeout, shown, notes)
    if tuple(found["version"]) < MIN_PYTHON:
        raise KernelSpecError(
            f"{shown} is Python {'.'.join(map(str, found['version']))}; the workshop "
            f"needs {'.'.join(map(str, MIN_PYTHON))} or newer. HINT: a newer module"
        )
    if found["ipykernel"] is None:
        raise KernelSpecError(
            f"{shown} has no ipykernel, so it cannot run a Jupyter kernel. HINT: "
            f"{exe} -m pip install ipykernel, or install the workshop into a venv "
            "on top of it (docs/cluster.md, 'On a cluster')"
        )
    if found["torch"] is None:
        raise KernelSpecError(
            f"{shown} has no torch. HINT: --module with the site's PyTorch module "
            "('module avail pytorch'), or --python/--venv of the environment that "
            "has it (docs/cluster.md, 'On a cluster')"
        )
    workshop_file = found["workshop"]
    if workshop_file is None:
        if not (ROOT / "pyproject.toml").is_file():
            raise KernelSpecError(
                f"{shown} cannot import the workshop, and {ROOT} is an installed copy, "
                f"not a checkout to put on its PYTHONPATH. HINT: pip install the "
                "workshop into that Python, or run this command from a clone"
            )
        before = env.get("PYTHONPATH", "${PYTHONPATH}")
        env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{before}"
        workshop_file = str(ROOT / "workshop" / "__init__.py")
        notes.append(
            f"{exe} has no workshop installed: PYTHONPATH starts with {ROOT}, so "
            "this checkout must stay there, readable by whoever uses the kernel"
        )
    elif not Path(workshop_file).resolve().is_relative_to(ROOT):
        notes.append(f"that Python's own workshop is used: {workshop_file}")
    head = [str(folder / WRAPPER)] if wrapper else [exe]
    spec = {
        "argv": [*head, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": display_name
        or DEFAULT_DISPLAY_NAME + (f" ({', '.join(modules)})" if modules else ""),
        "language": "python",
        "interrupt_mode": "signal",
        "env": env,
    }
    return KernelSpecPlan(
        kernel, folder, spec, wrapper, exe, found["torch"], workshop_file, tuple(notes)
    )


def write_kernel_spec(plan: KernelSpecPlan) -> Path:
    """Write ``kernel.json`` (and the wrapper) into ``plan.folder``; the folder.

    Raises:
        KernelSpecError: the folder cannot be written.
    """
    try:
        plan.folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps(plan.kernel_json, indent=1) + "\n"
        (plan.folder / "kernel.json").write_text(text)
        wrapper = plan.folder / WRAPPER
        if plan.wrapper is None:
            wrapper.unlink(missing_ok=True)  # left from a spec that had modules
        else:
            wrapper.write_text(plan.wrapper)
            wrapper.chmod(0o755)
    except OSError as e:
        raise KernelSpecError(
            f"cannot write the kernel spec into {plan.folder}: {e.strerror}. HINT: "
            "--user, or --prefix a folder you can write"
        ) from e
    return plan.folder
