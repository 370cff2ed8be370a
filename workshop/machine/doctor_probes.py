"""Probes for :mod:`workshop.machine.doctor`: outside commands, each in its own
session with a time limit (on timeout its process group is killed, so none is left
behind), and the parsers that turn their output into report values."""

from __future__ import annotations

import importlib.metadata
import os
import re
import signal
import subprocess
from pathlib import Path

Items = list[tuple[str, str]]


def _run(command: list[str], timeout_s: float) -> tuple[bool, str]:
    """Run ``command`` in its own session; (True, output) or (False, why it failed).

    On timeout the whole process group is killed, so nothing is left behind.
    """
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as e:
        return False, f"could not run {command[0]}: {e.strerror or e}"
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return False, f"no answer within {timeout_s:g} s"
    if proc.returncode != 0:
        first = _first_line(output)
        return False, f"exited with status {proc.returncode}" + (
            f": {first}" if first else ""
        )
    return True, output


def _kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL ``proc`` and its process group, then reap it (waits at most ~2 s)."""
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # pragma: no cover - Windows
            proc.kill()
    except ProcessLookupError:
        pass
    try:
        proc.communicate(timeout=1)
    except subprocess.TimeoutExpired:
        # A grandchild that left the group still holds the pipe: stop reading it.
        if proc.stdout is not None:
            proc.stdout.close()
        proc.wait(timeout=1)


def _first_line(text: str) -> str:
    return next(
        (" ".join(line.split()) for line in text.splitlines() if line.strip()), ""
    )


def version_line(output: str) -> str:
    """The first line of ``--version`` output with a digit (MPICH's has a heading)."""
    lines = [" ".join(line.split()) for line in output.splitlines() if line.strip()]
    with_digit = [line for line in lines if any(c.isdigit() for c in line)]
    if with_digit:
        return with_digit[0]
    return lines[0] if lines else "(printed no version)"


# What a Slurm client prints when no configuration is found: no slurm.conf, no
# SLURM_CONF, and no DNS SRV record naming a controller ("configless" Slurm).
_NO_SLURM_CONF = ("resolve_ctls_from_dns_srv", "Could not establish a configuration")


def slurm_unconfigured(output: str) -> str | None:
    """A plain sentence if a Slurm command's ``output`` says Slurm is installed but
    no cluster is configured here; else None.

    Example:
        >>> slurm_unconfigured("srun: error: resolve_ctls_from_dns_srv: ...")[:40]
        'Slurm is installed but no cluster is con'
    """
    if not any(mark in output for mark in _NO_SLURM_CONF):
        return None
    return (
        "Slurm is installed but no cluster is configured here (no slurm.conf, no "
        "SLURM_CONF): submit from a cluster's login node, or start a private one "
        "(scripts/local_slurm.sh; notebook 03 does it for you)"
    )


def torchvision_version() -> str:
    """torchvision's version with its build tag ("0.20.1+cu124"), without importing
    it: the wheel's metadata drops the tag, ``torchvision/version.py`` keeps it."""
    try:
        dist = importlib.metadata.distribution("torchvision")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
    try:
        text = Path(str(dist.locate_file("torchvision/version.py"))).read_text()
        match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    except OSError:
        match = None
    return match.group(1) if match else dist.version


def torch_build(cuda: str | None, hip: str | None) -> str:
    """Name the build from ``torch.version``: "CUDA 12.4 build", "CPU build", ..."""
    if cuda:
        return f"CUDA {cuda} build"
    if hip:
        return f"ROCm {hip} build"
    return "CPU build"


def _gib(memory: str) -> str:
    """nvidia-smi's "81559 MiB" as "79.6 GiB"; anything else unchanged."""
    number, _, unit = memory.strip().partition(" ")
    try:
        mib = float(number)
    except ValueError:
        return memory.strip()
    return f"{mib / 1024:.1f} GiB" if unit == "MiB" else memory.strip()


def nvidia_smi_gpus(output: str) -> Items:
    """("GPU 0", "NVIDIA H100 80GB HBM3, 79.6 GiB") items from the lines of
    ``nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader``."""
    items = []
    for line in output.splitlines():
        index, _, rest = line.partition(",")
        name, _, memory = rest.rpartition(",")
        if not index.strip().isdigit() or not name.strip():
            continue  # a warning nvidia-smi printed among the GPUs
        items.append((f"GPU {index.strip()}", f"{name.strip()}, {_gib(memory)}"))
    return items


def nccl_version() -> str | None:
    """The NCCL torch was built with ("2.21.5"; no GPU touched); None if unknown."""
    try:
        import torch.cuda.nccl

        version = torch.cuda.nccl.version()
    except (ImportError, AttributeError, RuntimeError):  # a build without NCCL
        return None
    return ".".join(str(part) for part in version[:3]) + "".join(
        str(part) for part in version[3:]
    )
