"""Which MPI is installed, and where mpirun put each rank (notebook 03, section 5).

MPI is a standard with several implementations, each with its own ``mpirun``;
:func:`mpi_installation` says which this machine has, :func:`binding_lines` tidies
Open MPI's ``--report-bindings``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field

__all__ = ["MpiInstallation", "binding_lines", "mpi_installation", "parse_mpi_version"]

_INSTALL = (
    "install Open MPI (Debian or Ubuntu: apt-get install openmpi-bin; a cluster: "
    "module load openmpi, or the name `module avail mpi` shows)"
)

# First match wins: Intel MPI and MVAPICH print "HYDRA" too, as MPICH does.
_VERSIONS = (
    ("Open MPI", r"\(Open MPI\)\s+(\S+)"),
    ("Intel MPI", r"Intel\(R\) MPI Library.*?Version\s+(\S+?),?\s"),
    ("MVAPICH", r"MVAPICH2?\s+(?:Version:?\s*)?(\d\S*)"),
    ("MPICH", r"HYDRA build details:\s+Version:\s+(\S+)"),
)


def parse_mpi_version(text: str) -> tuple[str, str]:
    """The implementation and version that ``mpirun --version`` printed.

    Args:
        text: what ``mpirun --version`` wrote (stdout and stderr together).

    Returns:
        ``(implementation, version)``, e.g. ``("Open MPI", "4.1.4")``.

    Raises:
        ValueError: the text names none of Open MPI, Intel MPI, MVAPICH or MPICH.

    Example:
        >>> parse_mpi_version("mpirun (Open MPI) 4.1.4\\n\\nReport bugs to ...")
        ('Open MPI', '4.1.4')
    """
    if not isinstance(text, str):
        raise ValueError(
            f"text must be the str that mpirun --version printed, got {text!r}"
        )
    for name, pattern in _VERSIONS:
        found = re.search(pattern, text + " ", re.DOTALL)
        if found:
            return name, found.group(1)
    first = text.strip().splitlines()[0] if text.strip() else ""
    raise ValueError(
        f"cannot tell which MPI printed {first!r}: expected Open MPI's "
        "'mpirun (Open MPI) 4.1.4', MPICH's 'HYDRA build details: Version: 4.1', "
        "or Intel MPI's 'Intel(R) MPI Library ..., Version 2021.10'. Run "
        "`mpirun --version` yourself and read its first lines"
    )


@dataclass(frozen=True)
class MpiInstallation:
    """The MPI that ``mpirun`` on PATH belongs to (``reason`` says what to install
    where there is none); ``btl`` and ``pml`` are Open MPI's transports."""

    available: bool
    implementation: str = ""
    version: str = ""
    mpirun: str = ""
    reason: str = ""
    btl: tuple[str, ...] = field(default=())
    pml: tuple[str, ...] = field(default=())
    standard: str = ""  # the version of the MPI standard it implements (Open MPI)

    def __str__(self) -> str:
        if not self.available:
            return self.reason
        standard = f" (MPI standard {self.standard})" if self.standard else ""
        lines = [
            f"{self.implementation} {self.version}{standard}, mpirun at {self.mpirun}"
        ]
        if self.btl:
            lines.append(f"  byte transfer layers (btl): {', '.join(self.btl)}")
        if self.pml:
            lines.append(f"  point-to-point layers (pml): {', '.join(self.pml)}")
        return "\n".join(lines)


def _components(text: str, framework: str) -> tuple[str, ...]:
    return tuple(re.findall(rf"MCA {framework}: (\w+) \(", text))


def mpi_installation(timeout: float = 30.0) -> MpiInstallation:
    """Which MPI implementation this machine's ``mpirun`` belongs to; never raises
    for a missing or unknown MPI (``available`` is False, ``reason`` says why).

    Args:
        timeout: seconds to wait for ``mpirun --version`` and ``ompi_info``.

    Returns:
        An :class:`MpiInstallation`; print it for one line per fact.

    Example:
        >>> print(mpi_installation())                     # doctest: +SKIP
        Open MPI 4.1.4 (MPI standard 3.1.0), mpirun at /usr/bin/mpirun
          byte transfer layers (btl): ofi, openib, tcp, vader, self
          point-to-point layers (pml): v, cm, ob1, ucx, monitoring
    """
    where = shutil.which("mpirun")
    if where is None:
        return MpiInstallation(False, reason=f"no mpirun on PATH: {_INSTALL}")
    try:
        said = subprocess.run(
            [where, "--version"], capture_output=True, text=True, timeout=timeout
        )
        name, version = parse_mpi_version(said.stdout + said.stderr)
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        return MpiInstallation(False, mpirun=where, reason=f"{where}: {exc}")
    btl: tuple[str, ...] = ()
    pml: tuple[str, ...] = ()
    standard = ""
    info = shutil.which("ompi_info")
    if name == "Open MPI" and info:
        try:
            listed = subprocess.run(
                [info], capture_output=True, text=True, timeout=timeout
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            listed = ""
        btl, pml = _components(listed, "btl"), _components(listed, "pml")
        api = re.search(r"MPI API:\s*(\S+)", listed)
        standard = api.group(1) if api else ""
    return MpiInstallation(
        True, name, version, where, btl=btl, pml=pml, standard=standard
    )


_BINDING = re.compile(r"^\[[^\]\s]*:\d+\]\s+(?:MCW\s+)?rank\s+(\d+)\s+(.*)$", re.I)


def binding_lines(text: str) -> list[str]:
    """Open MPI's ``--report-bindings`` lines in ``text``, by rank, without their
    ``[host:pid]``.

    Args:
        text: what mpirun wrote on stderr.

    Returns:
        One ``"rank N ..."`` line per rank, in rank order.

    Raises:
        ValueError: ``text`` is not a str.

    Example:
        >>> binding_lines("[vm:29] MCW rank 0 bound to socket 0[core 0[hwt 0]]: [B/.]")
        ['rank 0 bound to socket 0[core 0[hwt 0]]: [B/.]']
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be mpirun's stderr as a str, got {text!r}")
    found = [_BINDING.match(line.strip()) for line in text.splitlines()]
    ranks = sorted((int(m.group(1)), m.group(2)) for m in found if m)
    return [f"rank {rank} {rest}" for rank, rest in ranks]
