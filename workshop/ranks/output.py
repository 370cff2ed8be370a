"""Every rank's output: split into whole lines, marked with the rank, shown live in the
cell (or terminal) and kept for the result.

Lines are written whole, one write per line, so two ranks never mix characters within a
line. In a notebook the live lines go to a display area that is replaced, when the ranks
are done, by the same lines grouped in rank order: what stays in the notebook is the
same on every run, whichever rank happened to print first.

A rank can print without end, so everything here is bounded, and says what it left out:

- a line keeps its first ``MAX_LINE_CHARS`` characters, then a note of how many more
  there were. Taking in a long line costs time in proportion to its length: the text
  past the limit is counted, never stored, re-joined or searched again;
- each rank's stdout and stderr (a :class:`Stream` each) keep their last ``MAX_LINES``
  lines (and at most ``MAX_KEPT_CHARS`` characters) for the result, under a first line
  that says how many earlier lines were dropped;
- the notebook shows at most the last ``SHOWN_LINES`` lines (and ``SHOWN_CHARS``
  characters) live, and as many per rank and stream in the final block; the rest
  stays in the result.
"""

from __future__ import annotations

import codecs
import sys
import time
from collections import deque
from collections.abc import Sequence

# A line longer than this is cut: 10,000 characters are a screenful of wrapped text,
# far beyond any log line a learner reads, and keep a runaway line from filling memory.
MAX_LINE_CHARS = 10_000
# Lines kept per rank and stream for the RunResult. The characters are bounded too,
# so that 10,000 lines of 10,000 characters do not hold 100 MB per stream.
MAX_LINES = 10_000
MAX_KEPT_CHARS = 2_000_000


def plural(n: int, what: str) -> str:
    """``n`` with thousands separators and ``what``, plural unless ``n`` is 1."""
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def last_lines(lines: Sequence[str], max_lines: int, max_chars: int) -> list[str]:
    """The last lines of ``lines``: at most ``max_lines`` of them, and no more than
    ``max_chars`` characters together (but at least one line)."""
    picked: list[str] = []
    chars = 0
    for line in reversed(lines):
        if len(picked) == max_lines:
            break
        chars += len(line)
        if chars > max_chars and picked:
            break
        picked.append(line)
    picked.reverse()
    return picked


class Stream:
    """One rank's stdout or stderr: the line being written and the lines kept.

    The line being written is what a terminal would show of it last: a carriage
    return (a progress bar redrawing itself) starts it over, and a trailing one
    leaves the text before it. ``cur`` is the text since the last carriage return,
    ``prev`` the last non-empty text before one."""

    def __init__(self, max_line_chars: int) -> None:
        self.max_line_chars = max_line_chars
        self.decoder = codecs.getincrementaldecoder("utf-8")("backslashreplace")
        self.kept: deque[str] = deque()
        self.kept_chars = 0
        self.dropped = 0  # complete lines no longer kept
        # (pieces, characters stored, characters cut) of the line being written.
        self.cur: tuple[list[str], int, int] = ([], 0, 0)
        self.prev: tuple[list[str], int, int] | None = None

    def add(self, text: str) -> None:
        """Append ``text`` (no line end, no carriage return) to the line."""
        pieces, stored, cut = self.cur
        room = self.max_line_chars - stored
        if len(text) <= room:
            if text:
                pieces.append(text)
                stored += len(text)
        else:
            # Past the limit only the count grows: the line's cost stays linear.
            if room > 0:
                pieces.append(text[:room])
                stored += room
            cut += len(text) - max(room, 0)
        self.cur = (pieces, stored, cut)

    def carriage_return(self) -> None:
        if self.cur[1] or self.cur[2]:  # an empty text between two draws nothing
            self.prev = self.cur
            self.cur = ([], 0, 0)

    def take(self, segment: str) -> None:
        """Append a piece of a line (no line end) that may hold carriage returns."""
        if "\r" not in segment:
            self.add(segment)
            return
        first, _, rest = segment.partition("\r")
        self.add(first)
        self.carriage_return()
        # Only the last non-empty text between carriage returns can still be shown;
        # the rest was drawn over. Found with string methods, not a loop per "\r".
        middle, _, last = rest.rpartition("\r")
        middle = middle.rstrip("\r")
        if middle:
            self.add(middle.rpartition("\r")[2])
            self.carriage_return()
        self.add(last)

    def has_line(self) -> bool:
        """Whether a line is being written (something a terminal would show)."""
        return bool(self.cur[1] or self.cur[2] or self.prev)

    def line(self) -> str:
        """The line being written, as a terminal would show it, cut to the limit."""
        shows = self.cur if self.cur[1] or self.cur[2] else self.prev
        pieces, _stored, cut = shows or ([], 0, 0)
        text = "".join(pieces)
        if cut:
            text += f" [... {plural(cut, 'more character')} of this line left out ...]"
        return text

    def end_line(self) -> str:
        """The finished line; the next one starts empty."""
        text = self.line()
        self.cur = ([], 0, 0)
        self.prev = None
        return text

    def keep(self, lines: list[str], max_lines: int, max_chars: int) -> None:
        """Keep ``lines`` for the result, dropping the oldest past the limits."""
        if len(lines) > max_lines:
            # Lines that would be dropped at once are never stored.
            self.dropped += len(self.kept) + len(lines) - max_lines
            self.kept.clear()
            self.kept_chars = 0
            lines = lines[-max_lines:]
        self.kept.extend(lines)
        self.kept_chars += sum(map(len, lines))
        while len(self.kept) > max_lines or (
            self.kept_chars > max_chars and len(self.kept) > 1
        ):
            self.kept_chars -= len(self.kept.popleft())
            self.dropped += 1

    def dropped_note(self) -> str:
        return (
            f"[... {plural(self.dropped, 'earlier line')} dropped; "
            f"the last {len(self.kept):,} kept ...]"
        )


# Lines (and characters) the notebook shows: live, of all ranks together, and in the
# final block, per rank and stream. A browser stays responsive with this much text.
SHOWN_LINES = 200
SHOWN_CHARS = 100_000
# The display area is redrawn at most this often: the browser's work stays small.
_REDRAW_S = 0.2


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class RankOutput:
    """Collects the stdout and stderr lines of ``world_size`` ranks.

    Args:
        world_size: number of ranks.
        header: one line that introduces the launch (shown first).
        show: "auto" (notebook display in Jupyter, plain lines elsewhere), "lines"
            (plain lines as they arrive), or "none" (keep quiet, only collect).
        max_lines: lines kept per rank and stream for the result; older ones are
            dropped and counted.
        max_line_chars: characters a line keeps; the rest is counted in a note.
        max_kept_chars: characters kept per rank and stream for the result (the
            last line is kept whatever its length).

    Raises:
        ValueError: if a limit is below 1.

    Example:
        >>> out = RankOutput(1, "demo", show="none", max_lines=2)
        >>> out.feed(0, "stdout", b"a\\nb\\nc\\n")
        >>> out.text(0, "stdout")
        '[... 1 earlier line dropped; the last 2 kept ...]\\nb\\nc\\n'
    """

    def __init__(
        self,
        world_size: int,
        header: str,
        show: str = "auto",
        *,
        max_lines: int = MAX_LINES,
        max_line_chars: int = MAX_LINE_CHARS,
        max_kept_chars: int = MAX_KEPT_CHARS,
    ):
        for name, value in (
            ("max_lines", max_lines),
            ("max_line_chars", max_line_chars),
            ("max_kept_chars", max_kept_chars),
        ):
            if value < 1:
                raise ValueError(
                    f"RankOutput: {name}={value} keeps nothing; pass a limit of at "
                    "least 1 (the defaults are MAX_LINES, MAX_LINE_CHARS and "
                    "MAX_KEPT_CHARS in workshop.ranks.output)"
                )
        self.world_size = world_size
        self.header = header
        self.max_lines = max_lines
        self.max_kept_chars = max_kept_chars
        self._streams = {
            (r, s): Stream(max_line_chars)
            for r in range(world_size)
            for s in ("stdout", "stderr")
        }
        self._last: list[str | None] = [None] * world_size
        width = len(str(world_size - 1))
        self._prefix = [f"[rank {r:>{width}}] " for r in range(world_size)]
        if show == "auto":
            show = "notebook" if _in_notebook() else "lines"
        self.show = show
        # The live view needs only its last lines; the count says how many came.
        self._live: deque[str] = deque(maxlen=SHOWN_LINES)
        self._live_count = 0
        self._handle = None
        self._last_update = 0.0
        self._shown = 0
        if show == "notebook":
            from IPython.display import display

            self._handle = display(_Text(header), display_id=True)
        elif show == "lines":
            print(header, flush=True)

    def feed(self, rank: int, stream: str, data: bytes, final: bool = False) -> None:
        """Add raw bytes ``rank`` wrote to ``stream`` ("stdout" or "stderr"), cut
        anywhere (even inside a UTF-8 character); complete lines are shown and kept.
        ``final``: the stream has ended, so an unfinished line is finished."""
        state = self._streams[(rank, stream)]
        segments = state.decoder.decode(data, final).split("\n")
        complete: list[str] = []
        if len(segments) > 1:
            state.take(segments[0])
            complete.append(state.end_line())
            for segment in segments[1:-1]:
                if "\r" in segment or len(segment) > state.max_line_chars:
                    state.take(segment)
                    segment = state.end_line()
                complete.append(segment)
        state.take(segments[-1])
        if final and state.has_line():
            complete.append(state.end_line())
        if complete:
            self._add_lines(rank, stream, state, complete)
        self.refresh()

    def _add_lines(
        self, rank: int, stream: str, state: Stream, lines: list[str]
    ) -> None:
        state.keep(lines, self.max_lines, self.max_kept_chars)
        for line in reversed(lines):
            if line.strip():
                self._last[rank] = line
                break
        prefix = self._prefix[rank]
        if self.show == "lines":
            out = sys.stdout if stream == "stdout" else sys.stderr
            for line in lines:
                out.write(prefix + line + "\n")  # one write: never mixed with another
            out.flush()
        elif self.show == "notebook":
            self._live.extend(prefix + line for line in lines[-SHOWN_LINES:])
            self._live_count += len(lines)

    def refresh(self) -> None:
        """Redraw the notebook's live area if lines arrived since the last redraw;
        at most five times a second, to keep the browser's work small."""
        if (
            self._handle is not None
            and self._live_count != self._shown
            and time.monotonic() - self._last_update > _REDRAW_S
        ):
            self._update()

    def _update(self) -> None:
        self._last_update = time.monotonic()
        self._shown = self._live_count
        shown = last_lines(self._live, SHOWN_LINES, SHOWN_CHARS)
        notes = []
        if self._live_count > len(shown):
            notes.append(
                f"[... {plural(self._live_count - len(shown), 'earlier line')} "
                "not shown here ...]"
            )
        dropped = [
            f"rank {r} {s} {state.dropped:,}"
            for (r, s), state in self._streams.items()
            if state.dropped
        ]
        if dropped:
            notes.append(
                f"[... dropped from the result, which keeps the last {self.max_lines:,}"
                f" lines per rank and stream: {', '.join(dropped)} ...]"
            )
        self._handle.update(_Text("\n".join([self.header, *notes, *shown])))

    def close(self) -> None:
        """Flush unfinished lines; in a notebook, leave the output in rank order,
        at most ``SHOWN_LINES`` lines per rank and stream."""
        for rank, stream in list(self._streams):
            self.feed(rank, stream, b"", final=True)
        if self._handle is None:
            return
        self._handle.update(_Text(self.header))
        for stream, out in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            block = [
                self._prefix[rank] + line
                for rank in range(self.world_size)
                for line in self._final_lines(rank, stream)
            ]
            if block:
                out.write("\n".join(block) + "\n")
                out.flush()

    def _final_lines(self, rank: int, stream: str) -> list[str]:
        """The last lines of ``rank``'s ``stream`` for the final block (at most
        ``SHOWN_LINES`` and ``SHOWN_CHARS``), after a note of those left out."""
        state = self._streams[(rank, stream)]
        lines = last_lines(state.kept, SHOWN_LINES, SHOWN_CHARS)
        written = state.dropped + len(state.kept)
        if written == len(lines):
            return lines
        where = f"result.{stream}[{rank}]"
        keeps = (
            f"{where} keeps the last {len(state.kept):,} of {written:,}"
            if state.dropped
            else f"{where} has all {written:,}"
        )
        return [
            f"[... {plural(written - len(lines), 'earlier line')} not shown; "
            f"{keeps} ...]",
            *lines,
        ]

    def text(self, rank: int, stream: str) -> str:
        """What ``rank`` wrote to ``stream`` ("stdout" or "stderr") so far: its last
        lines (at most ``max_lines``), each ended by a newline, under a first line
        such as "[... 20,000 earlier lines dropped; the last 10,000 kept ...]" if any
        were dropped; "" if it wrote nothing."""
        state = self._streams[(rank, stream)]
        lines = [state.dropped_note(), *state.kept] if state.dropped else state.kept
        return "\n".join(lines) + ("\n" if lines else "")

    def last_line(self, rank: int) -> str | None:
        """The last non-empty line ``rank`` printed, for error messages: its
        unfinished stdout line, else its unfinished stderr line, else its last
        complete non-blank line, cut like any other; None if it printed nothing."""
        for stream in ("stdout", "stderr"):
            state = self._streams[(rank, stream)]
            if state.has_line():
                line = state.line()
                if line.strip():
                    return line
        return self._last[rank]


class _Text:
    """Plain text for IPython's display machinery."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text
