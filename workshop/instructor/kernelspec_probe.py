"""Asking a kernel's Python what it has, before a spec is written: ipykernel, torch
and the workshop, and from where (:mod:`.kernelspec_plan` decides from the answer).

The probe runs the Python (or the wrapper that loads modules first) in an empty
folder, without this shell's ``PYTHONPATH``: the server that starts the kernel may
not have it. Only where ipykernel or torch is then missing, and that ``PYTHONPATH``
supplies them (a ``pip install --target`` on a node without internet), is it asked
again with it, and the spec carries it.

Imports nothing of the package.
"""

from __future__ import annotations

import json
import os
import string
import subprocess
import tempfile
from collections.abc import Mapping

__all__ = ["KernelSpecError", "or_with_shell_path", "probe"]

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


class KernelSpecError(ValueError):
    """A kernel spec that cannot be written as asked, or a kernel that fails its
    check."""


def _substituted(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with ``${VAR}`` filled in from this environment, as Jupyter fills a
    kernel's ``env`` in from the server's (an unset name stays as written)."""
    return {k: string.Template(v).safe_substitute(os.environ) for k, v in env.items()}


def _without_pythonpath() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _shell_pythonpath() -> str:
    """This shell's ``PYTHONPATH`` with each folder made absolute (a kernel starts
    in another folder), empty entries and folders that do not exist left out."""
    folders = [
        os.path.abspath(folder)
        for folder in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if folder and os.path.isdir(folder)
    ]
    return os.pathsep.join(dict.fromkeys(folders))


def probe(argv: list[str], env: Mapping[str, str], timeout: float, shown: str) -> dict:
    """Run the probe with ``argv`` (the Python, or the wrapper), in an empty folder
    and without this shell's ``PYTHONPATH`` (the server's may not hold it), so that
    only that Python, its modules and ``env`` can make the workshop importable."""
    with tempfile.TemporaryDirectory(prefix="kernel-spec-") as tmp:
        try:
            done = subprocess.run(
                [*argv, "-c", _PROBE],
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=tmp,
                env={**_without_pythonpath(), **_substituted(env)},
            )
        except subprocess.TimeoutExpired as e:
            raise KernelSpecError(
                f"{shown} did not answer within {timeout:.0f} s. HINT: a "
                "slow module load or file system: try again with a longer --timeout"
            ) from e
    if done.returncode != 0:
        said = "\n".join((done.stderr or done.stdout).strip().splitlines()[-12:])
        raise KernelSpecError(
            f"{shown} failed (exit status {done.returncode}); it said:\n{said}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def or_with_shell_path(
    found: dict,
    argv: list[str],
    env: dict[str, str],
    timeout: float,
    shown: str,
    notes: list[str],
) -> dict:
    """What the probe found; or, where ipykernel or torch was missing and this
    shell's ``PYTHONPATH`` supplies both, what it found with that, after putting it
    into ``env`` and saying so in ``notes``.

    That is a ``pip install --target`` (docs/install.md, "Offline install on a
    compute node"): its packages are found through the shell's ``PYTHONPATH`` only,
    which the server that starts the kernel may not have, so the spec carries it."""
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
        f"{shown} finds ipykernel and torch through "
        f"this shell's PYTHONPATH only (a pip --target install): the spec sets "
        f"PYTHONPATH={shell_path}"
    )
    return tried
