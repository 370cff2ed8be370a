"""One launch, from its first process to its last: the :class:`LaunchSession` that
owns everything a launch opens (the rendezvous store, the stack dumps, the ranks'
output and the ranks), reads what the ranks report, stops them, and turns it all
into what the launch gives back: a :class:`RunResult`, or a :class:`LaunchError`.
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from .._procs import interrupted
from ..env import rank_env
from . import start, sweep
from .output import RankOutput
from .rank import (
    STACK_FILE_VAR,
    Job,
    RankError,
    Report,
    StackDumps,
    fatal_error,
    format_frames,
    rank_frames,
    split_messages,
)
from .rendezvous import Rendezvous
from .start import SERVER, RankHandle

__all__ = ["LaunchError", "RunResult"]

# Seconds a rank gets to end after SIGTERM before SIGKILL. A rank blocked inside a
# collective may not react to SIGTERM at all, hence the second signal.
GRACE = 2.0

# Ranks of every launch still running in this process, for the exit handler.
LIVE: set[RankHandle] = set()


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _describe_exit(code: int) -> str:
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"was killed by signal {-code}"


_PEER_LOSS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def _is_peer_loss(error: RankError) -> bool:
    """True for the error a rank gets in a collective when another rank went away."""
    return error.type.startswith("Dist") or any(s in error.message for s in _PEER_LOSS)


def _raised(error: RankError) -> str:
    """``Type: message`` of a rank's error; for ``sys.exit``, what made it a failure."""
    text = f"{error.type}: {error.message}"
    if error.type == "SystemExit":
        code = error.message
        code = code if code.lstrip("-").isdigit() else repr(code)
        text += (
            f" (fn called sys.exit({code}); only sys.exit(0) or sys.exit() ends a "
            "rank successfully, as under torchrun)"
        )
    return text


@dataclass(frozen=True)
class Plan:
    """What ``launcher.preflight`` decided: all a :class:`LaunchSession` needs
    (``job_bytes`` for ranks started outside this process; ``timeout`` None: none)."""

    job: Job
    job_bytes: bytes
    world_size: int
    backend: str
    method: str
    timeout: float | None
    header: str
    show: str


class LaunchSession:
    """One launch: everything it opens, and what its ranks reported.

    ``with LaunchSession(plan) as run:`` opens, in order, the launch's tag (and the
    kernel's watchdog), the rendezvous store, the folder of stack dumps and the
    ranks' output; :meth:`run` starts the ranks and waits for them. Leaving the
    block closes it all in the reverse order, however it is left: the ranks are
    stopped and reaped, their last output read, the store and the folder removed,
    and whatever the ranks started and left running is stopped and named.
    """

    def __init__(self, plan: Plan):
        self.plan = plan
        self.world_size = plan.world_size
        self.method = plan.method
        self.timeout = plan.timeout
        self.handles: list[RankHandle] = []
        self.results: dict[int, Report] = {}
        self.buffers: dict[int, bytearray] = {}
        self.fd_owner: dict[int, tuple[RankHandle, str]] = {}
        self.ended_at: dict[int, float] = {}
        self.closed = False
        self.t0 = time.time()
        # Marks every process of this launch, the ranks' children too (sweep.py).
        self.tag = ""
        self.rendezvous: Rendezvous | None = None
        # Where each rank's Python stack goes when the launcher asks (see rank.py).
        self.stacks: StackDumps | None = None
        self.output: RankOutput | None = None
        # How the launch ended: the ranks still running at its timeout, and those
        # stopped after a failure (None: none failed).
        self.running: list[int] = []
        self.stopped: list[int] | None = None

    def __enter__(self) -> LaunchSession:
        try:
            self.tag = sweep.next_tag()
            self.rendezvous = Rendezvous(self.world_size, self.timeout or 3600.0)
            self.stacks = StackDumps()
            self.output = RankOutput(self.world_size, self.plan.header, self.plan.show)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self) -> None:
        """Start the ranks and wait until every one ended, one failed (the others
        are then stopped) or the timeout passed (where each rank was is read, then
        all are stopped). The kernel's stop button stops every rank, at any point,
        and raises a ``KeyboardInterrupt`` that names them."""
        try:
            with warnings.catch_warnings():
                # Python warns that forking a threaded process may deadlock the
                # child; the rank only replaces its stdio and then runs fresh code,
                # and CUDA (the real danger) was checked before.
                warnings.simplefilter("ignore", DeprecationWarning)
                self._start()
            self.rendezvous.serve()  # only now: no rank is forked while it serves
            try:
                self.wait()
            except TimeoutError:
                # Where each rank was, before they are stopped (and no longer there).
                self.stacks.collect(self.handles)
                self.running = self.stop()
            else:
                if self.failed():
                    self.stopped = self.stop()
        except KeyboardInterrupt:
            ranks = _ranks(self.stop(grace=1.0)) or "none (all had ended)"
            # One line in the cell instead of a traceback through the launcher.
            raise interrupted(
                f"workshop.launch: interrupted; stopped rank(s) {ranks}"
            ) from None

    # -- starting
    def _start(self) -> None:
        """Start every rank; a rank not forked from here gets the pickled job."""
        port, listener = self.rendezvous.port, self.rendezvous.fd
        payload = None
        if self.method != "fork":
            payload = start.request_payload(self.plan.job_bytes)
        for rank in range(self.world_size):
            env = rank_env(rank, self.world_size, port)
            env[sweep.TAG_VAR] = self.tag
            env[STACK_FILE_VAR] = self.stacks.path(rank)
            if self.method == "fork":
                closed = [listener] + [
                    fd for h in self.handles for fd in h.fds.values()
                ]
                handle = start.fork_rank(rank, env, self.plan.job, closed)
            elif self.method == "server":
                handle = SERVER.start_rank(rank, env, payload)
            else:
                handle = start.spawn_rank(rank, env, pickle.dumps(payload))
            self.handles.append(handle)
            LIVE.add(handle)
            self.buffers[rank] = bytearray()
            for kind, fd in handle.fds.items():
                os.set_blocking(fd, False)
                self.fd_owner[fd] = (handle, kind)

    # -- reading
    def _read(self, fd: int) -> bool:
        """Read what ``fd`` holds now; False once it is empty or closed."""
        handle, kind = self.fd_owner[fd]
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return False
        if not data:
            del self.fd_owner[fd]
            os.close(fd)
            return False
        if kind == "result":
            buffer = self.buffers[handle.rank]
            buffer += data
            for message in split_messages(buffer):
                # The first report counts: a rank that raised reports once.
                self.results.setdefault(handle.rank, message)
        else:
            self.output.feed(handle.rank, kind, data)
        return True

    def _drain(self, handle: RankHandle) -> None:
        # A finished rank's output is all in its pipes already; a child it started
        # may still hold them open, so read what is there rather than to the end.
        for fd in list(handle.fds.values()):
            while fd in self.fd_owner and self._read(fd):
                pass

    def _pump(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for output and read whatever arrived."""
        self.output.refresh()  # lines held back by the redraw limit show up now
        if not self.fd_owner:
            time.sleep(wait)
            return
        ready, _, _ = select.select(list(self.fd_owner), [], [], wait)
        for fd in ready:
            if fd in self.fd_owner:
                self._read(fd)

    def _poll_exits(self) -> None:
        for handle in self.handles:
            if handle.rank not in self.ended_at and handle.poll() is not None:
                self.ended_at[handle.rank] = time.time()
                LIVE.discard(handle)
                self._drain(handle)

    def failed(self) -> list[int]:
        """Ranks that reported an error or ended with a non-zero code so far."""
        failed = [r for r, m in self.results.items() if m.error is not None]
        for handle in self.handles:
            code = handle.exit_code
            if code not in (None, 0) and handle.rank not in failed:
                failed.append(handle.rank)
        return failed

    # -- running
    def wait(self) -> None:
        """Read output until every rank ended or one failed; TimeoutError at timeout."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while len(self.ended_at) < self.world_size:
            if self.failed():
                return
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError
            self._pump(0.02 if left is None else max(0.0, min(0.02, left)))
            self._poll_exits()

    def where(self, rank: int) -> list[str]:
        """Lines that say where ``rank`` was when asked (empty: not asked)."""
        if rank not in self.stacks.dumps:
            return []
        frames = rank_frames(self.stacks.dumps[rank])
        if not frames:
            return ["    (it had not started the function yet)"]
        return format_frames(frames)

    def stop(self, grace: float = GRACE) -> list[int]:
        """Stop every rank still running (TERM, a grace period, KILL) and return the
        ranks stopped. A rank that reported an error is ending by itself and only gets
        KILL if it has not ended after the grace period."""
        reported = {r for r, m in self.results.items() if m.error is not None}
        running = [h for h in self.handles if h.poll() is None]
        terminated = [h for h in running if h.rank not in reported]
        for sig, targets, wait in (
            (signal.SIGTERM, terminated, grace),
            (signal.SIGKILL, running, 10.0),
        ):
            for handle in targets:
                if handle.poll() is None:
                    handle.signal(sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and any(
                h.poll() is None for h in running
            ):
                self._pump(0.02)
        self._poll_exits()
        # Stopped: ended by our signals. A rank that ended otherwise meanwhile (it
        # crashed, say) is reported for what it did.
        ours = (-signal.SIGTERM, -signal.SIGKILL)
        return [h.rank for h in terminated if h.exit_code in ours]

    def close(self) -> None:
        """Close what the launch opened, in the reverse order: kill the ranks left
        (only after an error in the launcher itself), reap every rank, read the last
        output and release the pipes; remove the stack dumps and the store; stop
        what the ranks started and left running, and say so. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        try:
            self._close_ranks()
        finally:
            for part in (self.output, self.stacks, self.rendezvous):
                if part is not None:
                    part.close()
            if self.tag:
                sweep.stop_launch(self.tag)

    def _close_ranks(self) -> None:
        for handle in self.handles:
            if handle.poll() is None:
                handle.signal(signal.SIGKILL)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and any(
            h.poll() is None for h in self.handles
        ):
            time.sleep(0.01)
        self._poll_exits()
        for handle in self.handles:
            LIVE.discard(handle)
        for handle in self.handles:
            self._drain(handle)
        for fd in list(self.fd_owner):
            del self.fd_owner[fd]
            os.close(fd)

    # -- reporting
    def result(self) -> RunResult:
        returns, walls, traces = [], [], []
        for rank in range(self.world_size):
            report = self.results.get(rank)
            traces.append(list(report.trace) if report else [])
            if report and report.error is None:
                returns.append(cloudpickle.loads(report.value))
            else:
                returns.append(None)
            if report and report.start:
                walls.append(report.end - report.start)
            elif rank in self.ended_at:
                walls.append(self.ended_at[rank] - self.t0)
            else:
                walls.append(None)
        return RunResult(
            world_size=self.world_size,
            backend=self.plan.backend,
            start_method=self.method,
            returns=returns,
            stdout=[self.output.text(r, "stdout") for r in range(self.world_size)],
            stderr=[self.output.text(r, "stderr") for r in range(self.world_size)],
            exit_codes=[h.exit_code for h in self.handles]
            + [None] * (self.world_size - len(self.handles)),
            wall_times=walls,
            traces=traces,
            pids=[h.pid for h in self.handles]
            + [None] * (self.world_size - len(self.handles)),
        )

    def failure(self, stopped: list[int]) -> LaunchError:
        errors = {r: m.error for r, m in self.results.items() if m.error is not None}
        raised = sorted(errors, key=lambda r: errors[r].time)
        crashed = [
            h.rank
            for h in self.handles
            if h.rank not in errors
            and h.exit_code not in (None, 0)
            and h.rank not in stopped
        ]
        # A rank whose peer died fails in its next collective ("Connection closed by
        # peer"). That is a consequence, not the cause: name the cause first.
        followers = [r for r in raised if _is_peer_loss(errors[r])]
        # A rank that returned leaves its group; one still calling a collective with
        # it loses it there. The cause is the rank that returned early.
        finished = sorted(r for r, m in self.results.items() if m.error is None)
        # A rank whose process ended with code 0 and no report left by os._exit(0)
        # (or a library that ends the process): the cause, as a rank that returned.
        vanished = [
            h.rank
            for h in self.handles
            if h.exit_code == 0 and h.rank not in self.results and h.rank not in stopped
        ]
        if len(followers) == len(raised) and not crashed and (finished or vanished):
            return self._returned_early(finished, vanished, followers, errors, stopped)
        if len(followers) == len(raised) and not crashed:
            followers = []
        raised = [r for r in raised if r not in followers]
        lines = []
        if raised:
            first = errors[raised[0]]
            who = "rank" if len(raised) == 1 else "ranks"
            lines.append(
                f"{who} {_ranks(raised)} of {self.world_size} failed; "
                f"rank {raised[0]} first, with {_raised(first)}"
            )
            for rank in raised[1:]:
                lines.append(f"  rank {rank}: {_raised(errors[rank])}")
        for rank in crashed:
            code = self.handles[rank].exit_code
            lines += self._crash(rank, code)
            if code == -signal.SIGKILL:
                lines.append(
                    "  HINT: the machine may have run out of memory (dmesg says)"
                )
        if followers:
            lines.append(
                f"Then rank(s) {_ranks(followers)} lost a peer in a "
                f"collective ({errors[followers[0]].type}), a consequence of the above."
            )
        if stopped:
            lines.append(f"The launcher stopped rank(s) {_ranks(stopped)}.")
        if raised:
            lines += [
                "",
                f"Traceback of rank {raised[0]}:",
                errors[raised[0]].traceback.rstrip(),
            ]
        return LaunchError(
            "\n".join(lines),
            self.result(),
            failed_ranks=sorted(raised + crashed),
            errors=errors,
        )

    def _returned_early(
        self,
        finished: list[int],
        vanished: list[int],
        lost: list[int],
        errors: dict,
        stopped: list[int],
    ) -> LaunchError:
        """The error of a launch where ``finished`` returned from the function (or
        ``vanished`` ended their process with code 0 without reporting) while
        ``lost`` still called a collective with them, and failed in it."""
        first = errors[lost[0]]
        left = []
        if finished:
            left.append(
                f"rank(s) {_ranks(finished)} of {self.world_size} "
                "returned from the function (or called sys.exit)"
            )
        if vanished:
            left.append(
                f"rank(s) {_ranks(vanished)} of {self.world_size} ended "
                "their process with exit code 0 without returning (os._exit(0), or a "
                "library that ended the process)"
            )
        how = "return (or sys.exit)" if not vanished else "return, sys.exit or os._exit"
        lines = [
            " and ".join(left)
            + f" while rank(s) {_ranks(lost)} still called a collective "
            "with them; a rank that returns leaves the process "
            f"group, so rank {lost[0]} failed in it with {first.type}: "
            + first.message.split(" This is typically")[0],
            "HINT: every rank must call the same collectives in the same order; look "
            f"for a {how} that only some ranks reach.",
        ]
        if stopped:
            lines.append(f"The launcher stopped rank(s) {_ranks(stopped)}.")
        lines += ["", f"Traceback of rank {lost[0]}:", first.traceback.rstrip()]
        return LaunchError(
            "\n".join(lines), self.result(), failed_ranks=lost, errors=errors
        )

    def _crash(self, rank: int, code: int) -> list[str]:
        """What a rank that ended without reporting an error left to say: the fatal
        error and the innermost frames faulthandler wrote on its stderr when it
        crashed, else its last line."""
        said = f"rank {rank} {_describe_exit(code)} without reporting an error"
        fatal = fatal_error(self.output.text(rank, "stderr"))
        if fatal is None:
            last = self.output.last_line(rank)
            return [
                said
                + (f"; its last line: {last!r}" if last else "; it printed nothing")
            ]
        line, frames = fatal
        if not frames:
            return [f"{said}: {line!r}"]
        return [
            f"{said}: {line!r}. Where its function was (innermost call last):",
            *format_frames(frames),
            f"  HINT: the crash was in C code called from the last line above; "
            f"result.stderr[{rank}] has the whole report (every thread's stack)",
        ]

    def timeout_error(self, running: list[int]) -> LaunchError:
        lines = [
            f"timeout={self.timeout:g} s passed and rank(s) "
            f"{_ranks(running)} of {self.world_size} were still running; "
            "all were stopped."
        ]
        asked = any(self.where(rank) for rank in running)
        if asked:
            lines.append("Where each rank was (innermost call last):")
        for rank in running:
            last = self.output.last_line(rank)
            lines.append(
                f"  rank {rank} last printed: {last!r}"
                if last
                else f"  rank {rank} printed nothing"
            )
            lines += self.where(rank)
        returned = sorted(
            r for r, m in self.results.items() if m.error is None and r not in running
        )
        if returned:
            lines.append(
                f"Rank(s) {_ranks(returned)} had returned from the "
                "function; a collective the others called needed them."
            )
        lines.append(
            "HINT: a rank that never returns is often waiting in a collective that "
            "another\nrank never called"
            + ("; compare where the ranks were," if asked else ";")
            + " or pass a larger timeout."
        )
        return LaunchError("\n".join(lines), self.result(), running_ranks=running)


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


@atexit.register
def _stop_everything() -> None:
    """At interpreter exit, leave no rank, nothing a rank started, and no fork
    server behind."""
    for handle in list(LIVE):
        handle.signal(signal.SIGKILL)
        handle.poll()
    LIVE.clear()
    SERVER.close()
    sweep.stop_all_tags()
