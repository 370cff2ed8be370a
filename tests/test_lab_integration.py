"""The README's first command: `make lab` sets up and serves the notebooks."""

from __future__ import annotations

import shutil
import subprocess
import urllib.parse
import urllib.request

import pytest


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_lab_serves_the_notebooks_on_loopback(make_lab):
    # The run's one `make lab` (tests/conftest.py), which
    # test_listening_integration.py looks at too; it is stopped at the end of the
    # run, with nothing of it left.
    assert make_lab.popen.poll() is None, make_lab.log()
    # The project is served, so that a notebook's link to ../docs/glossary.md opens,
    # and the page opens on notebooks/.
    listing = make_lab.get("/api/contents/notebooks")
    names = {item["name"] for item in listing["content"]}
    assert "02_distributed_data_parallel.ipynb" in names
    glossary = make_lab.get("/api/contents/docs/glossary.md")
    assert glossary["type"] == "file" and "## " in glossary["content"]
    with urllib.request.urlopen(f"{make_lab.url}/?token={make_lab.token}") as page:
        assert urllib.parse.urlsplit(page.geturl()).path == "/lab/tree/notebooks"
    # It listens on loopback only: the machine's other addresses get no answer.
    listening = (
        subprocess.run(
            ["ss", "-ltn"], capture_output=True, text=True, check=False
        ).stdout
        if shutil.which("ss")
        else ""
    )
    port = make_lab.port
    for line in listening.splitlines():
        if line.split()[3:4] and line.split()[3].endswith(f":{port}"):
            assert line.split()[3].startswith(("127.0.0.1:", "[::1]:")), line


def test_make_lab_asks_no_news_question_and_checks_no_update(make_lab):
    # JupyterLab's "Would you like to receive official Jupyter news?" would sit over
    # the bottom-right corner of every page on the projector: make lab gives its
    # settings scripts/lab-settings/overrides.json, which answers it (and the portal's
    # servers get the same: tests/instructor/test_portal_config.py).
    plugin = "@jupyterlab/apputils-extension:notification"
    answer = make_lab.get(f"/lab/api/settings/{plugin}")
    defaults = answer["schema"]["properties"]
    assert defaults["fetchNews"]["default"] == "false"
    assert defaults["checkForUpdates"]["default"] is False
