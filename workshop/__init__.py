"""Scaling PyTorch on HPC: the helper package the workshop's notebooks import.

Public names:

* :func:`launch` runs a function on N real ranks from a notebook cell and returns a
  :class:`RunResult`; a failing, hanging or interrupted launch raises
  :class:`LaunchError` (or KeyboardInterrupt) with every rank stopped.
* :func:`process_group` is what every rank runs around the lesson's code, whether
  started by ``launch``, ``torchrun``, ``srun`` or ``mpirun``.
* :func:`rank_info` reads a process's rank, local rank and world size from its launcher.
* :func:`doctor` tells what this machine has and what the workshop will use.
"""

from .doctor import doctor
from .env import RankInfo, rank_info
from .launcher import LaunchError, RunResult, launch
from .worker import process_group, rank_device

__all__ = [
    "LaunchError",
    "RankInfo",
    "RunResult",
    "doctor",
    "launch",
    "process_group",
    "rank_device",
    "rank_info",
]

__version__ = "0.1.0"
