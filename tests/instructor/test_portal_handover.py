"""workshop.instructor.portal_handover: what a class leaves is found by its owner's
uid, not by name, and removed or archived as root's, on folders made here (the
portal's own stop is tested in test_portal.py). Changing a file's owner needs root;
elsewhere these tests skip."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from workshop.instructor.portal_handover import check_archive, sweep

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
