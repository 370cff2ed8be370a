"""The class board under a class's load: N simulated learners each posting a
changing record every second, as their kernels would, while the instructor's
script reads the table (issue 48's benchmark).

    python -m workshop.instructor.board_bench [--learners 100] [--seconds 30]
                                              [--json FILE]      # or: make bench-board

It starts a real JupyterHub, its proxy and the board (``board_bench_hub.py``), makes
the learners and their tokens, and then, in one asyncio loop, through the proxy's
public URL:

- each learner POSTs its record to ``api/records`` once a second, one post in
  flight at a time (a kernel's poster thread); the section of its record names the
  post ("post 17");
- the instructor's poller GETs ``api/table`` every ``--poll-interval`` seconds;
  a post's **board update latency** is the time from sending it to the first
  answer of the table that shows it or a later post of that learner;
- the hub's own pages (``/hub/api/`` and ``/hub/login``, through the proxy and at
  the hub's own port) are timed by a process of its own, as a browser would load
  them, 50 times each before the load and 50 spread over it.

The learners and the poller stand in for kernels on compute nodes: their thread
runs at nice 19; the hub, proxy and board keep their priority. A **control** phase
after the load times the hub's pages again, as long, under a plain CPU load of the
size the board, proxy and learners used (busy loops with a duty cycle, no board
traffic): is the hub slower because of the board, or the busier machine?

Measured too: each POST's round trip, the CPU that the hub, the board, the proxy and
this client used over the load (utime + stime from /proc, as % of one core), the
requests the hub logged during it (how often the board asked it about a token), the
loop's lag (how late a 50 ms sleep wakes: the client's own delay, included in the
latencies). Goal (issue 48): p95 of board update under 1 s on the 2-core machine,
and the hub's own pages no slower. The figures: ``board_bench_figures.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from tornado.httpclient import AsyncHTTPClient

from .._cli import above_zero
from .._procs import is_alive, signal_group
from ..allocation import usable_cores
from ..bench.bench_output import count_option, json_option, write_json
from ..checks import positive_number, whole
from .board_bench_figures import (
    LOWEST_NICE,
    BoardLoad,
    board_table,
    control_plan,
    cpu_share,
    machine_ticks,
    process_ticks,
)
from .board_bench_hub import BenchHub, PageProbe

__all__ = ["check_board_load", "learner_record", "run_board_load"]

GRACE_S = 5.0  # after the last post, how long the poller waits for it on the table
LAG_STEP_S = 0.05
POST = re.compile(r"^post (\d+)$")
BURN_PERIOD_S = 0.02  # a busy-loop process's cycle: busy duty x this, then asleep
POST_TO = ("proxy", "board")  # where the learners post: see run_board_load
STOP_S = 30.0  # for the load's thread to clean up after Ctrl-C or a kill
# The control's busy-loop processes, forked by a launcher started at normal priority
# (a process may lower its priority, not raise it) when told "duty:nice ...". All are
# in its process group; each ends with its parent (PR_SET_PDEATHSIG, Linux).
BURNER = r"""
import ctypes, os, signal, sys, time
def die_with(parent):
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
die_with(int(sys.argv[1]))
launcher, period = os.getpid(), float(sys.argv[2])
print("ready", flush=True)
pids = []
for duty, nice in (pair.split(":") for pair in sys.stdin.readline().split()):
    pid = os.fork()
    if pid == 0:
        die_with(launcher)
        duty = float(duty)
        while True:
            began = time.monotonic()
            while time.monotonic() - began < duty * period:
                pass
            time.sleep(max(0.0, began + period - time.monotonic()))
    os.setpriority(os.PRIO_PROCESS, pid, min(19, os.nice(0) + int(nice)))
    pids.append(pid)
print(" ".join(map(str, pids)), flush=True)
sys.stdin.read()
"""


def learner_record(seq: int, index: int) -> dict[str, Any]:
    """The record learner ``index`` posts the ``seq``-th time: where it is (the
    section names the post), a few exercises that change, a quiz, now and then an
    error and a hand: the size of a real one, within the board's schema.

    Args:
        seq: the record's sequence number, 1 for the first post.
        index: which learner (varies the failures a little).

    Returns:
        The record, as a kernel's poster sends it (JSON-ready).

    Example:
        >>> learner_record(17, 0)["where"]["section"]
        'post 17'
    """
    return {
        "version": 1,
        "seq": seq,
        "where": {"notebook": "02_data_parallel.ipynb", "section": f"post {seq}"},
        "exercises": {
            "01.device": {"passed": True, "failures": 0, "reason": ""},
            "01.batch": {"passed": True, "failures": 1, "reason": ""},
            "02.ring": {
                "passed": seq % 4 == 0,
                "failures": seq // 4 + index % 3,
                "reason": "" if seq % 4 == 0 else "expected 6.0 on every rank, got 5.0",
            },
            "02.bytes": {"passed": False, "failures": seq, "reason": "off by 4x"},
        },
        "quizzes": {"01": {"right": 5, "checked": 6, "questions": 6}},
        "error": (
            {"type": "RuntimeError", "notebook": "02", "section": "2", "seq": seq}
            if seq % 5 == 0
            else None
        ),
        "hand": {"kind": "help", "seq": seq} if seq % 10 == 0 else None,
    }


# -- the load, in one asyncio loop
class _Run:
    """The shared state of one run's coroutines."""

    def __init__(self, hub: BenchHub, load: BoardLoad, client: Any) -> None:
        self.hub, self.load, self.client = hub, load, client
        own = load.post_to == "board"  # else through the proxy, as a browser
        self.post_url = (hub.board_own_url if own else hub.board_url) + "api/records"
        self.pending: dict[str, dict[int, float]] = {n: {} for n in hub.tokens}
        self.posting = True
        self.start = 0.0  # when the load starts (time.monotonic())

    async def fetch(self, url: str, **kwargs: Any) -> tuple[int, bytes, float]:
        """(status, body, seconds); status 599 where no answer came."""
        sent = time.monotonic()
        try:
            answer = await self.client.fetch(url, raise_error=False, **kwargs)
            code, body = answer.code, answer.body or b""
        except Exception as exc:  # a timeout or a refused connection: counted
            code, body = 599, repr(exc).encode()
        return code, body, time.monotonic() - sent

    async def learner(self, index: int, name: str, start: float, end: float) -> None:
        """Post once a second, one post in flight (a kernel's poster thread)."""
        headers = {
            "Authorization": f"token {self.hub.tokens[name]}",
            "Content-Type": "application/json",
        }
        url = self.post_url
        due, seq = start, 0
        while due < end:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            seq += 1
            body = json.dumps(learner_record(seq, index))
            self.pending[name][seq] = time.monotonic()
            self.load.posts += 1
            code, answer, seconds = await self.fetch(
                url, method="POST", headers=headers, body=body, request_timeout=10
            )
            self.load.post.append(seconds)
            if code != 200:
                self.pending[name].pop(seq, None)
                first = answer.decode(errors="replace").strip().splitlines()[:1]
                self.load.refused.append(f"{code}: {''.join(first)[:120]}")
            due += 1.0

    async def poller(self, interval: float) -> None:
        """Read the table until every post was seen, or ``GRACE_S`` after the load."""
        headers = {"Authorization": f"token {self.hub.instructor_token}"}
        url = self.hub.board_url + "api/table"
        deadline = None
        while True:
            sent = time.monotonic()
            code, body, seconds = await self.fetch(
                url, headers=headers, request_timeout=10
            )
            seen = time.monotonic()
            self.load.table.append(seconds)
            if code == 200:
                self.see(json.loads(body)["learners"], seen)
            if not self.posting:
                deadline = deadline or seen + GRACE_S
                if not any(self.pending.values()) or seen > deadline:
                    break
            await asyncio.sleep(max(0.0, sent + interval - time.monotonic()))
        self.load.unseen = sum(len(p) for p in self.pending.values())

    def see(self, rows: list[dict[str, Any]], when: float) -> None:
        """Every pending post that a row shows (its post or a later one) is seen."""
        for row in rows:
            pending = self.pending.get(row.get("learner"))
            shown = POST.match(str(row.get("section") or ""))
            if not pending or not shown:
                continue
            for seq in [s for s in pending if s <= int(shown[1])]:
                sent = pending.pop(seq)
                self.load.update.append(when - sent)
                self.load.update_sent.append(sent - self.start)

    async def lag(self, end: float) -> None:
        while time.monotonic() < end:
            asked = time.monotonic()
            await asyncio.sleep(LAG_STEP_S)
            self.load.lag.append(time.monotonic() - asked - LAG_STEP_S)


class _Burners:
    """The control's busy loops (:data:`BURNER`): ``start`` at normal priority,
    ``burn`` a plan, ``close`` in any case (SIGKILL to the whole process group)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.pids: list[int] = []

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", BURNER, str(os.getpid()), str(BURN_PERIOD_S)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a group of its own: one killpg stops all
        )
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(
                f"the control's busy-loop launcher ended with code {self.proc.poll()}"
            )

    def burn(self, plan: list[tuple[float, int]]) -> list[int]:
        """Start one busy-loop process per ``(duty, nice)``; their pids."""
        self.proc.stdin.write(" ".join(f"{d:.4f}:{n}" for d, n in plan) + "\n")
        self.proc.stdin.flush()
        pids = [int(pid) for pid in self.proc.stdout.readline().split()]
        self.pids += pids
        return pids

    def close(self) -> None:
        if self.proc is not None:  # once: its pid may be another's afterwards
            signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
            for pipe in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(OSError):  # its reader was killed
                    pipe.close()
            self.proc = None
        # A killed busy loop at nice 19 on a loaded machine waits to be scheduled
        # before it dies (a CI run saw two alive just after the kill): wait, so
        # that none outlives close().
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(map(is_alive, self.pids)):
            time.sleep(0.05)


def _lowest_priority() -> int | None:
    """Lower this thread's priority to :data:`LOWEST_NICE` (on Linux a thread's own:
    the caller's threads, the hub, proxy and board keep theirs); the value, or None."""
    if not sys.platform.startswith("linux"):
        return None  # elsewhere PRIO_PROCESS of a thread's id is another process
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, LOWEST_NICE)
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:
        return None


async def _control(
    load: BoardLoad, probe: PageProbe, burners: _Burners, hz: int
) -> None:
    """Time the hub's pages under a plain CPU load of the size the load phase's
    board, proxy and learners used (:func:`control_plan`), with no board traffic."""
    plan = control_plan(load.cpu, load.cores)
    if plan is None:
        load.control = {"skipped": "the CPU of the board, proxy or learners unread"}
        return
    load.control = {"plan": plan, "target": 100.0 * sum(d for d, _ in plan)}
    pids = burners.burn(plan)
    ticks = [process_ticks(pid) for pid in pids]
    machine, began = machine_ticks(), time.monotonic()
    load.pages["control"] = await probe.run()
    wall = time.monotonic() - began
    used = [
        now - then
        for now, then in zip(map(process_ticks, pids), ticks, strict=True)
        if now is not None and then is not None
    ]
    load.control["got"] = cpu_share(sum(used), hz, wall)
    busy, total = (a - b for a, b in zip(machine_ticks(), machine, strict=True))
    load.control["machine"] = 100.0 * busy / total if total > 0 else None
    burners.close()


async def _drive(
    hub: BenchHub,
    load: BoardLoad,
    seconds: float,
    page_rounds: int,
    say: Callable[[str], None],
) -> None:
    # Every learner's post at once must not queue behind the client's own limit
    # (tornado's default is 10): one connection per post, as a kernel's urllib.
    client = AsyncHTTPClient(force_instance=True, max_clients=len(hub.tokens) + 20)
    run = _Run(hub, load, client)
    before, during, control = (
        PageProbe(hub, page_rounds, 0.0),
        PageProbe(hub, page_rounds, seconds),
        PageProbe(hub, page_rounds, seconds),
    )
    burners = _Burners()
    hz = os.sysconf("SC_CLK_TCK")
    try:
        # Everything this thread starts, it starts now, at its normal priority.
        await before.start()
        await during.start()
        await control.start()
        burners.start()
        # What the hub spends on the page requests alone, to set beside its CPU
        # over the load, which serves the same requests once more.
        idle = process_ticks(hub.pids["hub"])
        load.pages["before"] = await before.run()
        served = process_ticks(hub.pids["hub"])
        if idle is not None and served is not None:
            load.cpu["hub_pages_s"] = (served - idle) / hz
        pids = {name: pid for name, pid in hub.pids.items() if pid}
        ticks = {name: process_ticks(pid) for name, pid in pids.items()}
        ticks["client"] = process_ticks()
        load.nice = _lowest_priority()
        machine = machine_ticks()
        start = run.start = time.monotonic() + 0.2
        end = start + seconds
        say(
            f"the board answers at {hub.board_url}; {len(hub.tokens)} learners "
            f"post for {seconds:g} s"
        )
        names = list(hub.tokens)
        learners = [
            run.learner(i, name, start + i / len(names), end)  # spread over a second
            for i, name in enumerate(names)
        ]
        poller = asyncio.ensure_future(run.poller(load.poll_interval))
        logged = hub.log_size()
        timed = await asyncio.gather(during.run(), run.lag(end), *learners)
        load.hub_requests = hub.requests_since(logged)
        load.pages["during"] = timed[0]
        wall = time.monotonic() - start
        for name, pid in [*pids.items(), ("client", "self")]:
            now, then = process_ticks(pid), ticks[name]
            used = None if now is None or then is None else now - then
            load.cpu[name] = None if used is None else cpu_share(used, hz, wall)
        busy, total = (a - b for a, b in zip(machine_ticks(), machine, strict=True))
        load.cpu["machine"] = 100.0 * busy / total if total > 0 else None
        run.posting = False
        await poller
        load.wall_seconds = wall
        say(f"the control: the hub's pages under a plain CPU load, {seconds:g} s")
        await _control(load, control, burners, hz)
    finally:
        client.close()
        burners.close()
        for probe in (before, during, control):
            await probe.close()


def _in_own_thread(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` in a thread of its own (it lowers that thread's priority, not the
    caller's); Ctrl-C or a kill cancel it and wait :data:`STOP_S` for its clean-up."""
    box: dict[str, Any] = {}

    async def main() -> None:
        box["loop"], box["task"] = asyncio.get_running_loop(), asyncio.current_task()
        await work

    def target() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # raised again in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="board-bench-class", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.2)
    except BaseException:
        if "task" in box:
            try:
                box["loop"].call_soon_threadsafe(box["task"].cancel)
            except RuntimeError:  # its loop has just closed
                pass
        thread.join(STOP_S)
        raise
    if "error" in box:
        raise box["error"]


def run_board_load(
    learners: int = 100,
    seconds: float = 30.0,
    poll_interval: float = 0.1,
    page_rounds: int = 50,
    post_to: str = "proxy",
    say: Callable[[str], None] | None = None,
) -> BoardLoad:
    """Start a hub with the board, load it as the module's docstring says, stop
    everything, and return the figures.

    Args:
        learners: simulated learners, each posting once a second.
        seconds: how long they post.
        poll_interval: seconds between the instructor's reads of the table.
        page_rounds: GETs of each hub page before the load, and again during it.
        post_to: "proxy" (the hub's public URL, as a browser) or "board" (the
            board's own address, sparing the proxy: on the private portal the
            compute nodes reach it).
        say: called with a line when the load starts (the command prints it).

    Returns:
        A :class:`BoardLoad`.

    Raises:
        ValueError: a bad argument, before anything starts.
        BenchHubError: the hub or the board did not start or answer.
        PortalError: configurable-http-proxy is not installed (with how to get it).

    Example:
        >>> load = run_board_load(5, 3)                          # doctest: +SKIP
        >>> percentile(load.update, 95) < 1.0                     # doctest: +SKIP
        True
    """
    check_board_load(learners, seconds, poll_interval, page_rounds, post_to)
    load = BoardLoad(
        learners, seconds, poll_interval, usable_cores(), list(os.getloadavg())
    )
    load.post_to = post_to
    names = [f"learner{i:03d}" for i in range(1, learners + 1)]
    with BenchHub(names) as hub:
        load.pids = dict(hub.pids)
        _in_own_thread(_drive(hub, load, seconds, page_rounds, say or (lambda _: None)))
    load.load_after = list(os.getloadavg())
    return load


def check_board_load(
    learners: Any,
    seconds: Any,
    poll_interval: Any,
    page_rounds: Any,
    post_to: Any = "proxy",
) -> None:
    """Refuse a bad argument of :func:`run_board_load`, saying what to pass.

    Raises:
        ValueError: the first bad argument, its value and an example.

    Example:
        >>> check_board_load(100, -1, 0.1, 50)
        Traceback (most recent call last):
        ...
        ValueError: seconds must be a number above 0, not -1; e.g. seconds=30
    """
    whole("learners", learners, 1, 999, fix="e.g. learners=100")
    positive_number("seconds", seconds, fix="e.g. seconds=30")
    positive_number("poll_interval", poll_interval, fix="e.g. poll_interval=0.1")
    whole("page_rounds", page_rounds, 1, fix="e.g. page_rounds=50")
    if post_to not in POST_TO:
        raise ValueError(
            f"post_to must be one of {', '.join(POST_TO)}, not {post_to!r}; "
            "e.g. post_to='board'"
        )


# -- the command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m workshop.instructor.board_bench``."""
    count_option(
        parser, "--learners", 1, 100, "simulated learners, each posting once a second"
    )
    parser.add_argument(
        "--seconds",
        type=above_zero("--seconds 30"),
        default=30.0,
        help="how long they post (default 30)",
    )
    parser.add_argument(
        "--poll-interval",
        type=above_zero("--poll-interval 0.1"),
        default=0.1,
        help="seconds between the instructor's reads of api/table (default 0.1)",
    )
    count_option(
        parser, "--page-requests", 1, 50, "GETs of each hub page before and during"
    )
    parser.add_argument(
        "--post-to",
        choices=POST_TO,
        default="proxy",
        help="where the learners post: through the hub's proxy (default), or to "
        "the board's own address",
    )
    json_option(parser, "--json board.json", "also write the figures as JSON")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark: 0 where the goal was met, 1 where not, 2 on bad input."""
    parser = argparse.ArgumentParser(
        prog="python -m workshop.instructor.board_bench",
        description="The class board under N learners posting every second.",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        check_board_load(
            args.learners, args.seconds, args.poll_interval, args.page_requests
        )
    except ValueError as exc:
        parser.error(str(exc))
    print("starting a hub, its proxy and the board", flush=True)
    # A `kill` stops the hub, its proxy and the board as Ctrl-C does.
    before = signal.signal(signal.SIGTERM, _interrupt)
    try:
        load = run_board_load(
            args.learners,
            args.seconds,
            args.poll_interval,
            args.page_requests,
            args.post_to,
            say=lambda line: print(line, flush=True),
        )
    finally:
        signal.signal(signal.SIGTERM, before)
    print(board_table(load))
    if args.json:
        write_json(args.json, load.report())
    return 0 if load.met() else 1


if __name__ == "__main__":
    sys.exit(main())
