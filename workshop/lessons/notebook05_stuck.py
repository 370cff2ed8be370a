"""The lab where one rank never joins a collective (notebook 05, "When a rank hangs").

:func:`summarize_error` shortens a :class:`~workshop.LaunchError` to the lines a learner
reads (no traceback, torch's long collective fingerprints cut to what differs, lines
of at most 88 columns); :func:`flight_record` returns, inside a rank, the collectives
torch's flight recorder holds for that rank, so the ranks' records can be compared.
"""

from __future__ import annotations

import pickle
import re
import textwrap

from ..ranks.session import LaunchError

__all__ = ["flight_record", "summarize_error"]

# torch's DETAIL fingerprint spells out every tensor option; the device type is the
# only part of them a lesson needs.
_OPTIONS = re.compile(r"TensorOptions\(dtype=[^,]*, device=(\w+).*?=\(nullopt\)\)")
_FINGERPRINT = re.compile(r"CollectiveFingerPrint\(([^()]*)\)")


def summarize_error(error: LaunchError, width: int = 88) -> str:
    """The part of a launch's error a learner reads, each line cut to ``width``.

    Drops the traceback, and in a ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` mismatch puts
    each rank's collective on a line of its own, without the tensor options.

    Args:
        error: what ``workshop.launch`` raised.
        width: the longest line, in columns (at least 40).

    Returns:
        The message, wrapped.

    Raises:
        TypeError: ``error`` is not a LaunchError.
        ValueError: ``width`` below 40.

    Example:
        >>> try:                                               # doctest: +SKIP
        ...     workshop.launch(mismatched, world_size=2, backend="gloo")
        ... except workshop.LaunchError as e:
        ...     print(summarize_error(e))
    """
    if not isinstance(error, LaunchError):
        raise TypeError(
            f"summarize_error takes the LaunchError that workshop.launch raised, got a "
            f"{type(error).__name__}; catch it with except workshop.LaunchError as e"
        )
    if width < 40:
        raise ValueError(f"width={width} is too narrow to read; pass width=88")
    text = str(error).split("\n\nTraceback of rank")[0]
    text = _OPTIONS.sub(r"\1", text)
    text = _FINGERPRINT.sub(r"(\1)", text)
    text = re.sub(r"(Rank \d+ is running collective:)", r"\n\1", text)
    text = text.replace("Collectives differ", "\nCollectives differ")
    text = re.sub(r"\.?\s*\(\n", "\n", text)
    lines = []
    for line in text.splitlines():
        lines += textwrap.wrap(
            line, width, subsequent_indent="    ", break_on_hyphens=False
        ) or [""]
    return "\n".join(lines)


def flight_record() -> list[tuple[int, str, list]] | None:
    """Inside a rank: the collectives torch's flight recorder holds for this rank.

    The flight recorder keeps the last collectives of each process group (2000 by
    default; ``TORCH_FR_BUFFER_SIZE``, older ``TORCH_NCCL_TRACE_BUFFER_SIZE``, sets
    how many, 0 turns it off). NCCL's came first; gloo's collectives are recorded
    only by newer releases (torch 2.15 does).

    Returns:
        ``(sequence number, operation, input sizes)`` per collective, oldest first;
        None where this torch recorded none (no recorder, or not for this backend).

    Example:
        >>> workshop.launch(lambda: flight_record(), world_size=2)  # doctest: +SKIP
    """
    try:
        from torch._C._distributed_c10d import _dump_fr_trace
    except ImportError:
        return None
    try:
        record = pickle.loads(_dump_fr_trace())
    except RuntimeError:  # recorder off, or none for this backend
        return None
    entries = [
        (e["collective_seq_id"], e["profiling_name"], e.get("input_sizes", []))
        for e in record.get("entries", [])
    ]
    return entries or None  # an older torch records NCCL's collectives only
