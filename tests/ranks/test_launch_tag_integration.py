"""Launch tags on the processes of a real launch (make test-fast leaves them out)."""

from __future__ import annotations

import os
import subprocess
import warnings

import pytest

import workshop
from workshop.ranks.sweep import TAG_VAR, kernel_prefix

pytestmark = pytest.mark.usefixtures("no_leftover_children")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _name_of_a_forked_child() -> str:
    """/proc/self/comm of a child forked without exec (as a daemon would be)."""
    read, write = os.pipe()
    with warnings.catch_warnings():  # forking a threaded process: the child only
        warnings.simplefilter("ignore", DeprecationWarning)  # reads a file and exits
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, _read("/proc/self/comm"))
        finally:
            os._exit(0)
    os.close(write)
    name = os.read(read, 64).decode().strip()
    os.close(read)
    os.waitpid(pid, 0)
    return name


def _where_the_tag_is() -> dict:
    tag = os.environ.get(TAG_VAR)
    entry = f"{TAG_VAR}={tag}".encode()

    def run(*command: str) -> bytes:
        return subprocess.run(
            command, capture_output=True, check=True, timeout=60
        ).stdout

    return {
        "tag": tag,
        "own_environ": entry in _read("/proc/self/environ").split(b"\0"),
        "own_name": _read("/proc/self/comm").decode().strip(),
        "child_environ": entry in run("cat", "/proc/self/environ").split(b"\0"),
        "child_name": run("cat", "/proc/self/comm").decode().strip(),
        "forked_child_name": _name_of_a_forked_child(),
    }


@pytest.mark.parametrize("method", ["fork", "server", "spawn"])
def test_where_each_process_of_a_launch_carries_its_tag(method):
    result = workshop.launch(
        _where_the_tag_is,
        world_size=2,
        backend="gloo",
        start_method=method,
        show="none",
    )
    first, second = result.returns
    tag = first["tag"]
    # One tag for the launch, of this process's launches, short enough for a name.
    assert tag and tag.startswith(kernel_prefix()) and len(tag) <= 15
    assert second["tag"] == tag
    for facts in result.returns:
        # Only a rank started by exec (spawn) shows the tag in its own /proc environ;
        # a forked rank's variables are set after the fork, which /proc never shows.
        assert facts["own_environ"] is (method == "spawn"), facts
        # Every program a rank starts inherits the tag in its environment...
        assert facts["child_environ"] is True, facts
        # ...and takes the program's name; the rank and what it forks carry the tag.
        assert facts["child_name"] == "cat", facts
        assert facts["own_name"] == tag, facts
        assert facts["forked_child_name"] == tag, facts
