"""No rank outlives what started it: a kernel interrupt, the kernel's death, or the
interpreter's exit. Each test runs a small script that plays the notebook kernel, a
fresh process that has not touched CUDA, so "fork" works on a GPU node too; the
ranks are pinned to gloo, since how ranks stop does not depend on the backend."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from conftest import gone

SIZE = {"fork": 3, "server": 3, "spawn": 2}

HANGING_LAUNCH = """
    import os, sys, time, workshop
    import torch.distributed as dist
    from workshop.ranks.start import SERVER

    METHOD = {method!r}
    GLOO = dict(backend="gloo", start_method=METHOD)

    def hang():
        print("rank-pid", os.getpid(), flush=True)
        time.sleep(3600)

    if METHOD == "server":
        workshop.launch(dist.get_rank, world_size=1, show="none", **GLOO)
        print("server-pid", SERVER.popen.pid, flush=True)
    print("kernel-pid", os.getpid(), flush=True)
"""


def _rank_pids(script, count: int, timeout: float = 90.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = re.findall(r"rank-pid (\d+)", "".join(script.lines))
        if len(pids) >= count:
            return [int(p) for p in pids]
        time.sleep(0.05)
    raise AssertionError("ranks did not start:\n" + "".join(script.lines))


@pytest.mark.parametrize("method", ["fork", "server", "spawn"])
def test_interrupt_stops_every_rank_and_the_kernel_goes_on(script, method):
    n = SIZE[method]
    s = script(
        HANGING_LAUNCH.format(method=method)
        + f"""
    try:
        workshop.launch(hang, world_size={n}, show="lines", **GLOO)
    except KeyboardInterrupt as e:
        print("caught", type(e).__name__, e, e._render_traceback_(), flush=True)
    r = workshop.launch(dist.get_rank, world_size=2, show="none", **GLOO)
    print("after", r.returns, flush=True)
    """
    )
    pids = _rank_pids(s, n)
    t0 = time.monotonic()
    s.popen.send_signal(signal.SIGINT)
    caught = s.wait_for("caught KeyboardInterrupt", timeout=30)
    assert time.monotonic() - t0 < 5, "ranks took too long to stop"
    assert not gone(pids, within=1)
    # A KeyboardInterrupt proper that carries what was stopped, and one line for
    # IPython to show in its place of a traceback.
    message = "workshop.launch: interrupted; stopped rank(s) " + ", ".join(
        map(str, range(n))
    )
    assert caught.strip() == (
        f"caught KeyboardInterrupt {message} ['KeyboardInterrupt: {message}']"
    )
    s.wait_for("after [0, 1]", timeout=90)  # the kernel is still usable
    assert s.finish() and s.popen.returncode == 0


@pytest.mark.parametrize("method", ["fork", "server", "spawn"])
def test_no_rank_survives_the_kernel_being_killed(script, method):
    n = SIZE[method]
    s = script(
        HANGING_LAUNCH.format(method=method)
        + f"""
    workshop.launch(hang, world_size={n}, show="lines", **GLOO)
    """
    )
    pids = _rank_pids(s, n)
    if method == "server":
        pids.append(int(s.wait_for("server-pid").split()[1]))
    s.popen.kill()  # like a kernel that crashed or was killed on restart
    s.popen.wait(10)
    assert not gone(pids, within=5), "ranks outlived their kernel"


def test_nothing_is_left_at_interpreter_exit(script):
    # A launch still running in a thread when the interpreter exits, and a fork
    # server: both go with the interpreter.
    s = script(
        HANGING_LAUNCH.format(method="server")
        + """
    import threading
    threading.Thread(target=workshop.launch, args=(hang,), daemon=True,
                     kwargs=dict(world_size=2, backend="gloo",
                                 start_method="server")).start()
    while True:
        time.sleep(0.1)
    """
    )
    pids = _rank_pids(s, 2)
    server = int(s.wait_for("server-pid").split()[1])
    # KeyboardInterrupt in the main loop ends the interpreter the normal way (atexit
    # handlers run) while the launch's thread is still waiting for its ranks.
    s.popen.send_signal(signal.SIGINT)
    s.finish(30)
    assert not gone([*pids, server], within=5)
    assert s.popen.returncode != 0  # it ended on KeyboardInterrupt, as asked


def test_fork_server_ends_with_a_normal_exit(script):
    s = script(
        HANGING_LAUNCH.format(method="server")
        + """
    print("bye", flush=True)
    """
    )
    server = int(s.wait_for("server-pid").split()[1])
    s.finish(60)
    assert s.popen.returncode == 0
    assert not gone([server], within=5)
    assert os.getpid() != server
