"""Nothing the workshop starts listens beyond this machine.

On a shared login node a socket bound to 0.0.0.0 (or ::) is reachable by everyone
who can reach the node. So while each of these runs, the sockets its processes
listen on are listed and must all be bound to a loopback address (127.0.0.0/8, ::1):

- a ``workshop.launch`` of two gloo ranks: the launching process (the rendezvous
  store) and the ranks (gloo's sockets);
- the private Slurm cluster of ``scripts/local_slurm.sh`` running a job with an
  ``srun`` step: slurmctld, slurmd, munged and the job's processes (slurmstepd, the
  batch script, srun, the task);
- ``make lab``'s JupyterLab server.

The sockets are read from the kernel's tables (/proc/net/tcp, tcp6, udp, udp6) and
mapped to their processes through /proc/PID/fd; no external tool. A first test
opens a listener on 0.0.0.0 and checks that the helper reports it, so the others
cannot pass by seeing nothing."""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import (
    clean_env,
    gone,
    needs_private_slurm,
    needs_slurm,
)

from workshop.cluster import slurm_watchdog
from workshop.cluster.reaper import descendants
from workshop.cluster.slurm_here import LOCAL_SLURM, slurm_cluster

_TCP_LISTEN = "0A"  # the kernel's TCP_LISTEN, as /proc/net/tcp writes it
_TABLES = ("tcp", "tcp6", "udp", "udp6")


# --- the helper: listening sockets and the processes that hold them ------------------


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket, or a bound UDP socket that is not connected (it
    takes datagrams from anyone), as the kernel's table lists it."""

    table: str  # "tcp", "tcp6", "udp" or "udp6": the file in /proc/net
    address: str
    port: int
    inode: int

    @property
    def loopback(self) -> bool:
        """True when only this machine can reach it: 127.0.0.0/8 or ::1 (also as an
        IPv4-mapped ::ffff:127.x.y.z)."""
        ip = ipaddress.ip_address(self.address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip.is_loopback

    def __str__(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.table} {host}:{self.port}"


def _decode(field: str) -> tuple[str, int]:
    """``0100007F:1F90`` -> ("127.0.0.1", 8080). The kernel writes the address as
    32-bit words in the machine's byte order, the port as a plain number."""
    hex_address, hex_port = field.split(":")
    words = [hex_address[i : i + 8] for i in range(0, len(hex_address), 8)]
    raw = b"".join(struct.pack("=I", int(word, 16)) for word in words)
    return str(ipaddress.ip_address(raw)), int(hex_port, 16)


def listeners() -> list[Listener]:
    """Every listening TCP socket and unconnected bound UDP socket of this network
    namespace (TCP and UDP, IPv4 and IPv6)."""
    found = []
    for table in _TABLES:
        try:
            lines = Path("/proc/net", table).read_text().splitlines()[1:]
        except FileNotFoundError:  # no IPv6 in this kernel
            continue
        for line in lines:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            if table.startswith("tcp") and state != _TCP_LISTEN:
                continue
            if table.startswith("udp") and _decode(remote)[1] != 0:
                continue  # a connected UDP socket takes datagrams from its peer only
            address, port = _decode(local)
            found.append(Listener(table, address, port, int(inode)))
    return found


def socket_owners() -> dict[int, set[int]]:
    """Socket inode -> the processes holding a descriptor of it."""
    owners: dict[int, set[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:  # ended meanwhile, or not ours to read
            continue
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:  # closed meanwhile (the listing's own, in this process)
                continue
            if link.startswith("socket:["):
                owners.setdefault(int(link[8:-1]), set()).add(int(entry.name))
    return owners


def listeners_of(pids: set[int]) -> list[tuple[Listener, int]]:
    """The listeners held by any of ``pids``, each with the first such process."""
    owners = socket_owners()
    held = []
    for listener in listeners():
        mine = sorted(owners.get(listener.inode, set()) & pids)
        if mine:
            held.append((listener, mine[0]))
    return held


def command_line(pid: int) -> str:
    """The command line of ``pid``, words joined by spaces; "" once it has ended."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    return b" ".join(w for w in words if w).decode(errors="replace")


def process(pid: int) -> str:
    """``PID (command line)``, for messages."""
    return f"{pid} ({command_line(pid)[:120] or 'ended'})"


def exposed(held: list[tuple[Listener, int]]) -> list[str]:
    """A line for each listener of ``held`` that is not on loopback."""
    return [
        f"{listener} is bound to {listener.address}, not loopback; held by "
        f"{process(pid)}"
        for listener, pid in held
        if not listener.loopback
    ]


def assert_loopback_only(pids: set[int], what: str) -> list[tuple[Listener, int]]:
    """Fail, naming each socket, address and process, if any of ``pids`` listens
    beyond loopback; return what they listen on."""
    held = listeners_of(pids)
    bad = exposed(held)
    assert not bad, f"{what} listens beyond this machine:\n" + "\n".join(bad)
    return held


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def wait_until(condition, what: str, within: float = 120.0) -> None:
    """Poll ``condition`` until it is true; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {within:g} s"
        time.sleep(0.1)


def stop_group(popen: subprocess.Popen, grace: float = 20.0) -> None:
    """TERM the process group ``popen`` leads, a grace period, then KILL."""
    if popen.poll() is None:
        os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(10)


# --- the helper sees what it must see ------------------------------------------------


def _ipv6() -> bool:
    return socket.has_ipv6 and Path("/proc/net/tcp6").exists()


def test_the_helper_reports_listeners_beyond_loopback_with_their_process():
    me = {os.getpid()}
    opened = []
    try:
        for family, kind, address in [
            (socket.AF_INET, socket.SOCK_STREAM, "0.0.0.0"),
            (socket.AF_INET, socket.SOCK_DGRAM, "0.0.0.0"),
            (socket.AF_INET, socket.SOCK_STREAM, "127.0.0.1"),
            *([(socket.AF_INET6, socket.SOCK_STREAM, "::")] if _ipv6() else []),
            *([(socket.AF_INET6, socket.SOCK_STREAM, "::1")] if _ipv6() else []),
        ]:
            s = socket.socket(family, kind)
            opened.append(s)
            if family == socket.AF_INET6:  # "::" alone, not IPv4 too
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((address, 0))
            if kind == socket.SOCK_STREAM:
                s.listen()
        held = {(str(lst), lst.loopback, pid) for lst, pid in listeners_of(me)}
        port = [s.getsockname()[1] for s in opened]
        assert (f"tcp 0.0.0.0:{port[0]}", False, os.getpid()) in held
        assert (f"udp 0.0.0.0:{port[1]}", False, os.getpid()) in held
        assert (f"tcp 127.0.0.1:{port[2]}", True, os.getpid()) in held
        if _ipv6():
            assert (f"tcp6 [::]:{port[3]}", False, os.getpid()) in held
            assert (f"tcp6 [::1]:{port[4]}", True, os.getpid()) in held
        with pytest.raises(AssertionError) as failed:
            assert_loopback_only(me, "this test")
        message = str(failed.value)
        assert f"tcp 0.0.0.0:{port[0]} is bound to 0.0.0.0, not loopback; held by " in (
            message
        )
        assert f"held by {process(os.getpid())}" in message
        assert f"127.0.0.1:{port[2]}" not in message
    finally:
        for s in opened:
            s.close()
    # Closed: no longer listed, so a later look at this process starts clean.
    assert not {lst.port for lst, _ in listeners_of(me)} & set(port)


def test_addresses_are_decoded_as_the_kernel_writes_them():
    little = sys.byteorder == "little"
    assert _decode("0100007F:1F90" if little else "7F000001:1F90") == (
        "127.0.0.1",
        8080,
    )
    assert _decode("00000000:0016") == ("0.0.0.0", 22)
    one = "00000000000000000000000001000000" if little else "0" * 31 + "1"
    assert _decode(f"{one}:0050") == ("::1", 80)
    mapped = Listener("tcp6", "::ffff:127.0.0.1", 1, 0)
    assert mapped.loopback and not Listener("tcp6", "::ffff:10.0.0.1", 1, 0).loopback
    assert Listener("tcp", "127.0.1.1", 1, 0).loopback


# --- (a) workshop.launch --------------------------------------------------------------

KERNEL = """\
    import os, sys, time
    from pathlib import Path
    import workshop

    def look_at_me(folder):
        import torch.distributed as dist
        here = Path(folder)
        # The group is up (gloo connected, the store served): say so, and stay up
        # until the test has looked.
        (here / f"ready-{dist.get_rank()}").write_text(str(os.getpid()))
        deadline = time.monotonic() + 240
        while not (here / "seen").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return dist.get_rank()

    result = workshop.launch(look_at_me, sys.argv[1], world_size=2, backend="gloo",
                             show="none", timeout=300)
    print("returns", result.returns, flush=True)
"""


def test_a_launch_listens_on_loopback_only(tmp_path):
    (tmp_path / "kernel.py").write_text(textwrap.dedent(KERNEL))
    kernel = subprocess.Popen(
        [sys.executable, str(tmp_path / "kernel.py"), str(tmp_path)],
        env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        ready = [tmp_path / f"ready-{rank}" for rank in (0, 1)]
        wait_until(
            lambda: (
                all(p.exists() and p.read_text() for p in ready)
                or kernel.poll() is not None
            ),
            "both ranks' groups up",
            within=240,
        )
        assert kernel.poll() is None, kernel.stdout.read()
        ranks = {int(p.read_text()) for p in ready}
        pids = {kernel.pid, *descendants(kernel.pid)}
        assert ranks <= pids
        held = assert_loopback_only(pids, "workshop.launch")
        # The launching process serves the rendezvous store; each rank listens for
        # its gloo peers. Both must have been seen for this to mean anything.
        assert kernel.pid in {pid for _, pid in held}, held
        assert ranks <= {pid for _, pid in held}, held
        (tmp_path / "seen").touch()
        assert kernel.wait(120) == 0
        assert kernel.stdout.read().splitlines()[-1] == "returns [0, 1]"
        assert gone(pids - {kernel.pid}, within=20) == []
    finally:
        (tmp_path / "seen").touch()
        stop_group(kernel)
        kernel.stdout.close()


# --- (b) the private Slurm cluster ---------------------------------------------------


def _conf(folder: Path) -> dict[str, str]:
    pairs = {}
    for line in (folder / "slurm.conf").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            pairs[key] = value
    return pairs


@needs_private_slurm
def test_the_private_slurm_cluster_and_its_job_steps_listen_on_loopback_only(
    tmp_path,
):
    # The notebook's way: slurm_cluster() starts it (local_slurm.sh start, then a
    # reconfigure), and stop() ends it with its jobs. A cluster of its own, not the
    # run's (conftest's private_slurm): the test stops it, and then checks that
    # every daemon, job process and the watchdog are gone.
    marker = f"listening-{uuid.uuid4().hex}"
    before = os.environ.pop("SLURM_CONF", None)
    cluster = slurm_cluster()
    daemons: dict[str, int] = {}
    jobs: set[int] = set()
    try:
        if "not a loopback address" in cluster.reason:  # this machine's host name
            pytest.skip(cluster.reason)
        assert cluster.available, cluster.reason
        if cluster.kind != "private":
            pytest.skip(f"a Slurm answers here already ({cluster}); this test looks "
                        "only at a private cluster of its own")  # fmt: skip
        folder = cluster.folder
        # slurmctld, munged and a slurmd for each node (run/slurmd-NODE.pid)
        daemons = {
            path.stem: int(path.read_text()) for path in (folder / "run").glob("*.pid")
        }
        script = tmp_path / "sleeper.sbatch"
        # The task waits until the test has looked (5 minutes at most).
        script.write_text(
            "#!/bin/bash\n"
            f"srun bash -c 'for _ in $(seq 1500); do [ -e {tmp_path}/seen ] && break; "
            f"sleep 0.2; done; echo {marker}'\n"
        )
        submitted = subprocess.run(
            ["sbatch", "--ntasks=1", f"--output={tmp_path}/%j.out", str(script)],
            env=clean_env(SLURM_CONF=os.environ["SLURM_CONF"]),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr

        def task_runs() -> bool:
            # The task's bash, started by the step's slurmstepd (not the batch
            # script's srun, whose command line holds the marker too).
            return any(
                marker in command_line(pid) and comm(pid) == "bash"
                for pid in slurm_watchdog.job_processes(folder)
            )

        wait_until(task_runs, "the job's srun task running")
        jobs = set(slurm_watchdog.job_processes(folder))
        held = assert_loopback_only(
            {*daemons.values(), *jobs}, "the private Slurm cluster"
        )
        ports = {(lst.port, pid) for lst, pid in held}
        conf = _conf(folder)
        assert (int(conf["SlurmctldPort"]), daemons["slurmctld"]) in ports, held
        # Each node's slurmd on its own port (NodeName=NAME ... Port=PORT ...).
        nodes = re.findall(
            r"^NodeName=(\S+) .*\bPort=(\d+)", (folder / "slurm.conf").read_text(), re.M
        )
        assert len(nodes) == 2, nodes
        for node, port in nodes:
            assert (int(port), daemons[f"slurmd-{node}"]) in ports, held
        sruns = {pid for pid in jobs if comm(pid) == "srun"}
        assert sruns & {pid for _, pid in held}, (
            f"no srun listens: {held}; job: {[process(pid) for pid in jobs]}"
        )
    finally:
        (tmp_path / "seen").touch()
        cluster.stop()
        if before is not None:
            os.environ["SLURM_CONF"] = before
    # Stopped with all it ran: daemons, the job's processes, the watchdog.
    assert gone([*daemons.values(), *jobs], within=20) == []
    assert cluster._watchdog.poll() is not None, "the watchdog still runs"


# A stand-in `hostname` that gives a documentation address (RFC 5737): Slurm binds to
# what the host name resolves to (NoInAddrAny), and a numeric name resolves to
# itself without DNS.
_ELSEWHERE = "192.0.2.7"
_NAME = re.escape(_ELSEWHERE)
_REFUSED = (
    rf"local_slurm\.sh: this machine's host name {_NAME} resolves to "
    rf"({_NAME}|no address \(.*\)), not a loopback address; the private "
    r"cluster would listen there, where other machines can reach it. Map the name "
    rf"to loopback \(a line '127\.0\.1\.1 {_NAME}' in /etc/hosts, as Debian does\)"
    r", or submit to a real cluster's Slurm"
)


def _elsewhere_env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "hostname").write_text(f"#!/bin/sh\necho {_ELSEWHERE}\n")
    (bin_dir / "hostname").chmod(0o755)
    return clean_env(
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", TMPDIR=str(tmp_path)
    )


@needs_slurm
def test_local_slurm_refuses_a_host_name_that_is_not_on_loopback(tmp_path):
    folder = tmp_path / "cluster"
    done = subprocess.run(["bash", str(LOCAL_SLURM), "start", str(folder)],
                          env=_elsewhere_env(tmp_path), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1
    assert re.fullmatch(_REFUSED, done.stderr.strip()), done.stderr
    assert list(folder.iterdir()) == []  # nothing was written, nothing started


@needs_slurm
def test_slurm_cluster_says_why_no_private_cluster_started(tmp_path):
    code = (
        "from workshop.cluster.slurm_here import slurm_cluster\n"
        "c = slurm_cluster()\n"
        "print(c.available, c.kind)\n"
        "print(c.reason)\n"
    )
    env = _elsewhere_env(tmp_path)
    env.pop("SLURM_CONF", None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    said, reason = done.stdout.splitlines()
    if said == "True cluster":
        pytest.skip("a Slurm answers here already")
    assert said == "False none"
    assert re.fullmatch("could not start a private Slurm cluster: " + _REFUSED, reason)
    # The temporary folder it made for the cluster is gone: nothing was in it.
    assert [p.name for p in tmp_path.iterdir()] == ["bin"]


# --- (c) make lab ---------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_lab_listens_on_loopback_only(make_lab):
    # The run's one `make lab` (tests/conftest.py, which
    # tests/test_lab_integration.py uses too): it answers, and is stopped at the end
    # of the run, where none of its processes may be left.
    assert make_lab.popen.poll() is None, make_lab.log()
    assert "started" in make_lab.get("/api/status")
    pids = {make_lab.popen.pid, *descendants(make_lab.popen.pid)}
    held = assert_loopback_only(pids, "make lab's JupyterLab")
    assert make_lab.port in {lst.port for lst, _ in held}, held
