"""Command line of the workshop package::

    python -m workshop doctor     # what this machine has, what the workshop will use

A command is a function that takes the parsed arguments and returns an exit status;
to add one, write it and register it in :func:`_parser`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import doctor

    doctor()
    return 0  # it reports what is missing; that is not a failure


def _parser() -> argparse.ArgumentParser:
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
