"""workshop.launch inside a real Jupyter kernel: the stop button stops every rank and
leaves the kernel usable, and restarting the kernel leaves no rank behind. The ranks
are pinned to gloo: on a GPU node "auto" would give NCCL to as many ranks as GPUs,
and a launch header that says so."""

from __future__ import annotations

import time
from queue import Empty

import pytest
from conftest import gone, repo_env

jupyter_client = pytest.importorskip("jupyter_client")


def _execute(kc, code: str, timeout: float = 60.0) -> dict:
    """Run ``code`` in the kernel; return its reply content and what it printed."""
    msg_id = kc.execute(code)
    reply = kc.get_shell_msg(timeout=timeout)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=timeout)
    return reply["content"]


def _drain_iopub(kc) -> list[dict]:
    messages = []
    while True:
        try:
            messages.append(kc.get_iopub_msg(timeout=0.5))
        except Empty:
            return messages


def _wait_for_pids(directory, count: int, timeout: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = sorted(directory.glob("pid-*"))
        texts = [f.read_text() for f in files]
        if len(files) == count and all(texts):
            return [int(t) for t in texts]
        time.sleep(0.05)
    raise AssertionError(f"ranks did not start; found {list(directory.iterdir())}")


HANG = """
import os, time, workshop
def hang(directory):
    import torch.distributed as dist
    with open(os.path.join(directory, f"pid-{{dist.get_rank()}}"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(3600)
workshop.launch(hang, {directory!r}, world_size=3, backend="gloo")
"""


@pytest.fixture
def kernel():
    # The checkout first, and what PYTHONPATH held after it: a site may keep the
    # kernel's own packages (ipykernel) there.
    env = repo_env()
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3", env=env)
    yield km, kc
    kc.stop_channels()
    km.shutdown_kernel(now=True)


def test_stop_button_and_restart_leave_no_rank(kernel, tmp_path):
    km, kc = kernel
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()

    msg_id = kc.execute(HANG.format(directory=str(first)))
    pids = _wait_for_pids(first, 3)
    t0 = time.monotonic()
    km.interrupt_kernel()  # the stop button
    reply = kc.get_shell_msg(timeout=30)
    while reply["parent_header"].get("msg_id") != msg_id:  # kernel_info replies
        reply = kc.get_shell_msg(timeout=30)
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert time.monotonic() - t0 < 5
    assert not gone(pids, within=2)
    # What the cell shows: one line that says what was stopped, not a traceback
    # through the launcher (which reads as a crash).
    messages = [
        m for m in _drain_iopub(kc) if m["parent_header"].get("msg_id") == msg_id
    ]
    errors = [m["content"] for m in messages if m["msg_type"] == "error"]
    stderr = "".join(
        m["content"]["text"]
        for m in messages
        if m["msg_type"] == "stream" and m["content"]["name"] == "stderr"
    )
    assert len(errors) == 1, errors
    assert errors[0]["traceback"] == [
        "KeyboardInterrupt: workshop.launch: interrupted; stopped rank(s) 0, 1, 2"
    ]
    assert reply["content"]["traceback"] == errors[0]["traceback"]
    assert stderr == "", stderr  # nothing else in red beside it

    # The kernel is still usable: the next launch works.
    content = _execute(
        kc,
        "r = workshop.launch(lambda: 7, world_size=2, show='none')\n"
        "assert r.returns == [7, 7], r",
    )
    assert content["status"] == "ok", content

    kc.execute(HANG.format(directory=str(second)))
    pids = _wait_for_pids(second, 3)
    km.restart_kernel(now=True)  # kills the kernel process outright
    assert not gone(pids, within=5), "ranks outlived a kernel restart"


LIVE = """
import time, workshop
import torch.distributed as dist
def slow():
    print(f"started {dist.get_rank()}", flush=True)
    time.sleep(1.5)
    print(f"finished {dist.get_rank()}", flush=True)
workshop.launch(slow, world_size=2, backend="gloo")
"""


def test_output_is_live_while_ranks_run_and_rank_ordered_after(kernel):
    _km, kc = kernel
    msg_id = kc.execute(LIVE)
    messages = []
    while True:
        msg = kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    kinds = [m["msg_type"] for m in messages]
    # The launch opens a display area with its header ...
    first = messages[kinds.index("display_data")]["content"]["data"]["text/plain"]
    assert first == "launch: world_size=2, backend=gloo, start_method=fork"
    # ... shows the ranks' lines in it while they run ...
    updates = [
        m["content"]["data"]["text/plain"]
        for m in messages
        if m["msg_type"] == "update_display_data"
    ]
    live = [u for u in updates if "started" in u and "finished" not in u]
    assert live, f"no live update before the ranks finished: {updates}"
    assert "[rank 0] started 0" in live[0] or "[rank 1] started 1" in live[0]
    # ... and finally leaves the header there and the output below it, in rank order.
    assert updates[-1] == first
    stream = "".join(
        m["content"]["text"] for m in messages if m["msg_type"] == "stream"
    )
    assert stream == (
        "[rank 0] started 0\n[rank 0] finished 0\n"
        "[rank 1] started 1\n[rank 1] finished 1\n"
    )
