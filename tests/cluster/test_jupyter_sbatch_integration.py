"""The slow tests of test_jupyter_sbatch.py (they start ranks, subprocesses or jobs):
make test runs them, make test-fast leaves them out: the script run for real, and as a
job of the private cluster."""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, needs_private_slurm
from test_jupyter_sbatch import BASH, READY, SCRIPT, _bin, _environment

from workshop.cluster import slurm_watchdog
from workshop.cluster.slurm import submit

# The two lines a learner copies, as the script prints them.
TUNNEL = re.compile(
    r"^   ssh -N -L (?P<local>\d+):127\.0\.0\.1:(?P<port>\d+) "
    r"-J (?P<user>[^@\s]+)@(?P<login>\S+) (?P=user)@(?P<node>\S+)$",
    re.M,
)


ADDRESS = re.compile(
    r"^   http://127\.0\.0\.1:(?P<local>\d+)/lab\?token=(?P<token>\S*)$", re.M
)


# No proxy: the server is on this machine's loopback.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _user() -> str:
    return os.environ.get("USER") or pwd.getpwuid(os.getuid()).pw_name


def _get(url: str) -> tuple[int, bytes]:
    """(HTTP status, body) of a GET; an error status is returned, not raised."""
    try:
        with _HTTP.open(url, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _listening(port: int) -> set[str]:
    """The addresses on which some socket listens on TCP ``port`` (IPv4 and IPv6),
    read from /proc/net/tcp*, so that the server's own word is not needed."""
    found = set()
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address)  # each 32-bit word in host (little) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add(socket.inet_ntop(family, raw))
    return found


def _in_any_command_line(text: str) -> list[int]:
    """PIDs whose command line (what `ps` shows) holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and text.encode() in (entry / "cmdline").read_bytes()
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _until(condition, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"{what} after {within} s"
        time.sleep(0.3)


def _until_ready(read, finished, within: float = 180) -> str:
    """The output once the script says the server is ready; fails, with the output,
    when the script ends first or after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        text = read()
        if READY in text:
            return text
        assert not finished(), f"the script ended before the server was ready:\n{text}"
        assert time.monotonic() < deadline, f"not ready after {within} s:\n{text}"
        time.sleep(0.3)


def _check_server(text: str, runtime: Path, login: str) -> int:
    """Everything a learner relies on, checked against the running server; returns
    the server's PID (from its runtime file)."""
    tunnel, address = TUNNEL.search(text), ADDRESS.search(text)
    assert tunnel and address, text
    port, token = int(tunnel["port"]), address["token"]
    assert re.fullmatch(r"[0-9a-f]{48}", token), token  # 24 random bytes, never ""
    # The tunnel ends on the node the server runs on, as the user who runs it, and
    # the browser's port is the tunnel's.
    assert tunnel["node"] == socket.gethostname()
    assert (tunnel["user"], tunnel["login"]) == (_user(), login)
    assert tunnel["local"] == address["local"] == "8888"
    assert f"{READY}{socket.gethostname()}, port {port}, bound to 127.0.0.1" in text
    # The server's own record agrees, and it listens on loopback only.
    (info,) = [json.loads(p.read_text()) for p in runtime.glob("jpserver-*.json")]
    assert (info["port"], info["token"]) == (port, token)
    assert _listening(port) == {"127.0.0.1"}
    # Through the printed address (the tunnel maps port 8888 to the server's port):
    # with the token the lab and the API answer; without it, or with another, no.
    lab = address[0].strip().replace(f":{address['local']}/", f":{port}/")
    status, body = _get(lab)
    assert status == 200 and b"<title>JupyterLab</title>" in body, (status, body[:300])
    status, body = _get(f"http://127.0.0.1:{port}/api/status?token={token}")
    assert status == 200 and "started" in json.loads(body), (status, body)
    assert _get(f"http://127.0.0.1:{port}/api/status")[0] == 403
    assert _get(f"http://127.0.0.1:{port}/api/status?token={'0' * 48}")[0] == 403
    # The token is on no command line: `ps` does not show it to other users.
    assert _in_any_command_line(token) == []
    assert _alive(info["pid"])
    return info["pid"]


def _check_stopped(pid: int, runtime: Path, text: str) -> None:
    """The server ended cleanly: gone, its runtime files removed (a KILL would
    leave them), and the script said so."""
    _until(lambda: not _alive(pid), 30, f"JupyterLab (PID {pid}) still runs")
    assert sorted(p.name for p in runtime.iterdir()) == ["jupyter_cookie_secret"]
    assert f"stopping JupyterLab (PID {pid})" in text
    assert "JupyterLab stopped" in text


@pytest.mark.parametrize("found", ["command", "module"])
def test_a_term_to_the_script_stops_the_server(tmp_path, found):
    runtime, output = tmp_path / "runtime", tmp_path / "jupyter.out"
    output.write_text("")
    output.chmod(0o644)  # as a umask of 022 makes it
    env = {**_environment(), "JUPYTER_RUNTIME_DIR": str(runtime),
           "LOGIN_HOST": "login.example.org"}  # fmt: skip
    if found == "module":
        # As after pip install --target: JupyterLab importable by python3, but no
        # jupyter-lab command on PATH.
        python3 = _bin(tmp_path / "bin", {"python3": f'exec {sys.executable} "$@"'})
        env |= {"WORKSHOP_VENV": "none", "PATH": f"{python3}:/usr/bin:/bin"}
    with open(output, "w") as out:
        script = subprocess.Popen(
            [BASH, str(SCRIPT)], env=clean_env(**env), cwd=ROOT, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        text = _until_ready(output.read_text, lambda: script.poll() is not None)
        assert output.stat().st_mode & 0o777 == 0o600  # made private before the token
        pid = _check_server(text, runtime, login="login.example.org")
        assert "job none (jupyter) on " in text  # no Slurm: it says so, and works
        if found == "module":
            assert "JupyterLab: python3 -m jupyterlab (" in text, text
        script.send_signal(signal.SIGTERM)  # the script alone, not the server
        assert script.wait(60) == 143
        _check_stopped(pid, runtime, output.read_text())
    finally:  # the script's whole session: should its trap fail, the server too
        try:
            os.killpg(script.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # all gone, as it should be
        script.wait(10)


@pytest.fixture(scope="module")
def cluster(private_slurm):
    """The private cluster slurm_cluster() started here: the run's one (conftest)."""
    return private_slurm


@needs_private_slurm
def test_the_job_serves_jupyterlab_through_the_printed_tunnel(
    cluster, tmp_path, monkeypatch
):
    runtime, out = tmp_path / "runtime", tmp_path / "out"
    for name, value in {**_environment(), "JUPYTER_RUNTIME_DIR": str(runtime)}.items():
        monkeypatch.setenv(name, value)  # sbatch passes its environment to the job
    job = submit(SCRIPT, gpus_per_node=0, options={"cpus-per-task": 1}, output_dir=out)
    try:
        text = _until_ready(
            lambda: job.output() if job.output_path.exists() else "",
            lambda: job.status().finished,
        )
        assert job.output_path.stat().st_mode & 0o777 == 0o600
        node = re.search(r"\(Slurm node (\S+)\)", text)[1]
        assert node in cluster.hosts, (node, cluster.hosts)  # one node or two
        pid = _check_server(text, runtime, login=socket.gethostname())
        assert f"Stop: File > Shut Down in JupyterLab, or scancel {job.job_id}." in text
    finally:
        job.cancel()
    _until(lambda: job.state() == "CANCELLED", 60, f"job {job.job_id} not CANCELLED")
    _until(
        lambda: slurm_watchdog.job_processes(cluster.folder) == [],
        30,
        "the job's processes still run",
    )
    _check_stopped(pid, runtime, job.output())
    assert list(out.iterdir()) == [job.output_path]  # the output file alone
