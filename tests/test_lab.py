"""The README's first command: `make lab` sets up and serves the notebooks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request

import pytest
from conftest import ROOT, free_port


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_lab_serves_the_notebooks_on_loopback(tmp_path):
    port, token = free_port(), "workshop-test"
    log = open(tmp_path / "lab.log", "w")  # noqa: SIM115 - closed in finally
    lab = subprocess.Popen(
        [
            "make",
            "lab",
            f"LAB_ARGS=--no-browser --port={port} "
            f"--ServerApp.token={token} --ServerApp.port_retries=0",
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime")),
    )
    try:
        url = f"http://127.0.0.1:{port}/api/contents?token={token}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    listing = json.load(response)
                break
            except OSError:
                if lab.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        "JupyterLab did not answer:\n"
                        + (tmp_path / "lab.log").read_text()
                    ) from None
                time.sleep(0.5)
        names = {item["name"] for item in listing["content"]}
        assert "02_distributed_data_parallel.ipynb" in names  # served from notebooks/
        # It listens on loopback only: the machine's other addresses get no answer.
        listening = (
            subprocess.run(
                ["ss", "-ltn"], capture_output=True, text=True, check=False
            ).stdout
            if shutil.which("ss")
            else ""
        )
        for line in listening.splitlines():
            if line.split()[3:4] and line.split()[3].endswith(f":{port}"):
                assert line.split()[3].startswith(("127.0.0.1:", "[::1]:")), line
    finally:
        _stop_group(lab)
        log.close()


def _stop_group(popen: subprocess.Popen) -> None:
    """TERM the process group ``popen`` leads, 20 s of grace, then KILL; a group
    already gone (make ended early, its JupyterLab never started) is no error."""
    for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(popen.pid, sig)
        except ProcessLookupError:  # no process of the group is left
            break
        try:
            popen.wait(grace)
            break
        except subprocess.TimeoutExpired:
            continue
    popen.wait(10)
