"""Start real distributed ranks from a notebook cell and bring everything back.

``launch(fn, world_size=4)`` runs ``fn`` on 4 ranks, each a real OS process with its
own process group membership, shows every rank's output live, and returns a
:class:`RunResult`. If a rank fails, hangs past ``timeout`` or the user presses the
kernel's stop button, every rank is stopped and nothing is left behind.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import socket
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import cloudpickle

from . import _start
from ._forkserver import ForkServer
from ._output import RankOutput
from ._rank import Job, RankError, split_messages
from ._start import START_METHODS, RankHandle
from .env import LAUNCHER_STORE_VAR, choose_backend

__all__ = ["LaunchError", "RunResult", "launch"]

# Seconds a rank gets to end after SIGTERM before SIGKILL. A rank blocked inside a
# collective may not react to SIGTERM at all, hence the second signal.
_GRACE = 2.0

_SERVER = ForkServer()
_LIVE: set[RankHandle] = set()
_told_cuda = False


@dataclass
class RunResult:
    """What the ranks of one launch did, each list indexed by rank.

    Attributes:
        world_size: number of ranks.
        backend: the process group's backend ("gloo" or "nccl").
        start_method: how ranks were started ("fork", "server" or "spawn").
        returns: what ``fn`` returned on each rank (GPU tensors come back on the CPU).
        stdout: everything each rank printed to stdout.
        stderr: everything each rank printed to stderr.
        exit_codes: each rank's exit code (negative: ended by that signal).
        wall_times: seconds each rank ran, from its start to its end.
        pids: each rank's process id (gone by the time you read this).
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


def _serialise_job(job: Job) -> bytes:
    """Pickle the job up front; on failure, say which part could not be pickled."""
    try:
        cloudpickle.dumps(job.fn)
    except Exception as exc:
        raise TypeError(
            f"fn={getattr(job.fn, '__name__', job.fn)!r} cannot be sent to the ranks: "
            f"{exc}. It (or a global it uses) holds something that cannot be "
            "serialised, such as an open file, a lock or a generator; create that "
            "thing inside fn instead"
        ) from exc
    named = [(f"argument {i}", a) for i, a in enumerate(job.args)]
    named += [(f"keyword argument {k}", v) for k, v in job.kwargs.items()]
    for label, value in named:
        try:
            cloudpickle.dumps(value)
        except Exception as exc:
            raise TypeError(
                f"{label} (a {type(value).__name__}) cannot be sent to the ranks: "
                f"{exc}. Pass plain data (numbers, strings, lists, dicts, tensors, a "
                "state_dict) and build the object inside fn"
            ) from exc
    return cloudpickle.dumps(job)


def _validate(fn: Any, world_size: Any, timeout: Any, start_method: Any) -> None:
    if not callable(fn):
        raise TypeError(
            f"fn must be a function, got {type(fn).__name__} ({fn!r}); pass the "
            "function itself, launch(train, world_size=2), not its result train()"
        )
    if (
        isinstance(world_size, bool)
        or not isinstance(world_size, int)
        or world_size < 1
    ):
        raise ValueError(
            "world_size must be a whole number of ranks, 1 or more; got "
            f"{world_size!r}. Pass world_size=2, for example"
        )
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or timeout <= 0
    ):
        raise ValueError(
            f"timeout must be a number of seconds above 0, or None for no limit; "
            f"got {timeout!r}"
        )
    if start_method not in START_METHODS:
        raise ValueError(
            f"unknown start_method={start_method!r}; pass one of "
            + ", ".join(repr(m) for m in START_METHODS)
        )


def _cuda_initialized() -> bool:
    import torch

    return torch.cuda.is_initialized()


def choose_start_method(
    requested: str, cuda_initialized: bool, platform: str = sys.platform
) -> tuple[str, str]:
    """Pick how to start ranks, and say why.

    Args:
        requested: "auto", "fork", "server" or "spawn".
        cuda_initialized: whether this process has initialised CUDA.
        platform: ``sys.platform``.

    Returns:
        (start method, reason in a few words).

    Raises:
        ValueError: "fork" asked for where it is unsafe or impossible.
    """
    can_fork = hasattr(os, "fork")
    if requested == "fork":
        if not can_fork:
            raise ValueError(
                "start_method='fork' is not possible on this system; "
                "pass start_method='spawn'"
            )
        if cuda_initialized:
            raise ValueError(
                "start_method='fork' but CUDA is already initialised in this process, "
                "and a forked child cannot use CUDA; pass start_method='server' (or "
                "'auto'), or restart the kernel and launch before touching the GPU"
            )
        return "fork", "asked for"
    if requested in ("server", "spawn"):
        if requested == "server" and not can_fork:
            raise ValueError(
                "start_method='server' needs fork; pass start_method='spawn'"
            )
        return requested, "asked for"
    if not can_fork:
        return "spawn", "this system cannot fork"
    if cuda_initialized:
        return "server", "CUDA is initialised in this kernel, so it must not fork"
    if platform == "darwin":
        return "server", "macOS system libraries are not safe to fork"
    return "fork", "fastest: ranks are forked from this kernel"


# ------------------------------------------------------------------ rendezvous


def _loopback_interface() -> str | None:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for candidate in ("lo", "lo0"):
        if candidate in names:
            return candidate
    return None


class _Rendezvous:
    """The TCP store every rank meets at, served from this process on a loopback port
    this process bound itself: no other host can reach it, and no two launches can
    race for a port."""

    def __init__(self, world_size: int, timeout: float):
        import torch.distributed as dist

        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        kwargs = dict(
            is_master=True, timeout=timedelta(seconds=timeout), wait_for_workers=False
        )
        try:
            # The store takes ownership of the descriptor it is given and closes it.
            self.fd = os.dup(listener.fileno())
            try:
                self.store = dist.TCPStore(
                    "127.0.0.1",
                    self.port,
                    world_size,
                    master_listen_fd=self.fd,
                    **kwargs,
                )
            except (RuntimeError, TypeError, ValueError):
                # Some torch releases serve a pre-bound socket only without libuv.
                self.fd = os.dup(listener.fileno())
                self.store = dist.TCPStore(
                    "127.0.0.1",
                    self.port,
                    world_size,
                    master_listen_fd=self.fd,
                    use_libuv=False,
                    **kwargs,
                )
        finally:
            listener.close()

    def close(self) -> None:
        self.store = None  # closes the listening socket


def _rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    env[LAUNCHER_STORE_VAR] = "1"
    loopback = _loopback_interface()
    if loopback and "GLOO_SOCKET_IFNAME" not in env:
        # Ranks of a single-node launch talk over loopback only; this also spares
        # laptops whose host name does not resolve.
        env["GLOO_SOCKET_IFNAME"] = loopback
    # Ranks leave a kernel's inline plotting backend alone.
    env.pop("MPLBACKEND", None)
    return env


# ------------------------------------------------------------------ the launch


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"was killed by {_signal_name(code)}"
    return f"exited with code {code}"


_PEER_LOSS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def _is_peer_loss(error: RankError) -> bool:
    """True for the error a rank gets in a collective when another rank went away."""
    return error.type.startswith("Dist") or any(s in error.message for s in _PEER_LOSS)


class _Launch:
    """One launch in progress: its ranks, their pipes, and what they reported."""

    def __init__(
        self,
        job: Job,
        world_size: int,
        backend: str,
        method: str,
        timeout: float | None,
        output: RankOutput,
    ):
        self.job = job
        self.world_size = world_size
        self.backend = backend
        self.method = method
        self.timeout = timeout
        self.output = output
        self.handles: list[RankHandle] = []
        self.results: dict[int, tuple] = {}
        self.buffers: dict[int, bytearray] = {}
        self.fd_owner: dict[int, tuple[RankHandle, str]] = {}
        self.ended_at: dict[int, float] = {}
        self.closed = False
        self.t0 = time.time()

    # -- starting
    def start(self, job_bytes: bytes | None, port: int, keep_closed: list[int]) -> None:
        payload = _start.request_payload(job_bytes) if job_bytes is not None else None
        for rank in range(self.world_size):
            env = _rank_env(rank, self.world_size, port)
            if self.method == "fork":
                closed = keep_closed + [
                    fd for h in self.handles for fd in h.fds.values()
                ]
                handle = _start.fork_rank(rank, env, self.job, closed)
            elif self.method == "server":
                handle = _SERVER.start_rank(rank, env, payload)
            else:
                import pickle

                handle = _start.spawn_rank(rank, env, pickle.dumps(payload))
            self.handles.append(handle)
            _LIVE.add(handle)
            self.buffers[rank] = bytearray()
            for kind, fd in handle.fds.items():
                os.set_blocking(fd, False)
                self.fd_owner[fd] = (handle, kind)

    # -- reading
    def _read(self, fd: int) -> None:
        handle, kind = self.fd_owner[fd]
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            del self.fd_owner[fd]
            os.close(fd)
            return
        if kind == "result":
            buffer = self.buffers[handle.rank]
            buffer += data
            for message in split_messages(buffer):
                # The first report counts: a rank that raised reports once.
                self.results.setdefault(handle.rank, message)
        else:
            self.output.feed(handle.rank, kind, data)

    def _drain(self, handle: RankHandle) -> None:
        for fd in list(handle.fds.values()):
            try:
                self._read_all_now(fd)
            except BlockingIOError:
                pass

    def _read_all_now(self, fd: int) -> None:
        # Read until the pipe is empty (or closed). A finished rank's output is all in
        # the pipe already; a child it started may still hold the pipe open.
        while fd in self.fd_owner:
            handle, kind = self.fd_owner[fd]
            data = os.read(fd, 1 << 16)
            if not data:
                del self.fd_owner[fd]
                os.close(fd)
                return
            if kind == "result":
                buffer = self.buffers[handle.rank]
                buffer += data
                for message in split_messages(buffer):
                    self.results.setdefault(handle.rank, message)
            else:
                self.output.feed(handle.rank, kind, data)

    def _poll_exits(self) -> None:
        for handle in self.handles:
            if handle.rank not in self.ended_at and handle.poll() is not None:
                self.ended_at[handle.rank] = time.time()
                _LIVE.discard(handle)
                self._drain(handle)

    def _failed(self) -> list[int]:
        failed = [r for r, m in self.results.items() if m[0] == "error"]
        for handle in self.handles:
            code = handle.exit_code
            if code not in (None, 0) and handle.rank not in failed:
                failed.append(handle.rank)
        return failed

    # -- running
    def wait(self) -> None:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while len(self.ended_at) < self.world_size:
            if self._failed():
                return
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError
            wait = 0.02 if left is None else max(0.0, min(0.02, left))
            fds = list(self.fd_owner)
            if fds:
                ready, _, _ = select.select(fds, [], [], wait)
                for fd in ready:
                    if fd in self.fd_owner:
                        self._read(fd)
            else:
                time.sleep(wait)
            self._poll_exits()

    def stop(self, grace: float = _GRACE) -> list[int]:
        """Stop every rank still running (TERM, a grace period, KILL) and return the
        ranks stopped. A rank that reported an error is ending by itself and only gets
        KILL if it has not ended after the grace period."""
        reported = {r for r, m in self.results.items() if m[0] == "error"}
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
                if self.fd_owner:
                    ready, _, _ = select.select(list(self.fd_owner), [], [], 0.02)
                    for fd in ready:
                        if fd in self.fd_owner:
                            self._read(fd)
                else:
                    time.sleep(0.02)
        self._poll_exits()
        # Stopped: ended by our signals. A rank that ended otherwise meanwhile (it
        # crashed, say) is reported for what it did.
        ours = (-signal.SIGTERM, -signal.SIGKILL)
        return [h.rank for h in terminated if h.exit_code in ours]

    def close(self) -> None:
        """Kill what is left (only after an error in the launcher itself), reap every
        rank, read the last output and release the pipes. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
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
            _LIVE.discard(handle)
        for fd in list(self.fd_owner):
            try:
                self._read_all_now(fd)
            except OSError:
                pass
            if fd in self.fd_owner:
                del self.fd_owner[fd]
                os.close(fd)
        self.output.close()

    # -- reporting
    def result(self) -> RunResult:
        returns, walls = [], []
        for rank in range(self.world_size):
            message = self.results.get(rank)
            if message and message[0] == "ok":
                returns.append(cloudpickle.loads(message[1]))
            else:
                returns.append(None)
            if message and message[2]:
                walls.append(message[3] - message[2])
            elif rank in self.ended_at:
                walls.append(self.ended_at[rank] - self.t0)
            else:
                walls.append(None)
        return RunResult(
            world_size=self.world_size,
            backend=self.backend,
            start_method=self.method,
            returns=returns,
            stdout=[self.output.text(r, "stdout") for r in range(self.world_size)],
            stderr=[self.output.text(r, "stderr") for r in range(self.world_size)],
            exit_codes=[h.exit_code for h in self.handles]
            + [None] * (self.world_size - len(self.handles)),
            wall_times=walls,
            pids=[h.pid for h in self.handles]
            + [None] * (self.world_size - len(self.handles)),
        )

    def failure(self, stopped: list[int]) -> LaunchError:
        errors = {r: m[1] for r, m in self.results.items() if m[0] == "error"}
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
        if len(followers) == len(raised) and not crashed:
            followers = []
        raised = [r for r in raised if r not in followers]
        lines = []
        if raised:
            first = errors[raised[0]]
            who = "rank" if len(raised) == 1 else "ranks"
            lines.append(
                f"{who} {', '.join(map(str, raised))} of {self.world_size} failed; "
                f"rank {raised[0]} first, with {first.type}: {first.message}"
            )
            for rank in raised[1:]:
                lines.append(
                    f"  rank {rank}: {errors[rank].type}: {errors[rank].message}"
                )
        for rank in crashed:
            code = self.handles[rank].exit_code
            last = self.output.last_line(rank)
            lines.append(
                f"rank {rank} {_describe_exit(code)} without reporting an error"
                + (f"; its last line: {last!r}" if last else "; it printed nothing")
            )
            if code == -signal.SIGKILL:
                lines.append(
                    "  HINT: the machine may have run out of memory (dmesg says)"
                )
        if followers:
            lines.append(
                f"Then rank(s) {', '.join(map(str, followers))} lost a peer in a "
                f"collective ({errors[followers[0]].type}), a consequence of the above."
            )
        if stopped:
            lines.append(
                f"The launcher stopped rank(s) {', '.join(map(str, stopped))}."
            )
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

    def timeout_error(self, running: list[int]) -> LaunchError:
        lines = [
            f"timeout={self.timeout:g} s passed and rank(s) "
            f"{', '.join(map(str, running))} of {self.world_size} were still running; "
            "all were stopped."
        ]
        for rank in running:
            last = self.output.last_line(rank)
            lines.append(
                f"  rank {rank} last printed: {last!r}"
                if last
                else f"  rank {rank} printed nothing"
            )
        lines.append(
            "HINT: a rank that never returns is often waiting in a collective that "
            "another rank never called; otherwise pass a larger timeout."
        )
        return LaunchError("\n".join(lines), self.result(), running_ranks=running)


def launch(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int,
    backend: str = "auto",
    timeout: float | None = 600.0,
    start_method: str = "auto",
    show: str = "auto",
    **kwargs: Any,
) -> RunResult:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks, each a real process.

    Before ``fn`` runs, each rank has ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR`` and ``MASTER_PORT`` set and the default process group initialised
    (NCCL with one GPU per rank when there are enough GPUs, else gloo on the CPU); the
    group is destroyed afterwards. ``fn`` may be defined in the notebook itself:
    closures, lambdas and notebook globals work.

    Args:
        fn: the function every rank runs.
        *args: positional arguments for ``fn``.
        world_size: number of ranks.
        backend: "auto", "gloo", "nccl" or "mpi".
        timeout: seconds before every rank is stopped; None for no limit.
        start_method: "auto" (fork the kernel when that is safe, else a clean fork
            server), "fork", "server" or "spawn" (a fresh interpreter per rank).
        show: "auto" (live in the cell), "lines" (plain lines) or "none".
        **kwargs: keyword arguments for ``fn``. (To pass one that shares a name with
            the options above, wrap ``fn`` with ``functools.partial``.)

    Returns:
        A :class:`RunResult` with each rank's return value, output, exit code and
        wall time, in rank order.

    Raises:
        LaunchError: a rank raised or crashed (the other ranks are stopped), or
            ``timeout`` passed. The message names the ranks, the exception and the
            traceback; ``.result`` holds what the ranks printed.
        ValueError, TypeError: bad arguments, with the fix in the message.
        KeyboardInterrupt: the kernel was interrupted; every rank was stopped first.

    Example:
        >>> def hello():
        ...     import torch.distributed as dist
        ...     print(f"rank {dist.get_rank()} of {dist.get_world_size()}")
        ...     return dist.get_rank()
        >>> launch(hello, world_size=2, show="none").returns
        [0, 1]

    Warning:
        A kernel that has initialised CUDA cannot fork; ranks then start from a fork
        server, whose first start takes a few seconds while it imports torch.
    """
    global _told_cuda
    _validate(fn, world_size, timeout, start_method)
    backend = choose_backend(backend, world_size)
    cuda = _cuda_initialized()
    method, reason = choose_start_method(start_method, cuda)
    if method == "server" and cuda and not _told_cuda:
        _told_cuda = True
        print(
            "workshop.launch: CUDA is already initialised in this kernel, and a "
            "process that has initialised CUDA cannot be forked safely. Ranks are "
            "started from a clean fork server instead (torch preloaded, CUDA "
            "untouched); its first start takes a few seconds.",
            file=sys.stderr,
        )
    job = Job(fn, args, kwargs, backend, collective_timeout=timeout or 3600.0)
    job_bytes = _serialise_job(job)
    if method == "server":
        try:
            _SERVER.start()
        except (RuntimeError, TimeoutError, OSError) as exc:
            print(
                f"workshop.launch: {exc}; starting ranks with spawn instead",
                file=sys.stderr,
            )
            method, reason = "spawn", "the fork server could not start"
    header = (
        f"launch: world_size={world_size}, backend={backend}, start_method={method}"
        + (
            ""
            if reason in ("asked for", "fastest: ranks are forked from this kernel")
            else f" ({reason})"
        )
    )
    rendezvous = _Rendezvous(world_size, timeout or 3600.0)
    output = RankOutput(world_size, header, show)
    run = _Launch(job, world_size, backend, method, timeout, output)
    running: list[int] = []
    stopped: list[int] | None = None
    try:
        with warnings.catch_warnings():
            # Python warns that forking a threaded process may deadlock the child; the
            # rank only replaces its stdio and then runs fresh code, and CUDA (the
            # real danger) is checked above.
            warnings.simplefilter("ignore", DeprecationWarning)
            run.start(
                None if method == "fork" else job_bytes,
                rendezvous.port,
                [rendezvous.fd],
            )
        try:
            run.wait()
        except TimeoutError:
            running = run.stop()
        except KeyboardInterrupt:
            interrupted = run.stop(grace=1.0)
            print(
                "workshop.launch: interrupted; stopped rank(s) "
                f"{', '.join(map(str, interrupted)) or 'none (all had ended)'}",
                file=sys.stderr,
            )
            raise
        else:
            if run._failed():
                stopped = run.stop()
    finally:
        run.close()
        rendezvous.close()
    if running:
        raise run.timeout_error(running)
    if stopped is not None:
        raise run.failure(stopped)
    return run.result()


@atexit.register
def _stop_everything() -> None:
    """At interpreter exit, leave no rank and no fork server behind."""
    for handle in list(_LIVE):
        handle.signal(signal.SIGKILL)
        handle.poll()
    _LIVE.clear()
    _SERVER.close()
