"""Command line of the workshop's benchmarks: ``python -m workshop.bench COMMAND``."""

from __future__ import annotations

import argparse
import sys

from . import (
    allreduce_worker,
    concurrent_launches,
    launch_bench,
    scaling_bench,
    train_bench,
)

# Each command: its help, the function that adds its options, the one that runs it.
COMMANDS = {
    "launch": (
        "start-up time of workshop.launch vs torchrun",
        launch_bench.add_launch_arguments,
        launch_bench.launch_main,
    ),
    "train": (
        "training samples per second on one device",
        train_bench.add_train_arguments,
        train_bench.train_main,
    ),
    "allreduce": (
        "all-reduce time, algbw, busbw per size; alpha-beta fit",
        allreduce_worker.add_arguments,
        allreduce_worker.main,
    ),
    "scaling": (
        "weak and strong scaling of training across world sizes",
        scaling_bench.add_arguments,
        scaling_bench.main,
    ),
    "concurrent": (
        "many kernels launching at once: failed launches and lines on stderr",
        concurrent_launches.add_arguments,
        concurrent_launches.main,
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workshop.bench", description="Benchmarks that print figures."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (text, add_arguments, _) in COMMANDS.items():
        add_arguments(commands.add_parser(name, help=text))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return COMMANDS[args.command][2](args)
    except ValueError as exc:
        # A value the options let through but the benchmark refuses (each message
        # names the value and the fix): one line, as argparse says its own errors.
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
