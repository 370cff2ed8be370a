"""The file systems of SHARCNET's Graham cluster, as W. Guan's slides give them
(document 004): notebook 05's worked example of "where your data lives". The
figures are of the document's time; ``quota`` or ``diskusage_report`` tells yours.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from .documents import cite

__all__ = ["GRAHAM_STORAGE", "FileSystem", "format_table", "storage_table"]


@dataclass(frozen=True)
class FileSystem:
    """One file system of a cluster, as a site's storage table describes it.

    Attributes:
        name, path, kind: e.g. "scratch", "$SLURM_TMPDIR", "Lustre".
        quota, backed_up, purged: as the site states them.
        default: "yes" (every account has it) or "transient" (made for each job).
        on_compute_nodes: "yes" (every node sees it) or "per node".
        holds: what to keep there (the workshop's advice, not the site's words).
    """

    name: str
    path: str
    kind: str
    quota: str
    backed_up: bool
    purged: str
    default: str
    on_compute_nodes: str
    holds: str


# Document 004's table and its list of file system types, one entry per row.
GRAHAM_STORAGE: tuple[FileSystem, ...] = (
    FileSystem(
        "home",
        "/home",
        "NFS",
        "50 GB and 0.5M files per user",
        True,
        "no",
        "yes",
        "yes",
        "code, virtual environments, small configs",
    ),
    FileSystem(
        "project",
        "/project",
        "Lustre",
        "1 TB and 0.5M files per group; up to 10 TB on request",
        True,
        "no",
        "yes",
        "yes",
        "datasets and results the group keeps",
    ),
    FileSystem(
        "scratch",
        "/scratch",
        "Lustre",
        "20 TB and 1M files per user; extendable to 100 TB",
        False,
        "files older than 60 days",
        "yes",
        "yes",
        "a running job's output, checkpoints",
    ),
    FileSystem(
        "local disk",
        "$SLURM_TMPDIR",
        "local SSD or RAM disk",
        "over 960 GB SSD per node",
        False,
        "no",
        "transient",
        "per node",
        "one job's copy of its data",
    ),
)

_COLUMNS = (
    # header, width, value of a FileSystem
    ("file system", 16, lambda f: f"{f.path} ({f.kind})"),
    ("quota", 24, lambda f: f.quota),
    ("backed up", 6, lambda f: "yes" if f.backed_up else "no"),
    ("purged", 12, lambda f: f.purged),
    ("default", 9, lambda f: f.default),
    ("on compute nodes", 8, lambda f: f.on_compute_nodes),
)


def format_table(
    headers: Sequence[str], widths: Sequence[int], rows: Sequence[Sequence[str]]
) -> str:
    """A plain-text table whose cells wrap within their column's width.

    Args:
        headers: one title per column (wrapped too).
        widths: characters per column, each at least 3.
        rows: the cells, one sequence of strings per row.

    Returns:
        The table, columns two spaces apart, a rule under the headers.

    Raises:
        ValueError: widths or a row that do not match the headers, or a width below 3.

    Example:
        >>> print(format_table(["a", "b"], [3, 3], [["x", "y z"]]))
        a    b
        ---  ---
        x    y z
    """
    if len(widths) != len(headers):
        raise ValueError(
            f"got {len(headers)} headers but {len(widths)} widths; give one width "
            "per column"
        )
    if any(w < 3 for w in widths):
        raise ValueError(f"column widths must be 3 or more, got {list(widths)}")
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(
                f"row {list(row)} has {len(row)} cells for {len(headers)} columns"
            )

    def lines(cells: Sequence[str]) -> list[str]:
        wrapped = [
            textwrap.wrap(c, w) or [""] for c, w in zip(cells, widths, strict=True)
        ]
        height = max(len(w) for w in wrapped)
        return [
            "  ".join(
                (cell[i] if i < len(cell) else "").ljust(w)
                for cell, w in zip(wrapped, widths, strict=True)
            ).rstrip()
            for i in range(height)
        ]

    out = lines(headers)
    out.append("  ".join("-" * w for w in widths))
    for row in rows:
        out += lines(row)
    return "\n".join(out)


def storage_table(
    systems: Sequence[FileSystem] = GRAHAM_STORAGE, source: str | None = "004"
) -> str:
    """The storage table of a site, at most 88 characters wide, under its source.

    Args:
        systems: the file systems; Graham's (document 004) by default.
        source: the document the figures come from, None for no source line.

    Raises:
        ValueError: an unknown source key.

    Example:
        >>> print(storage_table())  # doctest: +ELLIPSIS
        Graham's file systems, from W. Guan (SHARCNET / Compute Canada), ...
    """
    headers = [h for h, _, _ in _COLUMNS]
    widths = [w for _, w, _ in _COLUMNS]
    rows = [[value(f) for _, _, value in _COLUMNS] for f in systems]
    table = format_table(headers, widths, rows)
    if source is None:
        return table
    caption = textwrap.fill(f"Graham's file systems, from {cite(source)}:", 88)
    return f"{caption}\n{table}"
