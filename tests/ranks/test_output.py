"""workshop.ranks.output.RankOutput: lines cut, kept and shown within bounds, with notes
of what was left out; UTF-8 and carriage returns across chunks; and one launch whose
ranks print more than is kept."""

from __future__ import annotations

import sys

import IPython.display
import pytest
import torch.distributed as dist

import workshop
from workshop.ranks import output
from workshop.ranks.output import MAX_LINE_CHARS, MAX_LINES, SHOWN_LINES, RankOutput

CHUNK = 1 << 16  # what the launcher reads from a rank's pipe at most


def quiet(world_size: int = 1, **limits: int) -> RankOutput:
    return RankOutput(world_size, "header", show="none", **limits)


def feed_in_chunks(out: RankOutput, data: bytes, rank: int = 0, size: int = CHUNK):
    for start in range(0, len(data), size):
        out.feed(rank, "stdout", data[start : start + size])


def cut_note(more: int) -> str:
    return f" [... {more:,} more characters of this line left out ...]"


# -- long lines


def test_a_long_line_keeps_its_first_characters_and_counts_the_rest():
    out = quiet(max_line_chars=10)
    out.feed(0, "stdout", b"0123456789abcdefghijklmno\nshort\n")
    assert out.text(0, "stdout") == "0123456789" + cut_note(15) + "\nshort\n"


def test_one_more_character_than_the_limit_is_counted_as_one():
    out = quiet(max_line_chars=10)
    out.feed(0, "stdout", b"x" * 11 + b"\n" + b"y" * 10 + b"\n")
    assert out.text(0, "stdout") == (
        "x" * 10
        + " [... 1 more character of this line left out ...]\n"
        + "y" * 10
        + "\n"
    )


def test_a_megabyte_line_in_chunks_holds_no_more_than_the_limit_while_it_grows():
    out = quiet()
    line = b"x" * 1_000_000
    for start in range(0, len(line), CHUNK):
        out.feed(0, "stdout", line[start : start + CHUNK])
        # What is held of the unfinished line never passes the limit: later chunks
        # are counted, not stored, joined or searched again.
        pieces, stored, cut = out._streams[(0, "stdout")].cur
        assert stored == sum(map(len, pieces)) <= MAX_LINE_CHARS
        assert stored + cut == min(start + CHUNK, len(line))
    expected = "x" * MAX_LINE_CHARS + cut_note(1_000_000 - MAX_LINE_CHARS)
    assert out.last_line(0) == expected
    out.feed(0, "stdout", b"\n")
    assert out.text(0, "stdout") == expected + "\n"


def test_last_line_of_a_huge_unfinished_line_is_cut_and_blank_ones_are_skipped():
    out = quiet()
    out.feed(0, "stderr", b"Traceback: the end\n")
    out.feed(0, "stdout", b"   ")  # blank: not what the rank last said
    assert out.last_line(0) == "Traceback: the end"
    feed_in_chunks(out, b"y" * 3_000_000)
    assert out.last_line(0) == "   " + "y" * (MAX_LINE_CHARS - 3) + cut_note(
        3_000_003 - MAX_LINE_CHARS
    )
    assert quiet().last_line(0) is None


# -- many lines


def test_the_last_lines_are_kept_under_a_count_of_the_dropped_ones():
    out = quiet(max_lines=3)
    out.feed(0, "stdout", b"0\n1\n2\n")
    assert out.text(0, "stdout") == "0\n1\n2\n"
    out.feed(0, "stdout", b"3\n")
    assert out.text(0, "stdout") == (
        "[... 1 earlier line dropped; the last 3 kept ...]\n1\n2\n3\n"
    )
    # More lines in one chunk than are kept: only the last ones are stored.
    out.feed(0, "stdout", "".join(f"{i}\n" for i in range(4, 20)).encode())
    assert out.text(0, "stdout") == (
        "[... 17 earlier lines dropped; the last 3 kept ...]\n17\n18\n19\n"
    )
    assert out.text(0, "stderr") == ""


def test_the_default_keeps_the_last_max_lines_of_each_rank_and_stream():
    out = quiet(world_size=2)
    total = MAX_LINES + 1_990
    feed_in_chunks(out, "".join(f"line {i}\n" for i in range(total)).encode())
    out.feed(1, "stdout", b"one\n")
    kept = out.text(0, "stdout").splitlines()
    assert (
        kept[0] == f"[... 1,990 earlier lines dropped; the last {MAX_LINES:,} kept ...]"
    )
    assert kept[1:] == [f"line {i}" for i in range(1_990, total)]
    assert out.text(1, "stdout") == "one\n"


def test_kept_characters_are_bounded_too_but_the_last_line_stays():
    out = quiet(max_kept_chars=10)
    out.feed(0, "stdout", b"aaaa\nbbbb\ncccc\n")
    assert out.text(0, "stdout") == (
        "[... 1 earlier line dropped; the last 2 kept ...]\nbbbb\ncccc\n"
    )
    out.feed(0, "stdout", b"d" * 30 + b"\n")
    assert out.text(0, "stdout") == (
        "[... 3 earlier lines dropped; the last 1 kept ...]\n" + "d" * 30 + "\n"
    )


@pytest.mark.parametrize("limit", ["max_lines", "max_line_chars", "max_kept_chars"])
def test_a_limit_below_one_is_refused_with_its_name_and_value(limit):
    with pytest.raises(ValueError, match=rf"{limit}=0 keeps nothing; pass a limit"):
        quiet(**{limit: 0})


# -- decoding and carriage returns


def test_utf8_characters_split_across_chunks_are_decoded_whole():
    text = "héllo → 世界 😀\n"
    out = quiet()
    for byte in text.encode():
        out.feed(0, "stdout", bytes([byte]))
    assert out.text(0, "stdout") == text
    # A character cut off at the end of the stream is shown as its bytes.
    out.feed(0, "stderr", "ok €".encode()[:-1])
    out.close()
    assert out.text(0, "stderr") == "ok \\xe2\\x82\n"


def test_a_character_split_at_the_length_limit_is_not_broken():
    out = quiet(max_line_chars=3)
    data = "ab€€€\n".encode()
    for byte in data:
        out.feed(0, "stdout", bytes([byte]))
    assert out.text(0, "stdout") == "ab€" + cut_note(2) + "\n"


@pytest.mark.parametrize(
    ("chunks", "shown"),
    [
        ([b"10%\r20%\r30%\n"], "30%"),
        ([b"windows\r\n"], "windows"),
        ([b"split crlf\r", b"\n"], "split crlf"),
        ([b"10%\r20", b"%\r", b"\r30%\r\r", b"\n"], "30%"),
        ([b"bar\r\r\r"], "bar"),  # unfinished: ends with the stream
        ([b"\r\r\n"], ""),
        ([b"long long long\rshort\n"], "short"),
        ([b"abc\rde\r\n"], "de"),
    ],
)
def test_carriage_returns_keep_what_a_terminal_shows_last(chunks, shown):
    out = quiet()
    for chunk in chunks:
        out.feed(0, "stdout", chunk)
    out.close()
    assert out.text(0, "stdout") == shown + "\n"


def test_a_progress_bar_far_longer_than_the_limit_keeps_its_last_state():
    out = quiet(max_line_chars=50)
    bar = b"".join(b"\r%6d |" % i + b"#" * (i % 40) for i in range(100_000))
    feed_in_chunks(out, bar + b"\ndone\n")
    last = 99_999
    assert out.text(0, "stdout") == f"{last:6d} |" + "#" * (last % 40) + "\ndone\n"


def test_a_cut_segment_before_a_carriage_return_is_forgotten_with_its_count():
    out = quiet(max_line_chars=5)
    out.feed(0, "stdout", b"x" * 100 + b"\rok\n" + b"y" * 100 + b"\r\n")
    assert out.text(0, "stdout") == "ok\n" + "yyyyy" + cut_note(95) + "\n"


# -- what is shown


def test_lines_mode_prints_every_line_cut_like_the_kept_ones(capsys):
    out = RankOutput(2, "launch: demo", show="lines", max_lines=2, max_line_chars=8)
    out.feed(0, "stdout", b"a\nb\nc\n")
    out.feed(1, "stderr", b"0123456789\n")
    out.feed(1, "stdout", b"tail without end")
    out.close()
    printed, errors = capsys.readouterr()
    assert printed == (
        "launch: demo\n[rank 0] a\n[rank 0] b\n[rank 0] c\n"
        "[rank 1] tail wit" + cut_note(8) + "\n"
    )
    assert errors == "[rank 1] 01234567" + cut_note(2) + "\n"


class FakeHandle:
    """Stands in for IPython's display handle: records what it was updated with."""

    def __init__(self, first):
        self.texts = [repr(first)]

    def update(self, obj) -> None:
        self.texts.append(repr(obj))


@pytest.fixture
def notebook(monkeypatch):
    handles: list[FakeHandle] = []

    def display(obj, display_id=False):
        handles.append(FakeHandle(obj))
        return handles[-1]

    monkeypatch.setattr(IPython.display, "display", display)
    return handles


def test_notebook_final_block_shows_the_last_lines_per_rank_with_a_note(
    notebook, capsys
):
    out = RankOutput(3, "launch: demo", show="notebook", max_lines=1_000)
    feed_in_chunks(out, "".join(f"r0 {i}\n" for i in range(1_500)).encode(), rank=0)
    feed_in_chunks(out, "".join(f"r1 {i}\n" for i in range(300)).encode(), rank=1)
    out.feed(2, "stdout", b"r2 only\n")
    out.feed(2, "stderr", b"r2 warns\n")
    out.close()
    printed, errors = capsys.readouterr()
    expected = [
        "[rank 0] [... 1,300 earlier lines not shown; result.stdout[0] keeps the last "
        "1,000 of 1,500 ...]",
        *(f"[rank 0] r0 {i}" for i in range(1_300, 1_500)),
        "[rank 1] [... 100 earlier lines not shown; result.stdout[1] has all 300 ...]",
        *(f"[rank 1] r1 {i}" for i in range(100, 300)),
        "[rank 2] r2 only",
    ]
    assert printed.splitlines() == expected
    assert errors == "[rank 2] r2 warns\n"
    # The live area is left with the header alone; the block above follows it.
    assert notebook[0].texts[0] == notebook[0].texts[-1] == "launch: demo"


def test_notebook_final_block_is_bounded_in_characters_too(notebook, capsys):
    out = RankOutput(1, "h", show="notebook")
    for i in range(50):
        out.feed(0, "stdout", b"%02d" % i + b"z" * (MAX_LINE_CHARS - 2) + b"\n")
    out.close()
    shown = capsys.readouterr().out.splitlines()
    keep = output.SHOWN_CHARS // MAX_LINE_CHARS
    assert shown[0] == (
        f"[rank 0] [... {50 - keep} earlier lines not shown; result.stdout[0] has "
        "all 50 ...]"
    )
    assert [line[9:11] for line in shown[1:]] == [
        f"{i:02d}" for i in range(50 - keep, 50)
    ]


def test_notebook_live_view_shows_the_last_lines_and_what_was_dropped(notebook):
    out = RankOutput(2, "launch: demo", show="notebook", max_lines=400)
    feed_in_chunks(out, "".join(f"a{i}\n" for i in range(1_000)).encode(), rank=0)
    out.feed(1, "stdout", b"b0\n")
    out._last_update = 0.0  # let the next refresh redraw now, whatever the clock
    out.refresh()
    live = notebook[0].texts[-1].splitlines()
    assert live[:3] == [
        "launch: demo",
        f"[... {1_001 - SHOWN_LINES} earlier lines not shown here ...]",
        "[... dropped from the result, which keeps the last 400 lines per rank and "
        "stream: rank 0 stdout 600 ...]",
    ]
    assert live[3:] == [
        *(f"[rank 0] a{i}" for i in range(1_001 - SHOWN_LINES, 1_000)),
        "[rank 1] b0",
    ]


# -- through workshop.launch


def _flood():
    if dist.get_rank() == 0:
        for i in range(30_000):
            print(f"step {i}")
    else:
        sys.stdout.write("x" * 1_000_000)  # one line with no end
        sys.stdout.flush()
        print("warning: the end", file=sys.stderr)
    return dist.get_rank()


@pytest.mark.usefixtures("no_leftover_children")
def test_a_launch_keeps_the_bounded_text_and_says_what_it_left_out(capsys):
    result = workshop.launch(_flood, world_size=2, backend="gloo", show="none")
    assert result.returns == [0, 1]
    assert capsys.readouterr() == ("", "")
    dropped = 30_000 - MAX_LINES
    assert result.stdout[0].splitlines() == [
        f"[... {dropped:,} earlier lines dropped; the last {MAX_LINES:,} kept ...]",
        *(f"step {i}" for i in range(dropped, 30_000)),
    ]
    assert result.stdout[1] == (
        "x" * MAX_LINE_CHARS + cut_note(1_000_000 - MAX_LINE_CHARS) + "\n"
    )
    assert result.stderr == ["", "warning: the end\n"]
