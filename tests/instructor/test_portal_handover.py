"""workshop.instructor.portal_handover: what a class leaves is found by its owner's
uid, not by name, and removed or archived as root's, on folders made here (the
portal's own stop is tested in test_portal.py). Changing a file's owner needs root;
elsewhere these tests skip."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import wait_exec

from workshop.cluster import slurm_watchdog
from workshop.instructor.portal_handover import (
    check_archive,
    ipc_objects,
    remove_ipc,
    shared_places,
    stop,
    sweep,
)

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="giving files to another uid needs root"
)
# A uid and gid no user or group of this machine has (a learner who has left).
UID = GID = 3_999_917


def _left_by_a_learner(portal: Path, scratch: Path) -> dict[str, Path]:
    """A home, a stack-dump folder, a file of theirs inside root's folder, a link
    to a file of root's, and a pipe, all owned by UID; and a file of someone else."""
    home = portal / "home" / "pupil01"
    (home / "notebooks").mkdir(parents=True)
    (home / "notebooks" / "02.ipynb").write_text("{}")
    stacks = scratch / "workshop-stacks-k3f"  # no learner's name in it
    stacks.mkdir()
    (stacks / "rank0.txt").write_text("stack")
    os.mkfifo(stacks / "pipe")
    roots = scratch / "roots" / "inner"
    roots.mkdir(parents=True)
    (roots / "cache.bin").write_bytes(b"x")
    link = scratch / "a-link"
    link.symlink_to("/etc/hostname")
    other = scratch / "someone-elses.txt"
    other.write_text("not theirs")
    owned = [home, home / "notebooks", home / "notebooks" / "02.ipynb", stacks]
    owned += [stacks / "rank0.txt", stacks / "pipe", roots / "cache.bin", link]
    for path in owned:
        os.lchown(path, UID, -1)
    # Root's file, of the learner's own group: userdel frees the group too.
    grouped = scratch / "grouped.txt"
    grouped.write_text("group")
    os.chown(grouped, 0, GID)
    return {
        "home": home, "stacks": stacks, "cache": roots / "cache.bin", "link": link,
        "other": other, "roots": roots, "grouped": grouped,
    }  # fmt: skip


@needs_root
def test_a_learners_files_are_found_by_uid_and_removed(tmp_path):
    # The portal's folder inside the shared one, as a test's is in /tmp: its
    # files are found once.
    scratch = tmp_path / "tmp"
    portal = scratch / "wp-portal"
    scratch.mkdir()
    left = _left_by_a_learner(portal, scratch)
    done = sweep({UID: "pupil01"}, {GID: "pupil01"}, portal, None, (scratch,))
    for gone in ("home", "stacks", "cache", "grouped"):
        assert not left[gone].exists(), gone
    assert not left["link"].is_symlink()  # the link went, not what it named
    assert Path("/etc/hostname").exists()
    assert left["other"].exists() and left["roots"].is_dir()
    assert done.removed == 5 and done.archived == {}


@needs_root
def test_with_keep_homes_they_are_archived_as_roots_across_file_systems(tmp_path):
    # /dev/shm is a file system of its own (tmpfs): the archive in tmp_path is
    # reached by a copy there, and by a rename from the portal's folder.
    portal = tmp_path / "portal"
    shm = Path(tempfile.mkdtemp(prefix="wp-handover-", dir="/dev/shm"))
    try:
        left = _left_by_a_learner(portal, shm)
        archive = tmp_path / "archive"
        done = sweep({UID: "pupil01"}, {GID: "pupil01"}, portal, archive, (shm,))
        kept = archive / "pupil01"
        assert done.archived == {"pupil01": kept} and done.removed == 5
        assert stat.S_IMODE(kept.stat().st_mode) == 0o700
        notebook = kept / "home" / "notebooks" / "02.ipynb"
        assert notebook.read_text() == "{}"
        stacks = kept / shm.relative_to("/") / "workshop-stacks-k3f"
        assert (stacks / "rank0.txt").read_text() == "stack"
        assert not (stacks / "pipe").exists()  # a pipe holds nothing to keep
        assert (kept / shm.relative_to("/") / "a-link").is_symlink()
        for gone in ("home", "stacks", "cache", "link", "grouped"):
            assert not os.path.lexists(left[gone]), gone
        owners = {
            (p.lstat().st_uid, p.lstat().st_gid) for p in [kept, *kept.rglob("*")]
        }
        assert owners == {(0, 0)}
        # A second class's pupil01 is filed beside the first, not over it.
        _left_by_a_learner(portal, Path(tempfile.mkdtemp(dir=shm)))
        again = sweep({UID: "pupil01"}, {}, portal, archive, (shm,))
        assert again.archived == {"pupil01": archive / "pupil01-2"}
    finally:
        shutil.rmtree(shm)


def test_every_place_open_to_all_is_searched_once():
    places = shared_places()
    assert len(set(places)) == len(places)
    for place in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock"):
        if Path(place).is_dir():
            assert Path(place).resolve() in places, place
    # Besides the listed places, only file systems mounted open to every user.
    assert all(place.stat().st_mode & 0o002 for place in shared_places(()))


@needs_root
def test_a_learners_lock_file_and_ipc_objects_are_removed(tmp_path):
    # What the outside test found left to the next class's learner of the same
    # uid: a file in /run/lock, a shared memory segment and a message queue (and
    # here a semaphore set), all made as that uid, as a learner's program would.
    if not Path("/run/lock").is_dir() or not Path("/proc/sysvipc").is_dir():
        pytest.skip("this machine has no /run/lock, or no System V IPC")
    if shutil.which("ipcmk") is None:
        pytest.skip("ipcmk (util-linux) is not installed")
    as_learner = {"user": UID, "group": GID, "extra_groups": [], "cwd": "/"}
    lock = Path("/run/lock") / f"wp-handover-{os.getpid()}.lock"
    try:
        subprocess.run(["touch", str(lock)], check=True, **as_learner)
        for kind in (["-M", "4096"], ["-Q"], ["-S", "1"]):
            subprocess.run(["ipcmk", *kind], check=True, capture_output=True,
                           **as_learner)  # fmt: skip
        assert lock.stat().st_uid == UID
        made = ipc_objects({UID: "pupil01"}, {})
        assert sorted(kind for kind, _, _ in made) == ["msg", "sem", "shm"]
        # /run/lock alone (the default places are listed by the test above; /tmp
        # may hold a busy machine's hundreds of thousands of files).
        place = (Path("/run/lock").resolve(),)
        done = sweep(
            {UID: "pupil01"}, {GID: "pupil01"}, tmp_path / "portal", None, place
        )
        assert not lock.exists()
        assert done.ipc_removed == 3 and done.removed >= 1
        assert ipc_objects({UID: "pupil01"}, {GID: "pupil01"}) == []
    finally:
        lock.unlink(missing_ok=True)
        remove_ipc(ipc_objects({UID: "pupil01"}, {}))


def test_an_archive_that_cannot_be_written_is_refused(tmp_path, monkeypatch):
    portal = tmp_path / "portal"
    (portal / "home").mkdir(parents=True)
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(ValueError, match=r"--keep-homes .*a-file: it is a file"):
        check_archive(a_file, portal)
    with pytest.raises(ValueError, match=r"a-file is a file, not a folder"):
        check_archive(a_file / "archive", portal)
    with pytest.raises(ValueError, match=r"inside the learners' homes"):
        check_archive(portal / "home" / "pupil01" / "keep", portal)
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(ValueError, match=r"cannot be written .*e\.g\. --keep-homes"):
        check_archive(tmp_path / "new", portal)
    monkeypatch.undo()
    assert check_archive(tmp_path / "new", portal) == tmp_path / "new"


def test_stop_ends_the_board_and_removes_its_state(tmp_path, monkeypatch):
    # A portal folder as a hub killed a moment ago leaves it: its board's state,
    # and its board still running (it ends itself within a second; stop does not
    # wait for that). Another portal's board runs on.
    folder, other = tmp_path / "portal", tmp_path / "other"
    (folder / "board").mkdir(parents=True, mode=0o700)
    (folder / "board" / "board.json").write_text('{"learners": {}}')
    monkeypatch.setattr(slurm_watchdog, "stop_cluster", lambda folder, script: [])
    sleeping = "import time; time.sleep(60)"
    boards = [
        subprocess.Popen([sys.executable, "-c", sleeping, "-m",
                          "workshop.instructor.board", "--state", str(f / "board")])
        for f in (folder, other)
    ]  # fmt: skip
    try:
        wait_exec([board.pid for board in boards], "workshop.instructor.board")
        stop(folder)
        assert boards[0].wait(timeout=10) == -signal.SIGTERM
        assert boards[1].poll() is None
        assert not (folder / "board").exists()
    finally:
        for board in boards:
            board.kill()
            board.wait()
