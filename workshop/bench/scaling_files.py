"""Reading scaling runs back from their JSON files, one or many at once.

A batch job measures one world size per step (``slurm/scaling.sbatch``: 1 rank, then
1 node, 2 nodes, ...) and each step writes its own file. :func:`load_scaling` reads
any number of them, or the folder that holds them, as one :class:`ScalingResult`
with every world size in it, so the table and the plot show the whole curve.
Nothing here needs torch: the results can be drawn on a login node.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path

from .scaling_results import (
    KIND,
    MODES,
    ScalingResult,
    ScalingRow,
    add_speedups,
    why_not_comparable,
)

__all__ = ["load_scaling"]

PathLike = str | os.PathLike[str]


def load_scaling(*paths: PathLike) -> ScalingResult:
    """Read scaling runs back from the JSON files :meth:`ScalingResult.save` wrote.

    Several files (or folders of them) become one result: their rows in one table,
    ordered by mode and world size, with speed-up and efficiency taken against the
    smallest world size of each mode among all of them. That is how the steps of a
    batch job, each measured at its own world size, are read together.

    Args:
        *paths: ``.json`` files, or folders whose ``*.json`` scaling files are all
            read (other JSON files in a folder are passed over).

    Returns:
        The :class:`ScalingResult`; with several files, its descriptive fields
        (steps, launcher, machine, ...) are those of the first file.

    Raises:
        FileNotFoundError: no such file, or a folder with no scaling file in it.
        ValueError: a file that is not a scaling run's JSON (a CSV, say); files
            that measured different models, backends or batches; two files that
            both hold the same mode at the same world size.

    Example:
        >>> job = load_scaling("runs/scaling-1234")            # doctest: +SKIP
        >>> both = load_scaling("base.json", "two_nodes.json")  # doctest: +SKIP
    """
    if not paths:
        raise TypeError(
            "load_scaling needs at least one path: a .json file that "
            "`python -m workshop.bench scaling --out PREFIX` wrote, or its folder"
        )
    found = [run for p in paths for run in _runs(Path(p))]
    files, runs = [f for f, _ in found], [run for _, run in found]
    if len(runs) == 1:
        return runs[0]
    return _merge(runs, files)


def _runs(path: Path) -> list[tuple[Path, ScalingResult]]:
    """The file's run, or the runs of a folder's scaling files in name order (each
    file read once; other JSON files in a folder are passed over)."""
    if path.is_dir():
        found = []
        for f in sorted(path.glob("*.json")):
            try:
                found.append((f, _read(f)))
            except (OSError, ValueError):
                continue
        if not found:
            raise FileNotFoundError(
                f"no scaling results in the folder {str(path)!r}; it holds no .json "
                "file that `python -m workshop.bench scaling --out PREFIX` wrote"
            )
        return found
    if not path.is_file():
        raise FileNotFoundError(
            f"no scaling results at {str(path)!r}; write them with "
            "`python -m workshop.bench scaling --out PREFIX` (PREFIX.json)"
        )
    return [(path, _read(path))]


def _read(path: Path) -> ScalingResult:
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(
            f"{str(path)!r} is not JSON ({exc}); pass the .json file that "
            "`--out PREFIX` wrote, not the .csv"
        ) from exc
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise ValueError(
            f"{str(path)!r} is not a scaling run (its 'kind' is "
            f"{data.get('kind') if isinstance(data, dict) else None!r}, not {KIND!r})"
        )
    names = {f.name for f in fields(ScalingRow)}
    rows = [
        ScalingRow(**{k: v for k, v in r.items() if k in names}) for r in data["rows"]
    ]
    names = {f.name for f in fields(ScalingResult)}
    return ScalingResult(
        **{k: v for k, v in data.items() if k in names} | {"rows": rows}
    )


def _merge(runs: list[ScalingResult], files: list[Path]) -> ScalingResult:
    """One result from runs of the same benchmark at different world sizes."""
    first, name = runs[0], str(files[0])
    held: dict[tuple[str, int], str] = {}
    for run, path in zip(runs, files, strict=True):
        if (run.backend, run.device) != (first.backend, first.device):
            raise ValueError(
                f"{name!r} measured {first.backend} on {first.device} but "
                f"{str(path)!r} {run.backend} on {run.device}; load runs of one "
                "backend and device together"
            )
        why = why_not_comparable(
            (first.model, first.image_size, first.rows),
            (run.model, run.image_size, run.rows),
        )
        if why:
            raise ValueError(
                f"{name!r} and {str(path)!r} measured different things: {why}; "
                "load runs of one model, image size and batch together"
            )
        for row in run.rows:
            key = (row.mode, row.world_size)
            if key in held:
                raise ValueError(
                    f"{held[key]!r} and {str(path)!r} both hold {row.mode} scaling at "
                    f"{row.world_size} rank(s); load only one of them"
                )
            held[key] = str(path)
    rows = sorted(
        (row for run in runs for row in run.rows),
        key=lambda r: (MODES.index(r.mode), r.world_size),
    )
    add_speedups(rows)
    # A 1-rank step fits no alpha and beta (there is no all-reduce): say where the
    # other steps' came from, not that there are none.
    sources = sorted({run.alpha_beta_source for run in runs})
    sources = [s for s in sources if not s.startswith("none")] or sources
    return ScalingResult(
        **{f.name: getattr(first, f.name) for f in fields(ScalingResult)}
        | {"rows": rows, "alpha_beta_source": "; ".join(sources)}
    )
