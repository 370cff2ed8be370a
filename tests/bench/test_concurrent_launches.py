"""``python -m workshop.bench concurrent``: kernels that launch at the same moment.

A tiny run (2 kernel processes x 2 launches of 2 ranks) must count what ran, in the
printed table and in the JSON alike, with no failure and nothing on stderr; and every
bad option is one line, before any kernel starts.
"""

from __future__ import annotations

import pytest

from workshop.bench import __main__ as bench

# (command line after "concurrent", the error line after "PROG: error: ")
REFUSED = [
    ("--kernels 0", "argument --kernels: 0 is not a whole number, 1 or more; e.g. "
     "--kernels 6"),
    ("--launches x", "argument --launches: x is not a whole number, 1 or more; e.g. "
     "--launches 200"),
    ("--world-size 1", "argument --world-size: 1 is not a whole number, 2 or more "
     "(ranks that connect need 2); e.g. --world-size 4"),
    ("--timeout 0", "argument --timeout: 0 is not a number above 0; e.g. "
     "--timeout 120"),
]  # fmt: skip

# Values each option allows but that do not go together: one line, exit code 2.
CLASHES = [
    ("--kernels 6 --launches 3", "--launches 3 is fewer than --kernels 6: each "
     "kernel makes one launch at least; pass --launches 6 or more"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "message"), REFUSED)
def test_a_bad_option_is_one_line(line, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["concurrent", *line.split()])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"python -m workshop.bench concurrent: error: {message}"
    )


def test_an_unknown_start_method_is_one_line(capsys):
    with pytest.raises(SystemExit):
        bench.main(["concurrent", "--start-method", "forkserver"])
    # argparse words the list of choices its own way in each Python release.
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith(
            "python -m workshop.bench concurrent: error: argument --start-method: "
            "invalid choice: 'forkserver' (choose from "
        )
    )


@pytest.mark.parametrize(("line", "message"), CLASHES)
def test_options_that_do_not_go_together_are_one_line(line, message, capsys):
    assert bench.main(["concurrent", *line.split()]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before any kernel started
    assert captured.err == f"python -m workshop.bench concurrent: error: {message}\n"


def test_more_ranks_at_once_than_the_machine_takes_is_refused(capsys):
    assert bench.main(["concurrent", "--kernels", "1000", "--launches", "1000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "python -m workshop.bench concurrent: error: --kernels 1000 x --world-size "
        "4 = 4000 ranks at once is more than this machine can run ("
    )
    assert err.endswith("; pass fewer kernels or a smaller --world-size\n")


def test_a_json_path_that_cannot_be_written_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["concurrent", "--json", str(tmp_path / "missing" / "c.json")])
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("does not exist; make it first; e.g. --json concurrent.json")
    )
