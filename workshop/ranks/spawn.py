"""Entry point of a rank started in a fresh interpreter (start_method="spawn").

Run as ``python -m workshop.ranks.spawn PARENT_PID RESULT_FD`` with the pickled request
on standard input and the rank's variables in the environment.
"""

from __future__ import annotations

import pickle
import sys

from .._procs import die_with_parent


def main() -> None:
    parent, result_fd = int(sys.argv[1]), int(sys.argv[2])
    die_with_parent(parent)
    request = pickle.loads(sys.stdin.buffer.read())
    from .rank import child_main, prepare_stdio, report_failed_start
    from .start import enter_request

    prepare_stdio(1, 2)
    try:
        job = enter_request(request)
    except BaseException as exc:
        report_failed_start(result_fd, exc)
    child_main(job, result_fd)


if __name__ == "__main__":
    main()
