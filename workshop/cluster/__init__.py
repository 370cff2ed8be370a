"""Real launchers and schedulers from a cell (notebook 03): command lines run under a
keeper (no rank left behind), and Slurm batch jobs, on a real cluster or on a private
one on this machine.

- Launchers: torchrun_command, mpirun_command, srun_command, run_command,
  run_commands, free_port (a port for a rendezvous on this machine).
- Open MPI: mpi_installation, binding_lines.
- Slurm: slurm_cluster, submit, SlurmJob, time_limit_minutes and
  scontrol_time_limit (``--time`` as Slurm reads and prints it).
- Environment modules: module_system, module_load_environment.

Imports ``ranks`` (its output streams) and the base modules.
"""

from .._exports import offer

_NAMES = {
    "binding_lines": "mpi_info",
    "free_port": "commands",
    "module_load_environment": "env_modules",
    "module_system": "env_modules",
    "mpi_installation": "mpi_info",
    "mpirun_command": "commands",
    "run_command": "commands",
    "run_commands": "commands",
    "scontrol_time_limit": "slurm_status",
    "slurm_cluster": "slurm_here",
    "SlurmJob": "slurm",
    "srun_command": "srun",
    "submit": "slurm",
    "time_limit_minutes": "slurm_status",
    "torchrun_command": "commands",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = offer(__name__, _NAMES)
