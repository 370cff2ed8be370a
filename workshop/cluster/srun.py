"""The ``srun`` command line that starts a script's ranks as a job step, from a cell.

On a cluster's portal the kernel itself runs in a job step, which holds the job's
CPUs, memory and GPUs; since Slurm 20.11 a new step from a cell waits for them
forever ("step creation temporarily disabled"), so :func:`srun_command` adds
``--overlap`` there, and only there.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from ..allocation import slurm_allocation
from .arguments import check_count, check_script
from .run import check_program

__all__ = ["srun_command"]


def srun_command(
    script: str | os.PathLike,
    *args: object,
    ntasks: int,
    nodes: int | None = None,
    cpus_per_task: int | None = None,
    python: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """The ``srun`` command line that runs ``script`` as ``ntasks`` ranks of a job
    step, each reading its rank from Slurm's variables (``workshop.process_group``).

    Inside a job step (``SLURM_STEP_ID`` set) ``--overlap`` comes first. Give
    ``cpus_per_task`` for each rank's cores: since Slurm 22.05 ``srun`` no longer
    takes the job's. Run it with :func:`workshop.cluster.run_command`, which keeps
    the kernel's task variables out of the new step.

    Args:
        script: the training script; relative paths start from the current folder.
        *args: the script's own arguments.
        ntasks: ranks in the step (``--ntasks``).
        nodes: nodes they spread over (``--nodes``); None: as Slurm places them.
        cpus_per_task: cores of each rank (``--cpus-per-task``).
        python: the interpreter that runs the script (default: this one).
        environ: the environment to judge "inside a job step" by (``os.environ``).

    Returns:
        The command as a list of words.

    Raises:
        ValueError: a count below 1.
        FileNotFoundError: no ``srun`` on PATH, or ``script`` does not exist.

    Example:
        >>> srun_command("slurm/hello_ranks.py", ntasks=2,
        ...              environ={"SLURM_JOB_ID": "8", "SLURM_STEP_ID": "0"})[:3]
        ['srun', '--overlap', '--ntasks=2']
    """
    check_count("ntasks", ntasks, 1, "ntasks=2")
    for name, value in (("nodes", nodes), ("cpus_per_task", cpus_per_task)):
        if value is not None:
            check_count(name, value, 1, f"{name}=1")
    env = os.environ if environ is None else environ
    check_program("srun", env.get("PATH"))
    check_script(script)
    words = ["srun"]
    if slurm_allocation(env).in_step:
        words.append("--overlap")  # share what the kernel's own step holds
    words.append(f"--ntasks={ntasks}")
    for flag, value in (("nodes", nodes), ("cpus-per-task", cpus_per_task)):
        if value is not None:
            words.append(f"--{flag}={value}")
    return [*words, python or sys.executable, str(script), *map(str, args)]
