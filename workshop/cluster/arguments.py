"""The checks every launcher's command line makes of its arguments (torchrun's,
mpirun's and srun's), so that a wrong count or a missing script is named before any
process starts."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["check_count", "check_script"]


def check_count(name: str, value: object, least: int, example: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(
            f"{name} must be a whole number, {least} or more; got {value!r}. "
            f"Pass {example}, for example"
        )


def check_script(script: str | os.PathLike) -> None:
    if not Path(script).is_file():
        raise FileNotFoundError(
            f"script {os.fspath(script)!r} not found; relative paths start from the "
            f"current folder, {os.getcwd()}. Pass the script's path from there, or "
            "an absolute path"
        )
