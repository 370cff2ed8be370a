"""Environment modules (Lmod, Environment Modules), shown for real where a site has
them and imitated where it has not (notebook 03, section 6).

``module load`` changes only the variables of the shell that runs it (and what it
starts later), never a kernel started before.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ModuleSystem", "module_load_environment", "module_system"]

_COMMANDS = ("prepend-path", "append-path", "setenv", "unsetenv")


@dataclass(frozen=True)
class ModuleSystem:
    """Whether a login shell here defines ``module``: its version, or why not."""

    available: bool
    description: str

    def __str__(self) -> str:
        return self.description


def module_system(timeout: float = 30.0) -> ModuleSystem:
    """Whether a login shell (``bash -lc``) here defines ``module``.

    Args:
        timeout: seconds to wait for the login shell.

    Returns:
        A :class:`ModuleSystem`; it never raises for a missing ``module``.

    Example:
        >>> print(module_system())                        # doctest: +SKIP
        no `module` command here (no Lmod or Environment Modules) ...
    """
    probe = "type module >/dev/null 2>&1 && { module --version 2>&1 | head -n 3; }"
    try:
        said = subprocess.run(
            ["bash", "-lc", probe], capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ModuleSystem(False, f"cannot start a login shell to look: {exc}")
    if said.returncode != 0:
        return ModuleSystem(
            False,
            "no `module` command here (neither Lmod nor Environment Modules);\n"
            "a cluster has one; on your own machine: install lmod",
        )
    lines = [line.strip() for line in said.stdout.splitlines() if line.strip()]
    return ModuleSystem(True, lines[0] if lines else "module is defined")


def module_load_environment(
    modulefile: str, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A copy of ``environ`` changed as ``module load`` of ``modulefile`` would.

    Args:
        modulefile: the modulefile's text: ``prepend-path``, ``append-path``,
            ``setenv`` and ``unsetenv`` lines, ``#`` comments.
        environ: the environment to start from; ``os.environ`` when omitted.

    Returns:
        The changed environment, as a new dict.

    Raises:
        ValueError: a line with another command, or without its arguments.

    Example:
        >>> env = module_load_environment("prepend-path PATH /x/bin", {"PATH": "/bin"})
        >>> env["PATH"]
        '/x/bin:/bin'
    """
    if not isinstance(modulefile, str):
        raise ValueError(
            f"modulefile must be the file's text, a str; got {modulefile!r}"
        )
    env = dict(os.environ if environ is None else environ)
    for number, line in enumerate(modulefile.splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        command, args = words[0], words[1:]
        wanted = 1 if command == "unsetenv" else 2
        if command not in _COMMANDS or len(args) != wanted:
            raise ValueError(
                f"modulefile line {number}, {line.strip()!r}: expected one of "
                "'prepend-path VAR DIR', 'append-path VAR DIR', 'setenv VAR VALUE' "
                "or 'unsetenv VAR' (a real module system understands more; this "
                "stand-in only these)"
            )
        name = args[0]
        if command == "unsetenv":
            env.pop(name, None)
        elif command == "setenv":
            env[name] = args[1]
        else:
            old = [p for p in env.get(name, "").split(":") if p]
            new = [args[1], *old] if command == "prepend-path" else [*old, args[1]]
            env[name] = ":".join(new)
    return env
