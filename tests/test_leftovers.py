"""tests/leftovers.py: what a run left in the temporary folders, found by comparing
their entries at the start and at the end. Folders under tmp_path stand in for
/tmp and /var/tmp."""

from __future__ import annotations

import os
import shutil

from leftovers import left_behind, summary, temp_entries


def test_only_new_entries_of_this_user_are_left_and_pytest_s_own_are_not(tmp_path):
    tmp, var_tmp = tmp_path / "tmp", tmp_path / "var-tmp"
    tmp.mkdir()
    var_tmp.mkdir()
    (tmp / "there-before").mkdir()
    (tmp / "made-and-removed").mkdir()
    before = temp_entries([str(tmp), str(var_tmp)])
    assert before == {
        str(tmp): {"there-before", "made-and-removed"},
        str(var_tmp): set(),
    }

    shutil.rmtree(tmp / "made-and-removed")
    (tmp / "torchelastic_abc").mkdir()
    (tmp / "pytest-of-someone").mkdir()  # pytest's basetemp: kept on purpose
    (var_tmp / "tmp1234.json").write_text("{}")
    after = temp_entries([str(tmp), str(var_tmp)])

    assert left_behind(before, after) == [
        str(tmp / "torchelastic_abc"),
        str(var_tmp / "tmp1234.json"),
    ]
    # Someone else's new entry is not the run's.
    assert left_behind(before, after, uid=os.getuid() + 1) == []
    # An entry gone by the time it is looked at was not left.
    shutil.rmtree(tmp / "torchelastic_abc")
    assert left_behind(before, after) == [str(var_tmp / "tmp1234.json")]


def test_a_folder_that_cannot_be_read_is_left_out_not_an_error(tmp_path):
    missing = tmp_path / "no-such-folder"
    readable = tmp_path / "tmp"
    readable.mkdir()
    before = temp_entries([str(missing), str(readable)])
    assert before == {str(readable): set()}
    (readable / "new").touch()
    # Compared only where both lists exist (a folder readable at the end alone).
    after = {**temp_entries([str(readable)]), str(missing): {"x"}}
    assert left_behind(before, after) == [str(readable / "new")]


def test_the_summary_counts_and_cuts_a_long_list():
    assert summary([]) == [
        "workshop: the run left nothing new in /tmp, /var/tmp, /dev/shm"
    ]
    lines = summary([f"/tmp/torchelastic_{i}" for i in range(25)], shown=20)
    assert lines[0] == "workshop: the run left 25 entries in the temporary folders:"
    assert lines[1:3] == ["    /tmp/torchelastic_0", "    /tmp/torchelastic_1"]
    assert lines[-1] == "    ... and 5 more"
    assert len(lines) == 22
