"""Command line of the workshop's benchmarks: ``python -m workshop.bench COMMAND``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workshop.bench", description="Benchmarks that print figures."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    from . import allreduce_bench, launch_bench, scaling_bench, train_bench

    launch_bench.add_arguments(
        commands.add_parser(
            "launch", help="start-up time of workshop.launch vs torchrun"
        )
    )
    train_bench.add_arguments(
        commands.add_parser("train", help="training samples per second on one device")
    )
    allreduce_bench.add_arguments(
        commands.add_parser(
            "allreduce", help="all-reduce time, algbw, busbw per size; alpha-beta fit"
        )
    )
    scaling_bench.add_arguments(
        commands.add_parser(
            "scaling", help="weak and strong scaling of training across world sizes"
        )
    )
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command == "launch":
        return launch_bench.main(args)
    if args.command == "train":
        return train_bench.main(args)
    if args.command == "allreduce":
        return allreduce_bench.main(args)
    if args.command == "scaling":
        return scaling_bench.main(args)
    return 2  # pragma: no cover - argparse rejects unknown commands first


if __name__ == "__main__":
    sys.exit(main())
