"""One rank's stream of output, bounded: the line being written, cut at
``MAX_LINE_CHARS`` with a count of the rest, and the last ``MAX_LINES`` lines kept,
with a count of those dropped. :class:`workshop.ranks.output.RankOutput` holds one per
rank and stream.
"""

from __future__ import annotations

import codecs
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
    for index in range(len(lines) - 1, -1, -1):
        if len(picked) == max_lines:
            break
        line = lines[index]
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
