"""A launch whose process group failed while it was being set up: how to tell such
a failure from the function's own, and the error that says what happened.

The ranks are not started again: see the note below.
"""

from __future__ import annotations

from .session import LaunchError

__all__ = ["failed_while_connecting", "setup_failure"]

# gloo's connectFullMesh, which links every pair of ranks, failed with "Connection
# closed by peer" when six kernels launched at once on two cores (6 of 72 launches;
# issue 35): init_process_group is no barrier (pytorch/pytorch#103033; see
# worker.join_together), so a rank that returned at once, or ended its group, closed
# its connections under a slower one. Plain torch.distributed does the same: 3 and 5
# of 200 launches from six processes at once failed, and none once the ranks waited
# for each other (docs/benchmarks.md, "Many kernels launching at once"). Since
# workshop.process_group starts no function before every rank has joined, 200
# launches, and 120 of a function that only destroys its group, made no failure.
# The launcher used to start the ranks again after such a failure (7 restarts in 200
# launches without the wait, every failure hidden); no longer: a restart hides a
# cause the user should see. What is left to cause it is outside the function: a
# rank that dies, or the network, while the group is being set up.


def failed_while_connecting(error: LaunchError) -> bool:
    """True when every rank that raised did so while joining the process group,
    losing a connection, and none crashed: a failure of the set-up alone."""
    errors = error.errors
    if not errors or set(error.failed_ranks) - set(errors):
        return False
    return all(
        "init_process_group" in e.traceback
        and ("connectFullMesh" in e.message or "Connection closed by peer" in e.message)
        for e in errors.values()
    )


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}"


def setup_failure(
    error: LaunchError, stopped: list[int], world_size: int
) -> LaunchError:
    """The error of ranks whose process group failed while being set up.

    Args:
        error: what the session made of the failure (its errors all raised inside
            ``init_process_group``: see :func:`failed_while_connecting`).
        stopped: ranks the launcher stopped after the failure.
        world_size: ranks in the launch.

    Returns:
        A :class:`LaunchError` with the same result, ranks and errors, whose message
        says that the set-up failed, before the function ran anywhere, and gives the
        next step.

    Example:
        >>> print(setup_failure(error, [], 4))                # doctest: +SKIP
        ranks 1, 2 of 4 failed while joining the process group, ...
    """
    joining = sorted(error.errors, key=lambda r: error.errors[r].time)
    first = error.errors[joining[0]]
    said = first.message.split(" This is typically")[0].strip()
    lines = [
        f"{_ranks(joining)} of {world_size} failed while joining the process group, "
        "before the function ran on any rank"
        + (f"; rank {joining[0]} first" if len(joining) > 1 else "")
        + f", with {first.type}: {said}",
        "HINT: no rank starts the function before every rank has joined, so no rank "
        "of this launch left early: a rank died or a connection broke while the group "
        "was being made. Nothing of the function ran: run the launch again, and if it "
        "fails again, report it with what `python -m workshop.bench concurrent` "
        "prints.",
    ]
    if stopped:
        lines.append(f"The launcher stopped {_ranks(stopped)}.")
    lines += ["", f"Traceback of rank {joining[0]}:", first.traceback.rstrip()]
    return LaunchError(
        "\n".join(lines),
        error.result,
        failed_ranks=error.failed_ranks,
        errors=error.errors,
    )
