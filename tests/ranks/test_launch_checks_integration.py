"""Launch checks that start processes (make test-fast leaves them out)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT, repo_env

pytestmark = pytest.mark.usefixtures("no_leftover_children")


def _run(code: str) -> str:
    """What a fresh Python process running ``code`` prints."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=repo_env(),
        cwd=ROOT,
        timeout=120,
    ).stdout


def test_a_launch_in_a_process_that_is_a_rank_already_is_refused():
    # A script started by torchrun that calls launch: its group is up already.
    code = textwrap.dedent(
        """
        import torch.distributed as dist, workshop
        store = dist.HashStore()
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            workshop.launch(dist.get_rank, world_size=2, backend="gloo")
        except RuntimeError as exc:
            print(exc)
        finally:
            dist.destroy_process_group()
        """
    )
    out = _run(code)
    assert (
        "launch() was called in a process whose default process group is already "
        "initialised (rank 0 of 1, started by torchrun, srun or mpirun, say)" in out
    )


def test_a_low_open_file_limit_is_named_before_anything_starts():
    # A real limit, as `ulimit -n 64` sets it on a login node.
    code = textwrap.dedent(
        """
        import resource, torch.distributed as dist, workshop
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        try:
            workshop.launch(dist.get_rank, world_size=30, backend="gloo")
        except ValueError as exc:
            print(exc)
        """
    )
    out = _run(code)
    assert "world_size=30 is more ranks than this machine can run" in out
    assert "an open-file limit of 64 (ulimit -n; 3 per rank in this process" in out
    assert "launch: world_size" not in out  # nothing was started
