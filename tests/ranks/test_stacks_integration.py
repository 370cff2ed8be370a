"""Stack dumps of real launches (make test-fast leaves them out)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
from conftest import gone
from test_stacks import _line_of

from workshop import LaunchError, launch
from workshop.ranks import rank as stacks
from workshop.ranks.rank import (
    READY,
)

pytestmark = pytest.mark.usefixtures("no_leftover_children")


def _stuck():
    t = torch.ones(4)
    print(f"rank {dist.get_rank()} started", flush=True)
    if dist.get_rank() == 0:
        time.sleep(3600)
    dist.all_reduce(t)
    return t


@pytest.mark.parametrize("method", ["fork", "server", "spawn"])
def test_the_timeout_report_says_where_each_rank_was(method, tmp_path, monkeypatch):
    # The stack files go to a folder of this test's own, to see that none is left.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    timeout = 20 if method == "spawn" else 4  # a fresh interpreter imports torch
    with pytest.raises(LaunchError, match="Where each rank was") as info:
        launch(
            _stuck,
            world_size=2,
            backend="gloo",
            timeout=timeout,
            start_method=method,
            show="none",
        )
    message = str(info.value)
    sleep, reduce = _line_of(_stuck, "time.sleep"), _line_of(_stuck, "all_reduce")
    rank0, rank1 = message.split("  rank 1 last printed")
    assert "rank 0 last printed: 'rank 0 started'" in rank0
    here = "test_stacks_integration.py"
    assert f"{here}, line {sleep}, in _stuck: time.sleep(3600)" in rank0
    assert f"{here}, line {reduce}, in _stuck: dist.all_reduce(t)" in rank1
    assert "in all_reduce" in rank1  # the collective it waits in
    assert "rank.py" not in message  # none of the launch's own frames
    assert info.value.running_ranks == [0, 1]
    assert not gone(info.value.result.pids, within=1)
    assert os.listdir(tmp_path) == [], "the launch left its stack files"


def test_the_ready_mark_follows_the_registration(tmp_path, monkeypatch):
    # In a child, so that this process's own SIGUSR1 stays as it was.
    path = tmp_path / "rank-0.txt"
    code = (
        "import os, signal, time\n"
        "from workshop.ranks.rank import register_stack_dump\n"
        "def waiting_here():\n"
        "    register_stack_dump()\n"
        "    os.kill(os.getpid(), signal.SIGUSR1)\n"
        "    time.sleep(0.5)\n"
        "waiting_here()\n"
    )
    env = dict(os.environ, **{stacks.STACK_FILE_VAR: str(path)})
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    data = path.read_bytes()
    assert data.startswith(READY)
    assert "in waiting_here" in data[len(READY) :].decode()
