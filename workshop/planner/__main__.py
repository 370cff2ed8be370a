"""Command line of the planner: ``python -m workshop.planner COMMAND``.

    python -m workshop.planner calibrate [--out FILE] [--threads N] [--quick]

``calibrate`` measures this machine (:func:`workshop.planner.calibrating.calibrate`),
prints what it found and saves it as a record the planner reads
(``Calibration.load(FILE).gpu()``, ``.network()``).
"""

from __future__ import annotations

import argparse
import sys

from .._cli import whole_number, writable_file

#: Where ``calibrate`` saves its record unless told: the current folder.
DEFAULT_OUT = "calibration.json"


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m workshop.planner calibrate``."""
    parser.add_argument(
        "--out",
        type=writable_file("--out calibration.json"),
        default=DEFAULT_OUT,
        help=f"the JSON record to write (default: {DEFAULT_OUT} in the current folder)",
    )
    parser.add_argument(
        "--threads",
        type=whole_number(1, "--threads 2"),
        default=None,
        help="compute threads for the CPU figures (default: what one rank of a "
        "write_job CPU job gets, its --cpus-per-task over its ranks: 1)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer sizes and samples: seconds instead of a minute",
    )


def calibrate_main(args: argparse.Namespace) -> int:
    """Measure, print the summary, save the record and say where."""
    from .calibrating import calibrate

    found = calibrate(args.threads, quick=args.quick)
    print(found.summary())
    path = found.save(args.out)
    print(f"saved {path.resolve()}")
    return 0


# Each command: its help, the function that adds its options, the one that runs it.
COMMANDS = {
    "calibrate": (
        "measure this machine's matmul rate, memory bandwidth and all-reduce busbw",
        add_calibrate_arguments,
        calibrate_main,
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workshop.planner",
        description="The layout planner's commands.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (text, add_arguments, _) in COMMANDS.items():
        add_arguments(commands.add_parser(name, help=text, description=text))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return COMMANDS[args.command][2](args)
    except ValueError as exc:
        # A value the options let through but the command refuses (each message
        # names the value and the fix): one line, as argparse says its own errors.
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
