"""The slow tests of test_concurrent_launches.py (they start ranks, subprocesses or
jobs): make test runs them, make test-fast leaves them out: a tiny real run."""

from __future__ import annotations

import json

import pytest

from workshop.bench import __main__ as bench

TINY = ["--kernels", "2", "--launches", "4", "--world-size", "2"]


def _table(out: str) -> dict[str, list[int]]:
    """The rows of the printed table: job -> [launches, failed]."""
    rows, table = {}, out.split("\njob ", 1)[1].split("\n\n", 1)[0]
    for line in table.splitlines()[1:]:
        words = line.split()
        rows[" ".join(words[:-4])] = [int(w) for w in words[-4:-2]]
    return rows


@pytest.fixture
def quick_kernels(monkeypatch):
    # The kernels inherit this: the jobs need nothing that preload imports, and
    # skipping it saves each kernel seconds of CPU on a busy machine.
    monkeypatch.setenv("WORKSHOP_PRELOAD", "0")


def test_a_tiny_run_counts_what_ran(tmp_path, capsys, quick_kernels):
    path = tmp_path / "concurrent.json"
    assert bench.main(["concurrent", *TINY, "--json", str(path)]) == 0
    out = capsys.readouterr().out
    want = {"no collective": [2, 0], "collectives": [2, 0], "all": [4, 0]}
    assert _table(out) == want
    assert "2 kernels at once, 4 launches of 2 ranks each" in out
    assert "goal, 0 failures and nothing on stderr: 0 failures, 0 lines: met" in out
    report = json.loads(path.read_text())
    rows = {r["job"]: [r["launches"], r["failed"]] for r in report["rows"]}
    assert rows == want
    round_ = report["round"]
    assert round_["kernels"] == 2 and round_["world_size"] == 2
    assert round_["start_method"] == "auto"
    records = round_["records"]
    assert len(records) == 4
    assert all(r["error"] is None for r in records)
    assert (
        sorted(r["job"] for r in records) == ["collectives"] * 2 + ["no collective"] * 2
    )
    assert round_["failures"] == {} and round_["stderr_lines"] == []
    assert round_["wall_seconds"] > 0
    assert set(round_["load"]) == {"before", "max", "after"}
