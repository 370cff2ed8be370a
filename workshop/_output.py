"""Every rank's output: split into whole lines, marked with the rank, shown live in the
cell (or terminal) and kept for the result.

Lines are written whole, one write per line, so two ranks never mix characters within a
line. In a notebook the live lines go to a display area that is replaced, when the ranks
are done, by the same lines grouped in rank order: what stays in the notebook is the
same on every run, whichever rank happened to print first.
"""

from __future__ import annotations

import codecs
import sys
import time


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
    """

    def __init__(self, world_size: int, header: str, show: str = "auto"):
        self.world_size = world_size
        self.header = header
        self.lines: list[dict[str, list[str]]] = [
            {"stdout": [], "stderr": []} for _ in range(world_size)
        ]
        self._last: list[str | None] = [None] * world_size
        self._partial = {
            (r, s): "" for r in range(world_size) for s in ("stdout", "stderr")
        }
        self._decoders = {
            key: codecs.getincrementaldecoder("utf-8")("backslashreplace")
            for key in self._partial
        }
        width = len(str(world_size - 1))
        self._prefix = [f"[rank {r:>{width}}] " for r in range(world_size)]
        if show == "auto":
            show = "notebook" if _in_notebook() else "lines"
        self.show = show
        self._live: list[str] = []
        self._handle = None
        self._last_update = 0.0
        self._shown = 0
        if show == "notebook":
            from IPython.display import display

            self._handle = display(_Text(header), display_id=True)
        elif show == "lines":
            print(header, flush=True)

    def feed(self, rank: int, stream: str, data: bytes, final: bool = False) -> None:
        """Add raw bytes a rank wrote; complete lines are shown and kept."""
        key = (rank, stream)
        text = self._partial[key] + self._decoders[key].decode(data, final)
        *complete, rest = text.split("\n")
        if final and rest:
            complete.append(rest)
            rest = ""
        self._partial[key] = rest
        for line in complete:
            # A progress bar redraws with \r; keep what a terminal would show last.
            line = (
                line.rsplit("\r", 1)[-1]
                if "\r" in line.rstrip("\r")
                else line.rstrip("\r")
            )
            self.lines[rank][stream].append(line)
            if line.strip():
                self._last[rank] = line
            self._show(rank, stream, line)
        self.refresh()

    def _show(self, rank: int, stream: str, line: str) -> None:
        marked = self._prefix[rank] + line
        if self.show == "lines":
            out = sys.stdout if stream == "stdout" else sys.stderr
            out.write(
                marked + "\n"
            )  # one write per line: never mixed with another rank
            out.flush()
        elif self.show == "notebook":
            self._live.append(marked)

    def refresh(self) -> None:
        """Redraw the notebook's live area if lines arrived since the last redraw;
        at most five times a second, to keep the browser's work small."""
        if (
            self._handle is not None
            and len(self._live) != self._shown
            and time.monotonic() - self._last_update > 0.2
        ):
            self._update()

    def _update(self) -> None:
        self._last_update = time.monotonic()
        self._shown = len(self._live)
        self._handle.update(_Text("\n".join([self.header, *self._live[-200:]])))

    def close(self) -> None:
        """Flush unfinished lines; in a notebook, leave the output in rank order."""
        for rank, stream in list(self._partial):
            self.feed(rank, stream, b"", final=True)
        if self._handle is None:
            return
        self._handle.update(_Text(self.header))
        for stream, out in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            block = [
                self._prefix[r] + line
                for r in range(self.world_size)
                for line in self.lines[r][stream]
            ]
            if block:
                out.write("\n".join(block) + "\n")
                out.flush()

    def text(self, rank: int, stream: str) -> str:
        """Everything ``rank`` wrote to ``stream`` so far, as text."""
        lines = self.lines[rank][stream]
        return "\n".join(lines) + ("\n" if lines else "")

    def last_line(self, rank: int) -> str | None:
        """The last non-empty line ``rank`` printed (stdout or stderr), if any."""
        for stream in ("stdout", "stderr"):
            if self._partial[(rank, stream)].strip():
                return self._partial[(rank, stream)]
        return self._last[rank]


class _Text:
    """Plain text for IPython's display machinery."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text
