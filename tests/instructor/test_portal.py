"""workshop.instructor.portal: a private JupyterHub whose learners' servers are Slurm
jobs on the private two-node cluster, driven through the hub's REST API and a kernel
client (tests/browser/test_portal_browser.py drives it from a browser).

One portal for the module, with 6 learners: the classroom run, then the checks of
what it leaves. It needs root, Slurm and the proxy (make setup installs them); it
skips with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import clean_env, needs_private_slurm, open_to_all

# The portal's packages (pip install -e ".[portal]": jupyterhub, batchspawner), which
# a GPU node's wheelhouse rightly leaves out: there these tests skip, saying so.
pytest.importorskip(
    "batchspawner",
    reason='the portal extra is not installed (pip install -e ".[portal]")',
)

from workshop.instructor import portal, portal_learners
from workshop.instructor.portal_classroom import Hub, Kernel, classroom
from workshop.instructor.portal_hub import BATCH_SCRIPT
from workshop.instructor.portal_learners import hash_password

LEARNERS = 6


def _proxy_missing() -> str | None:
    try:
        portal.proxy_command()
    except portal.PortalError as error:
        return str(error)
    return None


needs_proxy = pytest.mark.skipif(
    _proxy_missing() is not None, reason=str(_proxy_missing())
)


@pytest.fixture(scope="module")
def running(private_slurm):
    """A portal on the run's private cluster (it stops the portal's jobs, not the
    cluster: start's slurm_conf)."""
    folder = Path(tempfile.mkdtemp(prefix="wp-", dir="/tmp"))
    with open_to_all(private_slurm) as conf:
        try:
            started = portal.start(
                folder, learners=LEARNERS, prefix="pupil", slurm_conf=conf
            )
        except portal.PortalError as error:
            if str(error).startswith("the private portal cannot start here"):
                pytest.skip(str(error))  # no root, no Slurm, or a private clone
            pytest.fail(f"the portal did not start: {error}")
        yield started
        portal.stop(folder)


def _listening(pids: set[int]) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every TCP socket listening in one of ``pids``."""
    inodes = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes[link[8:-1]] = pid
        except OSError:
            continue
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            raw, port = fields[1].split(":")
            packed = bytes.fromhex(raw)
            if family == socket.AF_INET:
                address = socket.inet_ntop(family, packed[::-1])
            else:  # four little-endian words
                words = [packed[i : i + 4][::-1] for i in range(0, 16, 4)]
                address = socket.inet_ntop(family, b"".join(words))
            found.append((address, int(port, 16), inodes[fields[9]]))
    return found


def _portal_pids(started: portal.Portal) -> set[int]:
    """The hub and all it started (the proxy), the cluster's daemons (those of its
    own cluster, or of the one start's slurm_conf named) and every process of a
    learner."""
    from workshop.cluster.reaper import descendants

    hub = int((started.folder / "run" / "hub.pid").read_text().split()[0])
    pids = {hub, *descendants(hub)}
    pids |= {
        p for p, _, _ in portal.processes_of([*started.learners, started.instructor])
    }
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        # slurmctld, slurmd: -f FOLDER/slurm.conf, munged: --socket=FOLDER/run/...
        if str(started.folder) in command or str(started.slurm_conf.parent) in command:
            pids.add(int(entry.name))
    return pids


# ---- no portal needed -------------------------------------------------------------


def test_a_password_is_kept_only_as_a_salted_hash():
    salt = bytes(16)
    stored = hash_password("tiger-17", salt)
    assert stored == hash_password("tiger-17", salt)
    assert stored != hash_password("tiger-18", salt)
    assert stored != hash_password("tiger-17", bytes([1]) * 16)
    assert "tiger" not in stored and len(stored) == 128


def test_the_job_script_runs_the_server_in_a_step_on_the_nodes_address():
    assert "#SBATCH --export={{keepvars}}" in BATCH_SCRIPT
    assert "{{srun}} {{cmd}}" in BATCH_SCRIPT  # a job step, as on a site's portal
    rewrite = next(line for line in BATCH_SCRIPT.splitlines() if "sed -E" in line)
    script = (
        "SLURMD_NODENAME=127.0.0.3\n"
        "JUPYTERHUB_SERVICE_URL=http://127.0.0.1:0/user/pupil01/\n"
        'JUPYTERHUB_SERVICE_URL="$(printf %s "$JUPYTERHUB_SERVICE_URL" |\n'
        f"{rewrite}\n"
        'echo "$JUPYTERHUB_SERVICE_URL"\n'
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert done.stdout.strip() == "http://127.0.0.3:0/user/pupil01/", done.stderr


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"learners": 0}, r"learners=0: give a whole number from 1 to 99"),
        ({"learners": 100}, r"learners=100"),
        ({"learners": True}, r"learners=True"),
        ({"prefix": "Learner"}, r"prefix='Learner': give lower-case letters only"),
        ({"prefix": "l-1"}, r"prefix='l-1'"),
    ],
)
def test_bad_arguments_are_refused_with_the_value(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        portal.start(tmp_path, **kwargs)


def test_a_folder_too_long_for_slurms_sockets_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    folder = tmp_path / ("x" * 70)
    with pytest.raises(portal.PortalError, match=r"characters; Slurm's job sockets"):
        portal.start(folder, learners=1)


def test_without_root_it_says_why_and_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(
        portal.PortalError, match=r"it needs root .*HINT: run it as root"
    ):
        portal.start(tmp_path / "p", learners=1)


def test_an_environment_other_users_cannot_enter_is_refused_before_anything_starts(
    monkeypatch, request
):
    # Under /tmp itself: pytest's own tmp_path sits in a folder of mode 0700.
    tmp_path = Path(tempfile.mkdtemp(prefix="wp-closed-", dir="/tmp"))
    tmp_path.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(tmp_path))
    closed = tmp_path / "clone"
    (closed / ".venv").mkdir(parents=True)
    closed.chmod(0o700)
    readable = tmp_path / "open"
    readable.mkdir(mode=0o755)
    readable.chmod(0o755)
    monkeypatch.setattr(
        portal_learners, "_environment_folders", lambda: [closed / ".venv", readable]
    )
    before = {user.pw_name for user in pwd.getpwall()}
    with pytest.raises(portal.PortalError) as caught:
        portal.start(tmp_path / "p", learners=1, prefix="closed")
    message = str(caught.value)
    assert message.startswith("the private portal cannot start here")
    assert f"{closed} (mode 0700) cannot be entered by other users" in message
    assert f"chmod o+rx {closed}" in message
    assert str(readable) + " (" not in message
    assert {user.pw_name for user in pwd.getpwall()} == before  # nobody was made
    assert not (tmp_path / "p").exists()


def test_status_and_stop_of_a_folder_without_a_portal(tmp_path):
    assert "no portal in" in portal.status(tmp_path)
    stopped = portal.stop(tmp_path)
    assert (stopped.jobs_left, stopped.killed, stopped.users_removed) == ([], [], [])


def test_the_stop_hint_works_from_a_fresh_shell_in_any_folder(tmp_path):
    # What start prints as "stop it: ...": a shell elsewhere, with none of this
    # process's environment, runs it as it is.
    folder = tmp_path / "no portal here"
    folder.mkdir()
    done = subprocess.run(
        ["bash", "-c", portal.stop_command(folder)], cwd="/", env=clean_env(),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"portal in {folder} stopped: 0 jobs")
    assert "Traceback" not in done.stderr


# ---- a running portal -------------------------------------------------------------


@needs_private_slurm
@needs_proxy
def test_the_portal_answers_on_loopback_only_and_keeps_its_secrets_private(running):
    with socket.create_connection(
        ("127.0.0.1", int(running.url.rsplit(":", 1)[1][:-1]))
    ):
        pass
    listening = _listening(_portal_pids(running))
    settings = json.loads((running.folder / "portal.json").read_text())
    ports = {port for _, port, _ in listening}
    # The proxy (for browsers, and its API), the hub: all found, and on loopback.
    assert {settings[k] for k in ("port", "proxy_api_port", "hub_port")} <= ports
    outside = [(a, p) for a, p, _ in listening if not a.startswith("127.")]
    assert outside == []
    for name in (
        "learners.json",
        "passwords.txt",
        "cookie_secret",
        "proxy_token",
        "api_token",
    ):
        mode = stat.S_IMODE((running.folder / "secrets" / name).stat().st_mode)
        assert mode == 0o600, (name, oct(mode))
    assert stat.S_IMODE((running.folder / "secrets").stat().st_mode) == 0o700
    # The hub's database and log name the learners: the owner's only.
    for private in ("hub.sqlite", "log/hub.log"):
        mode = stat.S_IMODE((running.folder / private).stat().st_mode)
        assert mode == 0o600, (private, oct(mode))
    # The hub's config holds no secret; no command line names one.
    secrets = [
        (running.folder / "secrets" / n).read_text().strip()
        for n in ("proxy_token", "api_token", "cookie_secret")
    ]
    secrets += list(running.passwords.values())
    config = (running.folder / "jupyterhub_config.py").read_text()
    config += (running.folder / "portal.json").read_text()
    for pid in _portal_pids(running):
        try:
            config += Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            pass
    assert not [s for s in secrets if s in config]


@needs_private_slurm
@needs_proxy
def test_a_wrong_password_is_refused_and_the_right_one_logs_in(running):
    import urllib.error
    import urllib.parse
    import urllib.request

    name = running.learners[0]

    def log_in(password):
        cookies = urllib.request.HTTPCookieProcessor()
        opener = urllib.request.build_opener(cookies)
        opener.open(running.url + "hub/login", timeout=30).read()  # the _xsrf cookie
        xsrf = next(c.value for c in cookies.cookiejar if c.name == "_xsrf")
        body = urllib.parse.urlencode(
            {"username": name, "password": password, "_xsrf": xsrf}
        ).encode()
        try:
            answer = opener.open(running.url + "hub/login?next=", body, timeout=60)
            return answer.status, answer.geturl()
        except urllib.error.HTTPError as error:
            return error.code, error.geturl()

    assert log_in("not-" + running.passwords[name])[0] == 403
    status, where = log_in(running.passwords[name])
    assert status == 200 and "/hub/login" not in where, where


@needs_private_slurm
@needs_proxy
def test_a_learners_server_is_a_slurm_job_and_runs_a_launch(running):
    hub, name = Hub.of(running.folder), running.learners[0]
    seconds = hub.start_server(name)
    env = dict(os.environ, SLURM_CONF=str(running.slurm_conf))
    queue = subprocess.run(
        ["squeue", "-h", "-u", name, "-o", "%u %T %N %j"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    user, state, node, job_name = queue.stdout.split()
    assert (user, state, job_name) == (name, "RUNNING", f"jupyter-{name}")
    assert node in ("127.0.0.2", "127.0.0.3")
    # JupyterLab itself answers, not only the server's REST API.
    code, _ = hub.call("GET", f"user/{name}/lab")
    assert code == 200

    import asyncio

    async def cells():
        async with Kernel(hub, name) as kernel:
            inside = await kernel.run(
                "import os, torch.distributed as dist, workshop\n"
                "print(os.environ['SLURM_JOB_ID'], os.environ['SLURMD_NODENAME'])"
            )
            launched = await kernel.run(
                "r = workshop.launch(lambda: dist.get_rank(), world_size=2, "
                "show='none')\nprint('ranks returned', r.returns)"
            )
            return inside, launched

    inside, launched = asyncio.run(cells())
    assert inside.error is None and node in inside.text
    assert launched.error is None, launched.error
    assert "ranks returned [0, 1]" in launched.text
    print(
        f"server of {name} ready in {seconds:.1f} s; "
        f"launch cell {launched.seconds:.2f} s"
    )
    hub.stop_server(name)


@needs_private_slurm
@needs_proxy
def test_a_classroom_at_once_leaves_nothing_behind(running):
    result = classroom(running.folder)
    print(result.summary())
    assert result.failures == []
    assert len(result.learners) == LEARNERS
    assert result.launches == LEARNERS * 3
    assert " 0 reachable " in result.isolation
    assert "0 processes and 0 jobs left" in result.scancel
    # The hub stopped; the portal's jobs ended (the cluster, the run's, is stopped
    # at the end of the run); nothing of any learner is left.
    made = json.loads((running.folder / "users.json").read_text())["made"]
    stopped = portal.stop(running.folder)
    assert (stopped.jobs_left, stopped.killed) == ([], [])
    assert portal.processes_of(running.learners) == []
    assert not (running.folder / "portal.json").exists()
    assert stopped.users_removed == made  # the users it made, and only those
