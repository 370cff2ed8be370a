"""The purge dry run lists exactly the files older than the limit (by modification or
access time) and deletes nothing; the quota commands run what exists."""

from __future__ import annotations

import os
import time

import pytest

from workshop.machine import storage
from workshop.machine.storage import (
    DAY,
    purge_dry_run,
    quota_commands,
    write_aged_files,
)

NOW = 1_800_000_000.0


def test_aged_files_get_the_ages_asked_for(tmp_path):
    written = write_aged_files(tmp_path, {"a/old.log": 90, "new.log": 0.5}, 10, NOW)
    assert [p.relative_to(tmp_path).as_posix() for p in written] == [
        "a/old.log",
        "new.log",
    ]
    assert written[0].stat().st_mtime == pytest.approx(NOW - 90 * DAY)
    assert written[0].stat().st_atime == pytest.approx(NOW - 90 * DAY)
    assert written[1].stat().st_size == 10


def test_the_dry_run_lists_the_old_files_oldest_first_and_deletes_nothing(tmp_path):
    ages = {"run-1/out.log": 90, "run-1/ckpt.pt": 61, "run-2/out.log": 59.9,
            "exactly.txt": 60, "fresh.txt": 0}  # fmt: skip
    write_aged_files(tmp_path, ages, now=NOW)
    found = purge_dry_run(tmp_path, days=60, now=NOW)
    assert [c.path.as_posix() for c in found] == ["run-1/out.log", "run-1/ckpt.pt"]
    assert found[0].age_days == pytest.approx(90)
    assert all(c.size == 1024 for c in found)
    assert all((tmp_path / name).exists() for name in ages)  # nothing deleted
    # A stricter policy finds more; 0 days finds every file older than now.
    assert len(purge_dry_run(tmp_path, days=30, now=NOW)) == 4
    assert len(purge_dry_run(tmp_path, days=0, now=NOW + 1)) == 5


def test_access_time_is_its_own_clock(tmp_path):
    (path,) = write_aged_files(tmp_path, {"read-lately.dat": 100}, now=NOW)
    os.utime(path, (NOW - DAY, NOW - 100 * DAY))  # read yesterday, written long ago
    assert [c.path.name for c in purge_dry_run(tmp_path, 60, NOW)] == [
        "read-lately.dat"
    ]
    assert purge_dry_run(tmp_path, 60, NOW, clock="atime") == []


def test_links_are_not_followed(tmp_path):
    (target,) = write_aged_files(tmp_path / "elsewhere", {"old": 100}, now=NOW)
    (tmp_path / "scratch").mkdir()
    (tmp_path / "scratch" / "link").symlink_to(target)
    assert purge_dry_run(tmp_path / "scratch", 60, NOW) == []


def test_the_default_now_is_the_clock(tmp_path):
    write_aged_files(tmp_path, {"old": 61, "new": 1})
    assert [c.path.name for c in purge_dry_run(tmp_path)] == ["old"]
    assert time.time() - (tmp_path / "new").stat().st_mtime == pytest.approx(
        DAY, abs=60
    )


def test_bad_input_is_explained(tmp_path):
    with pytest.raises(ValueError, match=r"days must be 0 or more days, got -1"):
        purge_dry_run(tmp_path, days=-1)
    with pytest.raises(ValueError, match=r"days must be a number of days, got '60'"):
        purge_dry_run(tmp_path, days="60")
    with pytest.raises(ValueError, match=r"clock='ctime': pass one of mtime, atime"):
        purge_dry_run(tmp_path, clock="ctime")
    with pytest.raises(ValueError, match=r"is not a folder; pass the folder a purge"):
        purge_dry_run(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"the age of 'x' must be 0 or more days"):
        write_aged_files(tmp_path, {"x": -2})
    with pytest.raises(ValueError, match=r"file name '../x' must stay inside"):
        write_aged_files(tmp_path, {"../x": 2})
    with pytest.raises(
        ValueError, match=r"size must be a whole number, 0 or more, not"
    ):
        write_aged_files(tmp_path, {"x": 2}, size=-1)
    with pytest.raises(ValueError, match=r"lines must be a whole number, 1 or more"):
        quota_commands(lines=0)
    with pytest.raises(
        ValueError, match=r"timeout_s must be a number of seconds above 0, not 0"
    ):
        quota_commands(timeout_s=0)


def test_quota_commands_run_what_exists_and_name_what_is_missing(monkeypatch, capsys):
    monkeypatch.setattr(
        storage, "QUOTA_COMMANDS", [("nosuchquota-cmd -s", "x"), ("echo {user}", "y")]
    )
    monkeypatch.setenv("USER", "learner")
    monkeypatch.setattr(storage.getpass, "getuser", lambda: "learner")
    ran = quota_commands(lines=2)
    out = capsys.readouterr().out
    assert ran == [("nosuchquota-cmd -s", False), ("echo learner", True)]
    assert "$ nosuchquota-cmd -s\n  not on this machine\n" in out
    assert "$ echo $USER\n  learner\n" in out


def test_a_file_given_as_the_folder_is_refused_before_anything_is_written(tmp_path):
    plain = tmp_path / "notes.txt"
    plain.write_text("not a folder")
    with pytest.raises(ValueError, match=r"notes.txt' is a file, not a folder"):
        write_aged_files(plain, {"old.log": 90})
    assert plain.read_text() == "not a folder"
