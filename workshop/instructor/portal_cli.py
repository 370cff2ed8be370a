"""``python -m workshop portal start|stop|status|classroom``: the command line of
the private portal (:mod:`workshop.instructor.portal`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .portal import DEFAULT_FOLDER, start, status, stop
from .portal_users import PortalError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m workshop portal``."""
    parser.add_argument(
        "action",
        choices=("start", "stop", "status", "classroom"),
        help="classroom: every learner at once runs notebook 02's "
        "launch cells on the running portal; the counts",
    )
    parser.add_argument(
        "--folder",
        default=str(DEFAULT_FOLDER),
        help="where the portal lives (default: .portal in the project)",
    )
    parser.add_argument(
        "--learners", type=int, default=6, help="learner accounts to make (default 6)"
    )


def run_from_args(args: argparse.Namespace) -> int:
    """``python -m workshop portal ACTION``: exit status 0, or 1 with the reason."""
    try:
        if args.action == "start":
            portal = start(args.folder, learners=args.learners)
            print(
                f"portal: {portal.url} (on 127.0.0.1 only; from another machine: "
                f"ssh -L {portal.url.rsplit(':', 1)[1].strip('/')}:127.0.0.1:"
                f"{portal.url.rsplit(':', 1)[1].strip('/')} THIS-MACHINE)"
            )
            print(f"learners: {', '.join(portal.learners)}; admin: {portal.instructor}")
            print(
                f"passwords: {portal.folder / 'secrets' / 'passwords.txt'} (root only)"
            )
            print(f"stop it: python -m workshop portal stop --folder {portal.folder}")
        elif args.action == "stop":
            stopped = stop(args.folder)
            print(
                f"portal in {Path(args.folder).resolve()} stopped: "
                f"{len(stopped.jobs_left)} jobs were still queued, "
                f"{len(stopped.killed)} learner processes had to be killed, "
                f"{len(stopped.users_removed)} users removed"
            )
        elif args.action == "classroom":
            from .portal_classroom import classroom

            if not (Path(args.folder) / "portal.json").exists():
                raise PortalError(f"no portal runs in {args.folder}: make portal first")
            result = classroom(args.folder)
            print(result.summary())
            return 1 if result.failures else 0
        else:
            print(status(args.folder))
    except (PortalError, ValueError) as error:
        print(f"workshop portal: {error}", file=sys.stderr)
        return 1
    return 0
