"""What a launch gives back: a :class:`RunResult`, or a :class:`LaunchError`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .rank import RankError

__all__ = ["LaunchError", "RunResult"]


@dataclass
class RunResult:
    """What the ranks of one launch did, each list indexed by rank.

    Attributes:
        world_size: number of ranks.
        backend: the process group's backend ("gloo" or "nccl").
        start_method: how ranks were started ("fork", "server" or "spawn").
        returns: what ``fn`` returned on each rank (GPU tensors come back on the CPU).
        stdout: what each rank printed to stdout: its last 10,000 lines (at most
            2,000,000 characters), each line cut at 10,000 characters with a
            count of the rest, under a first line "[... N earlier lines dropped;
            the last M kept ...]" when lines were dropped.
        stderr: the same for stderr.
        exit_codes: each rank's exit code (negative: ended by that signal).
        wall_times: seconds each rank ran, from its start to its end.
        pids: each rank's process id (gone by the time you read this).
        traces: each rank's communication events, recorded with
            ``launch(..., trace=True)`` (see :mod:`workshop.comm.tracing`); empty lists
            otherwise.
    """

    world_size: int
    backend: str
    start_method: str
    returns: list[Any] = field(default_factory=list)
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    exit_codes: list[int | None] = field(default_factory=list)
    wall_times: list[float | None] = field(default_factory=list)
    pids: list[int | None] = field(default_factory=list)
    traces: list[list[Any]] = field(default_factory=list)

    def __repr__(self) -> str:
        # No times or pids here: a notebook's stored output must be the same every run.
        return (
            f"RunResult(world_size={self.world_size}, backend={self.backend!r}, "
            f"start_method={self.start_method!r}, returns={self.returns!r}, "
            f"exit_codes={self.exit_codes!r})"
        )


class LaunchError(RuntimeError):
    """A launch failed: a rank raised or crashed, or the launch timed out.

    Attributes:
        failed_ranks: ranks that raised or crashed (empty on a timeout).
        errors: for each rank that raised, its :class:`RankError` (type, message,
            traceback).
        running_ranks: ranks still running when the launch gave up (timeout).
        result: the partial :class:`RunResult` (output, exit codes) of every rank.
    """

    def __init__(
        self,
        message: str,
        result: RunResult,
        failed_ranks: list[int] | None = None,
        errors: dict[int, RankError] | None = None,
        running_ranks: list[int] | None = None,
    ):
        super().__init__(message)
        self.result = result
        self.failed_ranks = failed_ranks or []
        self.errors = errors or {}
        self.running_ranks = running_ranks or []


# ------------------------------------------------------------------ validation
