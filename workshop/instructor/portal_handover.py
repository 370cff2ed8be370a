"""The end of a class (``portal stop``), and what it hands to the next one: nothing.

``userdel`` frees a learner's uid and the next ``useradd`` hands it on, so a file
still owned by it would become the next user's. Before the users go, everything
they own is found by uid and group (a file in ``/tmp`` need not carry its owner's
name), in the portal's folder and every place open to all users (:data:`SHARED`,
world-writable mounts), and removed or archived to ``DIR/NAME/`` as root's; their
System V IPC objects, which outlive their processes, are removed too::

    python -m workshop portal stop                        # removes it all
    python -m workshop portal stop --keep-homes /root/class-2025-03   # archives it
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import grp
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .._procs import is_alive
from ..checks import why_not_writable
from ..cluster import slurm_watchdog
from ..cluster.slurm_here import LOCAL_SLURM
from ..cluster.slurm_watchdog import _quiet
from .portal_classroom import Hub, HubError
from .portal_learners import PortalError, _end, _pid, processes_of
from .portal_status import BOARD, board_pids, hub_pid

# Where a learner's processes may write outside their home on Linux (the FHS and
# systemd's places): temporary folders, POSIX shared memory and message queues, lock
# files, /run/user/UID, and the spools setgid programs write as the user.
SHARED = tuple(
    Path(place)
    for place in (
        "/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock", "/run/user",
        "/dev/mqueue", "/var/mail", "/var/spool/mail", "/var/spool/cron",
        "/var/crash",
    )
)  # fmt: skip
# System V IPC kinds (/proc/sysvipc) and their id column; libc removes them
# (IPC_RMID, 0 in Linux's ipc.h).
IPC_KINDS = {"shm": "shmid", "msg": "msqid", "sem": "semid"}
_IPC_RMID = 0


def _rmid(kind: str, number: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    if kind == "shm":
        return libc.shmctl(number, _IPC_RMID, None) == 0
    if kind == "msg":
        return libc.msgctl(number, _IPC_RMID, None) == 0
    return libc.semctl(number, 0, _IPC_RMID) == 0


def shared_places(shared: tuple[Path, ...] = SHARED) -> tuple[Path, ...]:
    """The folders of ``shared`` that exist, each once (links resolved), and the
    mount points every user may write (a whole-disk walk would take minutes)."""
    places: dict[Path, None] = {}
    mounted = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[2] not in ("proc", "sysfs", "cgroup"):
                mounted.append(Path(fields[1].replace("\\040", " ")))
    for place in [*shared, *mounted]:
        try:
            real = place.resolve(strict=True)
            open_to_all = real.stat().st_mode & 0o002
        except OSError:
            continue
        if real.is_dir() and (place in shared or open_to_all):
            places.setdefault(real)
    return tuple(places)


@dataclass
class HandedOver:
    """What :func:`hand_over` did: the files and folders removed or archived (each
    counted once), each learner's archive, the System V IPC objects removed."""

    removed: int = 0
    archived: dict[str, Path] = field(default_factory=dict)
    ipc_removed: int = 0


def ipc_objects(
    uids: dict[int, str], gids: dict[int, str]
) -> list[tuple[str, int, str]]:
    """Every System V IPC object that one of ``uids`` owns or created, or whose
    group is one of ``gids``: (kind, id, the owner's name)."""
    found = []
    for kind, id_column in IPC_KINDS.items():
        try:
            lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        except OSError:  # no System V IPC in this kernel
            continue
        header = lines[0].split() if lines else []
        for line in lines[1:]:
            row = dict(zip(header, line.split(), strict=False))
            owners = [uids.get(int(row[c])) for c in ("uid", "cuid") if c in row]
            owners += [gids.get(int(row[c])) for c in ("gid", "cgid") if c in row]
            owner = next((name for name in owners if name), None)
            if owner is not None:
                found.append((kind, int(row[id_column]), owner))
    return found


def remove_ipc(objects: list[tuple[str, int, str]]) -> int:
    """Remove each of ``objects`` (:func:`ipc_objects`), as ``ipcrm`` does; how many
    went."""
    return sum(_rmid(kind, number) for kind, number, _ in objects)


def owners(names: list[str], homes: Path) -> dict[str, tuple[int, int | None]]:
    """The uid of each of ``names`` whose home is in ``homes`` (a namesake living
    elsewhere is not the portal's), and the gid of their own group, or None."""
    found: dict[str, tuple[int, int | None]] = {}
    for name in names:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        if Path(entry.pw_dir).parent != homes:
            continue
        try:
            own = grp.getgrgid(entry.pw_gid).gr_name == name
        except KeyError:
            own = False
        found[name] = (entry.pw_uid, entry.pw_gid if own else None)
    return found


def owned_files(
    uids: dict[int, str],
    gids: dict[int, str],
    tops: list[Path],
    skip: set[Path] = frozenset(),  # type: ignore[assignment]
) -> list[tuple[Path, str]]:
    """Every topmost file or folder under ``tops`` owned by one of ``uids`` (or
    group one of ``gids``), with its owner's name; each top on its own file system,
    links not followed, ``skip`` left out."""
    found: list[tuple[Path, str]] = []
    skip = set(skip) | set(tops)
    for top in tops:
        try:
            device = top.lstat().st_dev
        except OSError:
            continue
        pending = [top]
        while pending:
            folder = pending.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:  # gone meanwhile (other users' files come and go)
                continue
            for entry in entries:
                path = Path(entry.path)
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                owner = uids.get(info.st_uid) or gids.get(info.st_gid)
                if owner is not None:
                    found.append((path, owner))
                elif (
                    stat.S_ISDIR(info.st_mode)
                    and info.st_dev == device
                    and path not in skip
                ):
                    pending.append(path)
    return found


def _remove(path: Path) -> None:
    # rmtree works through folder descriptors and never follows a link, so a learner's
    # link planted in their folder cannot turn root's removal elsewhere.
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _archive_place(path: Path, name: str, archive: Path, portal: Path) -> Path:
    """Where ``path`` goes in ``archive``: ``home``, ``portal/...``, or its own
    absolute path (``tmp/torchinductor_NAME``)."""
    if path == portal / "home" / name:
        return archive / "home"
    if path.is_relative_to(portal):
        return archive / "portal" / path.relative_to(portal)
    return archive / path.relative_to("/")


def _special(folder: str, names: list[str]) -> list[str]:
    """The sockets, pipes and devices among ``names`` (a pipe's copy would hang)."""
    keep = (stat.S_ISDIR, stat.S_ISREG, stat.S_ISLNK)
    left_out = []
    for name in names:
        with contextlib.suppress(OSError):
            mode = os.lstat(os.path.join(folder, name)).st_mode
            if not any(test(mode) for test in keep):
                left_out.append(name)
    return left_out


def _move(path: Path, target: Path) -> None:
    """Rename ``path`` to ``target``, or across file systems copy (links as links,
    no sockets or pipes) and remove."""
    try:
        os.rename(path, target)
        return
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
    mode = path.lstat().st_mode
    if stat.S_ISDIR(mode):
        shutil.copytree(path, target, symlinks=True, ignore=_special)
    elif stat.S_ISLNK(mode):
        os.symlink(os.readlink(path), target)
    elif stat.S_ISREG(mode):
        shutil.copy2(path, target)
    _remove(path)


def _free_folder(base: Path) -> Path:
    """``base``, or ``base-2``, ``base-3``... where an earlier class used it."""
    candidate, number = base, 1
    while candidate.exists():
        number += 1
        candidate = base.with_name(f"{base.name}-{number}")
    return candidate


def _give_to_root(folder: Path) -> None:
    """Make everything in ``folder`` root's (``lchown``: links not followed); this
    also clears set-user-ID bits."""
    os.lchown(folder, 0, 0)
    for parent, dirs, files in os.walk(folder):
        for item in dirs + files:
            os.lchown(os.path.join(parent, item), 0, 0)


def hand_over(
    names: list[str],
    portal: Path,
    keep: Path | None = None,
    scratch: tuple[Path, ...] | None = None,
) -> HandedOver:
    """Remove every file the portal's users ``names`` own, or move it to
    ``keep/NAME/`` owned by root, and their System V IPC objects. Run it after
    their processes ended and before ``userdel`` (owners are found by uid).

    Args:
        names: the portal's users; only those whose home is in ``portal/home``.
        portal: the portal's folder.
        keep: the archive folder (made, mode 0700, where missing), or None.
        scratch: shared folders searched besides ``portal`` (:func:`shared_places`).

    Returns:
        A :class:`HandedOver`.

    Raises:
        OSError: a file could not be moved into ``keep`` (what was moved stays).

    Example:
        >>> done = hand_over(["learner01"], Path(".portal"), Path("/root/class"))
        >>> done.archived                                  # doctest: +SKIP
        {'learner01': PosixPath('/root/class/learner01')}
    """
    found = owners(names, portal / "home")
    uids = {uid: name for name, (uid, _) in found.items()}
    gids = {gid: name for name, (_, gid) in found.items() if gid is not None}
    return sweep(uids, gids, portal, keep, scratch)


def sweep(
    uids: dict[int, str],
    gids: dict[int, str],
    portal: Path,
    keep: Path | None = None,
    scratch: tuple[Path, ...] | None = None,
) -> HandedOver:
    """:func:`hand_over` for owners given by number: ``uids`` and ``gids`` map to
    the name each archive is filed under.

    Example:
        >>> sweep({1234: "learner01"}, {}, Path(".portal"))   # doctest: +SKIP
        HandedOver(removed=3, archived={}, ipc_removed=1)
    """
    done = HandedOver()
    if not uids and not gids:  # nobody's: nothing to look for
        return done
    scratch = shared_places() if scratch is None else scratch
    skip = {keep.resolve()} if keep is not None else set()
    files = owned_files(uids, gids, [portal, *scratch], skip)
    # In the kernel, not in a file: nothing to archive, only to remove.
    done.ipc_removed = remove_ipc(ipc_objects(uids, gids))
    if keep is None:
        for path, _ in files:
            _remove(path)
        done.removed = len(files)
        return done
    keep.mkdir(mode=0o700, parents=True, exist_ok=True)
    for path, name in files:
        if name not in done.archived:
            done.archived[name] = _free_folder(keep / name)
            done.archived[name].mkdir(mode=0o700)
        target = _archive_place(path, name, done.archived[name], portal)
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _move(path, target)
    for archive in done.archived.values():
        _give_to_root(archive)
    done.removed = len(files)
    return done


# ------------------------------------------------------------------ the end of a class
@dataclass
class Stopped:
    """What ``stop`` did; ``jobs_left`` and ``killed`` are empty after a clean
    stop."""

    jobs_left: list[str]
    killed: list[tuple[int, str, str]]
    users_removed: list[str]
    servers_stopped: list[str] = field(default_factory=list)
    files: HandedOver = field(default_factory=HandedOver)
    problems: list[str] = field(default_factory=list)


def stop(
    folder: str | os.PathLike[str],
    keep_homes: str | os.PathLike[str] | None = None,
) -> Stopped:
    """End the class in ``folder``: its servers (through the hub), the hub and
    proxy, the jobs left and the cluster it started, every learner process; then
    the learners' files (:func:`hand_over`, or archived to ``keep_homes``), the
    users ``start`` made, the secrets, the hub's database (its tokens would pass
    to the next class's namesakes) and the class board's state. What is not there
    is skipped.

    Args:
        folder: the portal's folder.
        keep_homes: where to archive the learners' files (``KEEP/NAME/home``...).

    Returns:
        A :class:`Stopped` saying what was stopped and what had to be forced.

    Raises:
        ValueError: ``keep_homes`` cannot hold the archive (see
            :func:`check_archive`); nothing was stopped.
        PortalError: a file could not be archived; the users are kept.

    Example:
        >>> stop(".portal", keep_homes="/root/class-2025-03").servers_stopped
        ... # doctest: +SKIP
        ['learner01', 'learner02']
    """
    folder = Path(folder).resolve()
    keep = None if keep_homes is None else check_archive(keep_homes, folder)
    found = folder / "portal.json"
    settings = json.loads(found.read_text()) if found.exists() else {}
    conf = Path(settings.get("slurm_conf", folder / "slurm" / "slurm.conf"))
    users = {"made": [], "names": []}
    if (folder / "users.json").exists():
        users = json.loads((folder / "users.json").read_text())
    stopped = Stopped([], [], [])
    # The servers first, through the hub: it cancels each job (batchspawner's
    # scancel) and forgets the server. The hub itself leaves them running when it
    # stops (portal_hub.configure), so that a restart keeps the class.
    if hub_pid(folder) is not None:
        stopped.servers_stopped, stopped.problems = _stop_servers(Hub.of(folder))
    end_hub(folder)
    _end(_pid(folder / "run" / "proxy.pid"), 5)
    # The hub stops its board as it stops; one it left (a killed hub's, for the
    # second it takes to notice) would write its state again after it went.
    for pid in board_pids(folder):
        _end(pid, 5)
    env = dict(os.environ, SLURM_CONF=str(conf))
    if not settings.get("own_cluster", True):
        # A cluster the portal did not start (start's slurm_conf): it keeps
        # running; only the jobs of the portal's users are cancelled.
        if users["names"]:
            stopped.jobs_left = slurm_watchdog.cancel_jobs(env, users["names"])
    else:
        if (folder / "slurm" / "run" / "slurmctld.pid").exists():
            stopped.jobs_left = _jobs_not_ending(env, stopped.servers_stopped)
        slurm_watchdog.stop_cluster(folder / "slurm", LOCAL_SLURM)
    stopped.killed = _kill_all_of(users["names"])
    # Before userdel: the learners' files are found by their uids.
    try:
        stopped.files = hand_over(users["names"], folder, keep)
    except OSError as error:
        # The users stay, and with them their uids: nothing of theirs can go to
        # another user; stop runs again once the archive's place is sorted out.
        raise PortalError(
            f"archiving the learners' files into {keep} failed: {error}; the users "
            "and the rest of their files are kept. HINT: free space there, or give "
            "another --keep-homes, and run stop again"
        ) from error
    for name in users["made"]:
        done = subprocess.run(["userdel", name], capture_output=True)
        if done.returncode == 0:
            stopped.users_removed.append(name)
    for name in ("portal.json", "users.json", "run/hub.pid", "run/proxy.pid"):
        (folder / name).unlink(missing_ok=True)
    (folder / "hub.sqlite").unlink(missing_ok=True)
    # The board's state: each learner's exercises, hands and errors.
    shutil.rmtree(folder / BOARD, ignore_errors=True)
    if (folder / "secrets").is_dir():
        for secret in (folder / "secrets").iterdir():
            secret.unlink()
    return stopped


def check_archive(
    keep_homes: str | os.PathLike[str], folder: str | os.PathLike[str]
) -> Path:
    """``keep_homes`` made absolute, where it can hold the learners' archive:
    writable, and outside the homes (a home cannot move into itself).

    Raises:
        ValueError: it cannot, naming the path and what is in the way.
    """
    keep = Path(keep_homes).resolve()
    homes = Path(folder).resolve() / "home"
    why = why_not_writable(keep, folder=True)
    if why is None and keep.is_relative_to(homes):
        why = f"it is inside the learners' homes ({homes}), which move into it"
    if why:
        raise ValueError(
            f"--keep-homes {keep_homes}: {why}. Give a folder outside the portal's "
            "homes that root can write, or a path to make one at, e.g. "
            "--keep-homes /root/class-archive"
        )
    return keep


def _jobs_not_ending(
    env: dict[str, str], stopped: list[str], within: float = 180
) -> list[str]:
    """The jobs still queued once those ending have ended: a cancelled server's
    job (``jupyter-NAME``) may stay COMPLETING or RUNNING for over 60 s on a loaded
    machine, so it is waited for rather than counted as left behind."""
    listing = ["squeue", "-h", "-o", "%A %t %j"]
    ending = {f"jupyter-{name}" for name in stopped}
    deadline = time.monotonic() + within
    while True:
        jobs = [line.split() for line in _quiet(listing, env, 15).splitlines()]
        jobs = [job for job in jobs if len(job) == 3]
        if time.monotonic() > deadline or not any(
            state == "CG" or name in ending for _, state, name in jobs
        ):
            return [job_id for job_id, _, _ in jobs]
        time.sleep(0.3)


def _stop_servers(hub: Hub) -> tuple[list[str], list[str]]:
    """Stop every server the hub has, at once; whose stopped, and the problems."""
    try:
        names = sorted(hub.active())
    except (HubError, OSError) as error:
        return [], [f"the hub did not list its servers: {error}"]
    if not names:
        return [], []

    def one(name: str) -> str | None:
        try:
            hub.stop_server(name)
        except (HubError, OSError) as error:
            return f"{name}: {error}"
        return None

    with ThreadPoolExecutor(len(names)) as pool:
        problems = list(pool.map(one, names))
    stopped = [
        name for name, problem in zip(names, problems, strict=True) if problem is None
    ]
    return stopped, [problem for problem in problems if problem]


def end_hub(folder: Path, grace: float = 60) -> None:
    """SIGTERM the hub and wait until it removes its pid file (its database is
    written by then), then SIGKILL the interpreter's slow wind-down."""
    pid = hub_pid(folder)
    if pid is None:
        return
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and (folder / "run" / "hub.pid").exists():
        if not is_alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5  # its ports are free once it is gone
    while is_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _kill_all_of(names: list[str]) -> list[tuple[int, str, str]]:
    """SIGKILL every process of ``names`` and wait (10 s at most): ``userdel``
    refuses a user who still runs something."""
    killed = processes_of(names)
    for pid, _, _ in killed:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while killed and processes_of(names) and time.monotonic() < deadline:
        time.sleep(0.1)
    return killed
