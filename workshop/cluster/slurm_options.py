"""How :func:`workshop.cluster.slurm.submit` builds its ``sbatch`` command: where the
script is, which folder is the repository, the options from its arguments, and the
environment sbatch gets (without a surrounding job's variables). Pure functions,
tested without a Slurm."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._house import ROOT
from ..allocation import job_variables
from ..checks import whole


def project_root(script: Path) -> Path:
    """The nearest folder above ``script`` with ``.git`` or ``pyproject.toml``, else
    the parent of the script's folder."""
    for folder in script.parents:
        if (folder / ".git").exists() or (folder / "pyproject.toml").is_file():
            return folder
    return script.parent.parent


def find_script(script: str | os.PathLike[str], cwd: Path | None) -> Path:
    """The batch script, absolute: a relative path is looked for in ``cwd``, the
    current folder, then this repository; FileNotFoundError in none of them."""
    path = Path(script).expanduser()
    bases = [path] if path.is_absolute() else [
        (base / path) for base in (cwd, Path.cwd(), ROOT) if base is not None
    ]  # fmt: skip
    for candidate in bases:
        if candidate.is_file():
            return candidate.resolve()
    where = ", ".join(dict.fromkeys(str(c.parent) for c in bases))
    raise FileNotFoundError(
        f"no batch script {str(script)!r} (looked in {where}); give its path from "
        "the repository root, like 'slurm/hello_ranks.sbatch'"
    )


def sbatch_options(
    nodes: int | None = None,
    ntasks_per_node: int | None = None,
    gpus_per_node: int | None = None,
    time: str | int | None = None,
    options: Mapping[str, Any] | Sequence[str] = (),
) -> list[str]:
    """``sbatch`` options from :func:`submit`'s arguments, in that order.

    ``options`` is a mapping (``{"cpus_per_task": 1, "exclusive": True}``; True a
    bare flag, None or False left out) or a list of ready options.

    Raises:
        ValueError: a count that is not a whole number, an option given twice.
        TypeError: ``options`` of another kind (a single string, say).

    Example:
        >>> sbatch_options(nodes=2, gpus_per_node=0, options={"cpus_per_task": 1})
        ['--nodes=2', '--gpus-per-node=0', '--cpus-per-task=1']
    """
    fix = "e.g. submit('slurm/hello_ranks.sbatch', nodes=2, ntasks_per_node=4)"
    counts = {
        ("nodes", "nodes", 1): nodes,
        ("ntasks-per-node", "ntasks_per_node", 1): ntasks_per_node,
        ("gpus-per-node", "gpus_per_node", 0): gpus_per_node,
    }
    named: dict[str, str | None] = {
        key: None if value is None else str(whole(name, value, least, fix=fix))
        for (key, name, least), value in counts.items()
    }
    named["time"] = None if time is None else str(time)
    out = [f"--{key}={value}" for key, value in named.items() if value is not None]
    if isinstance(options, (str, bytes)):
        raise TypeError(
            f"options must be a mapping or a list of strings, not the string "
            f"{options!r}; write [{options!r}] or {{'cpus-per-task': 1}}"
        )
    if isinstance(options, Mapping):
        for raw, value in options.items():
            key = str(raw).lstrip("-").replace("_", "-")
            if named.get(key) is not None:
                raise ValueError(
                    f"{key} is given twice, as an argument of submit() and in "
                    f"options ({raw!r}: {value!r}); keep one"
                )
            if value is None or value is False:
                continue
            if len(key) == 1:
                out += [f"-{key}"] if value is True else [f"-{key}", str(value)]
            else:
                out.append(f"--{key}" if value is True else f"--{key}={value}")
        return out
    for item in options:
        if not isinstance(item, str):
            raise TypeError(
                f"options must be strings like '--cpus-per-task=1', got {item!r}"
            )
        out.append(item)
    return out


def gives_output(options: list[str]) -> bool:
    return any(o in ("-o", "--output") or o.startswith("--output=") for o in options)


def relative(path: Path, base: Path) -> str:
    """``path`` relative to ``base`` when inside it (a short line), else absolute."""
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


def sbatch_environment(
    environ: Mapping[str, str] | None = None,
) -> tuple[dict[str, str], list[str]]:
    """The environment ``sbatch`` gets, and the names left out of it.

    From inside a job (a kernel on a portal), the new job would inherit the old
    job's variables where Slurm sets none (an old ``SLURM_MEM_PER_NODE`` makes every
    ``srun`` fail), so :func:`workshop.allocation.job_variables` are left out; the
    client's settings (``SLURM_CONF``) stay.

    Args:
        environ: the environment to start from; ``os.environ`` when omitted.

    Returns:
        ``(environment, names left out)``.

    Example:
        >>> sbatch_environment({"SLURM_JOB_ID": "8", "SLURM_CONF": "/s.conf"})
        ({'SLURM_CONF': '/s.conf'}, ['SLURM_JOB_ID'])
    """
    env = dict(os.environ if environ is None else environ)
    left_out = job_variables(env)
    for name in left_out:
        del env[name]
    return env, left_out
