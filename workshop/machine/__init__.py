"""What a learner asks of the machine in front of them (notebook 05): monitoring
(Monitor, load_samples, plot_monitor, admin_commands), the network (job_interface,
infiniband_ports, watch_allreduce) and file systems (write_aged_files, purge_dry_run,
quota_commands); the doctor is ``workshop.doctor``. Imports ``sources``, ``comm``,
``draw``, ``ranks``, ``training``, ``bench`` and the base modules."""

from .._exports import offer

_NAMES = {
    "admin_commands": "monitor_probes",
    "infiniband_ports": "interconnect",
    "job_interface": "interconnect",
    "load_samples": "monitor_plot",
    "Monitor": "monitor",
    "plot_monitor": "monitor_plot",
    "purge_dry_run": "storage",
    "quota_commands": "storage",
    "watch_allreduce": "interconnect",
    "write_aged_files": "storage",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = offer(__name__, _NAMES)
