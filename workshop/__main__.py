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
    # Each module below offers add_arguments(parser) and run_from_args(args).
    from .instructor import kernelspec, portal, site_env
    from .machine import monitor

    for module, name, help_, description in (
        # python -m workshop monitor --output monitor.csv --seconds 600 &  (a batch job)
        (monitor, "monitor",
         "sample CPU, memory, disk, network and GPUs into a CSV file",
         "Sample this node every --interval seconds into a CSV file, one row per "
         "sample, until --seconds pass or SIGTERM; draw it with "
         "workshop.machine.plot_monitor(workshop.machine.load_samples(path))."),
        (portal, "portal",
         "start, stop or show a private JupyterHub that spawns on Slurm",
         "A private cluster portal on this machine: JupyterHub with batchspawner's "
         "SlurmSpawner on the private two-node Slurm cluster, learner accounts with "
         "passwords made at start, all on 127.0.0.1. Needs root."),
        # Before anything is installed: python workshop/instructor/site_env.py
        (site_env, "site-env", "make .venv on top of the site's Python and its torch",
         "Say what this Python is (a plain install, a conda environment or a venv) "
         "and print the lines that make .venv see its torch; --apply runs them and "
         "checks that .venv sees the same torch."),
        # For a portal (docs/portal.md): python -m workshop kernel-spec --check
        (kernelspec, "kernel-spec",
         "write a Jupyter kernel spec for the workshop (JupyterHub, OnDemand)",
         "Write a Jupyter kernel spec that runs the workshop's Python, after loading "
         "environment modules if asked, with the workshop importable; --dry-run "
         "prints it, --check starts a kernel from it and imports workshop and torch. "
         "Exits with status 0, or 1 after saying what is wrong."),
    ):  # fmt: skip
        command = commands.add_parser(name, help=help_, description=description)
        module.add_arguments(command)
        command.set_defaults(run=module.run_from_args)
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
