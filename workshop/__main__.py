"""Command line of the workshop package::

    python -m workshop doctor       # what this machine has, what the workshop will use
    python -m workshop check-node   # the instructor's check of a node, before class
    python -m workshop monitor      # CPU, memory, disk, network and GPU use, as CSV
    python -m workshop site-env     # .venv on top of a site's Python and its torch
    python -m workshop kernel-spec  # a Jupyter kernel for a site's JupyterHub
    python -m workshop portal start|stop|status   # a private JupyterHub on Slurm

A command is a function that takes the parsed arguments and returns an exit status;
to add one, write it and register it in :func:`_parser`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _doctor(args: argparse.Namespace) -> int:
    from .machine.doctor import doctor

    doctor()
    return 0  # it reports what is missing; that is not a failure


def _check(args: argparse.Namespace) -> int:
    from .instructor.check_node import run_from_args

    try:
        return run_from_args(args)
    except KeyboardInterrupt:
        message = "workshop check-node: interrupted; everything it started was stopped"
        print(f"\n{message}", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    from .instructor.check_node import add_arguments as check_arguments

    parser = argparse.ArgumentParser(
        prog="python -m workshop",
        description="Helpers for the workshop 'Scaling PyTorch on HPC'.",
    )
    commands = parser.add_subparsers(
        title="commands", dest="command", metavar="COMMAND"
    )
    doctor = commands.add_parser(
        "doctor",
        help="show what this machine has and what the workshop will use",
        description="Show Python, torch, GPUs, backends, launchers, the Slurm "
        "allocation and the workshop's defaults. Always exits with status 0.",
    )
    doctor.set_defaults(run=_doctor)
    check = commands.add_parser(
        "check-node",
        help="check a node before class: GPUs, launches, NCCL, throughput, notebooks",
        description="Run the doctor, the GPU tests, a launch on every start path, "
        "an NCCL all-reduce, ResNet-50 throughput and the notebooks, then print a "
        "verdict: READY, or what is wrong and how to fix it. Exits with status 0 when "
        "nothing failed, 1 otherwise.",
    )
    check_arguments(check)
    check.set_defaults(run=_check)
    # python -m workshop monitor --output monitor.csv --seconds 600 &  (in a batch job)
    from .machine.monitor import add_arguments as monitor_arguments
    from .machine.monitor import run_from_args as run_monitor

    monitor = commands.add_parser(
        "monitor",
        help="sample CPU, memory, disk, network and GPUs into a CSV file",
        description="Sample this node every --interval seconds into a CSV file, "
        "one row per sample, until --seconds pass or SIGTERM; draw it with "
        "workshop.machine.plot_monitor(workshop.machine.load_samples(path)).",
    )
    monitor_arguments(monitor)
    monitor.set_defaults(run=run_monitor)
    from .instructor.portal_cli import add_arguments as portal_arguments
    from .instructor.portal_cli import run_from_args as run_portal

    portal = commands.add_parser(
        "portal",
        help="start, stop or show a private JupyterHub that spawns on Slurm",
        description="A private cluster portal on this machine: JupyterHub with "
        "batchspawner's SlurmSpawner on the private two-node Slurm cluster, learner "
        "accounts with passwords made at start, all on 127.0.0.1. Needs root.",
    )
    portal_arguments(portal)
    portal.set_defaults(run=run_portal)
    # Before anything is installed: python workshop/instructor/site_env.py (no imports).
    from .instructor.site_env import add_arguments as site_env_arguments
    from .instructor.site_env import run_from_args as run_site_env

    site_env = commands.add_parser(
        "site-env",
        help="make .venv on top of the site's Python and its torch",
        description="Say what this Python is (a plain install, a conda environment "
        "or a venv) and print the lines that make .venv see its torch; --apply "
        "runs them and checks that .venv sees the same torch.",
    )
    site_env_arguments(site_env)
    site_env.set_defaults(run=run_site_env)
    # For a portal (docs/portal.md): python -m workshop kernel-spec --check
    from .instructor.kernelspec import add_arguments as kernel_spec_arguments
    from .instructor.kernelspec import run_from_args as run_kernel_spec

    kernel_spec = commands.add_parser(
        "kernel-spec",
        help="write a Jupyter kernel spec for the workshop (JupyterHub, OnDemand)",
        description="Write a Jupyter kernel spec that runs the workshop's Python, "
        "after loading environment modules if asked, with the workshop importable; "
        "--dry-run prints it, --check starts a kernel from it and imports workshop "
        "and torch. Exits with status 0, or 1 after saying what is wrong.",
    )
    kernel_spec_arguments(kernel_spec)
    kernel_spec.set_defaults(run=run_kernel_spec)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command of ``python -m workshop``.

    Args:
        argv: the arguments after ``python -m workshop``; ``sys.argv[1:]`` when omitted.

    Returns:
        The exit status: the command's, or 2 when no command was given (after
        printing the help). An unknown command exits with argparse's error (status 2).

    Example:
        >>> main(["doctor"])  # doctest: +SKIP
        0
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
