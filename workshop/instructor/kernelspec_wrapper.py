"""The shell script that a kernel spec with environment modules runs: ``module`` is
a shell function, not a program, so a shell must define it (from the site's init
script), ``module load`` each module, then ``exec`` the kernel's Python in its own
place. A failure says so in one line on stderr, which Jupyter's server log and
``python -m workshop kernel-spec --check`` show.

Imports nothing of the package.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

__all__ = ["wrapper_script"]

# Where sites keep the script that defines `module` (Lmod, Environment Modules).
_MODULE_INITS = (
    "${MODULESHOME:-/nonexistent}/init/bash",
    "/etc/profile.d/lmod.sh",
    "/etc/profile.d/z00_lmod.sh",
    "/etc/profile.d/modules.sh",
    "/usr/share/lmod/lmod/init/bash",
    "/usr/share/Modules/init/bash",
)


def wrapper_script(
    name: str, python: str, modules: Sequence[str], modules_init: str | None = None
) -> str:
    """The text of ``kernel-wrapper.sh``: define ``module``, load ``modules``, then
    ``exec python "$@"``.

    It exits with status 1 after one line on stderr (the server's log, and
    :func:`~workshop.instructor.kernelspec_check.check_kernel`'s error) when ``module``
    is not defined, a module does not load, or ``python`` is not there after loading.

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
