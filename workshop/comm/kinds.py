"""The three kinds of collective communication, as S. Li's TACC course sorts them
(document 003 of the workshop's sources, "Machine Learning at TACC: Distributed
Training", 2024): **synchronisation** (the ranks wait for each other, no data moves),
**data movement** (tensors travel unchanged) and **collective computation** (tensors
are combined on the way: a sum, a maximum...). Notebook 02, section 4, names the kind
of every call in a recorded trace with :func:`communication_kind`.
"""

from __future__ import annotations

__all__ = ["KINDS", "communication_kind"]

#: The three kinds, in the order the course lists them.
KINDS = ("synchronisation", "data movement", "collective computation")

_KIND_OF = {
    "barrier": KINDS[0],
    **dict.fromkeys(
        (
            "send",
            "recv",
            "isend",
            "irecv",
            "broadcast",
            "scatter",
            "gather",
            "all_gather",
            "all_gather_into_tensor",
            "all_to_all",
            "all_to_all_single",
        ),
        KINDS[1],
    ),
    **dict.fromkeys(
        ("reduce", "all_reduce", "reduce_scatter", "reduce_scatter_tensor"),
        KINDS[2],
    ),
}


def communication_kind(op: str) -> str:
    """Which of the three kinds of communication a ``torch.distributed`` call is.

    Args:
        op: the function's name, as in a trace event's ``op``.

    Returns:
        "synchronisation", "data movement" or "collective computation".

    Raises:
        ValueError: ``op`` is not a communication call the workshop knows.

    Example:
        >>> communication_kind("all_reduce"), communication_kind("barrier")
        ('collective computation', 'synchronisation')
    """
    try:
        return _KIND_OF[op]
    except (KeyError, TypeError):
        raise ValueError(
            f"op={op!r} is not a torch.distributed communication call the workshop "
            f"knows; pass one of: {', '.join(sorted(_KIND_OF))}"
        ) from None
