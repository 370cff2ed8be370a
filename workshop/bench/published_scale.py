"""Published figures at scale, each with its source, to hold the layout planner against.

Two kinds, in the records of :mod:`workshop.bench.published`:

- :class:`ScaleTable` (a :class:`~workshop.bench.published.PublishedTable`): a
  printed table. All-reduce bus bandwidth by message size on the 8 GPUs of one
  node (nccl-tests), and the weak scaling of GPT-3 175B training on 128 to 2,048
  H100 GPUs (NVIDIA's NeMo Megatron recipe);
- :class:`QuotedBandwidth` (a :class:`~workshop.bench.published.PublishedQuote`): one
  bus bandwidth an NCCL maintainer gave in an answer, with the line rate of the link
  it ran over; and plain quotes of published model-FLOPs utilisation at scale.

Only figures read in their source are here, as the source prints them (a table's
typing slip included: see ``scale_sources()``). Whatever is worked out from them
(busbw from the printed times with :func:`workshop.comm.costmodel.busbw`, tokens per
second and MFU from the step times, weak-scaling efficiency) is computed by
:func:`derived` and printed by :func:`scale_sources`, never stored as published.
:mod:`workshop.bench.published_scale_plots` draws them.
"""

from __future__ import annotations

from ..comm.costmodel import algbw, bus_factor, busbw
from ..sources.documents import pick_named
from .published import PublishedQuote
from .published_scale_data import TABLES, QuotedBandwidth, ScaleTable
from .published_scale_quotes import QUOTES

__all__ = ["derived", "scale_quotes", "scale_sources", "scale_tables"]


def scale_tables(*names: str) -> list[ScaleTable]:
    """The published tables at scale, each with its source.

    Args:
        *names: which tables (``ScaleTable.name``); none for all.

    Returns:
        The tables in a fixed order: three of bus bandwidth by message size, two
        of GPT-3 175B training throughput by GPU count.

    Raises:
        ValueError: an unknown name; the message lists the known ones.

    Example:
        >>> [t.name for t in scale_tables() if t.x_unit == "GPUs"]
        ['nemo-gpt3-175b-h100-bf16', 'nemo-gpt3-175b-h100-fp8']
    """
    return pick_named(TABLES, names, "published table at scale")


def scale_quotes(*names: str) -> list[PublishedQuote]:
    """Published single figures at scale: bus bandwidths quoted by NCCL maintainers
    (:class:`QuotedBandwidth`) and model-FLOPs utilisation of large runs.

    Args:
        *names: which quotes; none for all.

    Raises:
        ValueError: an unknown name; the message lists the known ones.

    Example:
        >>> scale_quotes("nccl-dgx-a100-8xhdr")[0].busbw_gbs
        (192.0, 192.0)
    """
    return pick_named(QUOTES, names, "published quote at scale")


def derived(table: ScaleTable) -> dict[str, list[float]]:
    """What follows from a table's printed figures, one value per point.

    For a bus-bandwidth table that prints times: ``"algbw GB/s"`` = size / time and
    ``"busbw GB/s"`` = algbw x 2(n-1)/n (:func:`workshop.comm.costmodel.busbw`),
    and ``"busbw from algbw"``, the printed algbw times the same factor. For a
    training table: the ``"global batch"`` its throughput implies (tokens/s x step
    / sequence), ``"MFU %"`` and ``"days for 1T tokens"`` from its tokens per
    second, and ``"weak-scaling efficiency"``: tokens/s per GPU over the first
    point's.

    Raises:
        ValueError: a table with nothing to derive (no times, no step times).

    Example:
        >>> (table,) = scale_tables("nccl-allreduce-dgx-h100")
        >>> round(derived(table)["busbw GB/s"][-2], 1)
        480.2
    """
    xs = [x for x, _ in table.points]
    ys = [y for _, y in table.points]
    names = [key for key, _ in table.columns]
    if table.x_unit == "bytes" and "time us" in names and table.world_size:
        n = table.world_size
        times = [t * 1e-6 for t in table.column("time us")]
        return {
            "algbw GB/s": [algbw(s, t) / 1e9 for s, t in zip(xs, times, strict=True)],
            "busbw GB/s": [
                busbw(s, t, n) / 1e9 for s, t in zip(xs, times, strict=True)
            ],
            "busbw from algbw": [
                busbw(a * 1e9, 1.0, n) / 1e9 for a in table.column("algbw GB/s")
            ],
        }
    if table.x_unit == "GPUs" and "step s" in names and table.seq:
        assert table.flops_per_sequence and table.peak_tflops
        steps = table.column("step s")
        per_gpu = [y / x for x, y in table.points]
        sequences = [y / table.seq for y in ys]
        return {
            "global batch": [y * s / table.seq for y, s in zip(ys, steps, strict=True)],
            "MFU %": [
                100 * q * table.flops_per_sequence / x / (table.peak_tflops * 1e12)
                for q, x in zip(sequences, xs, strict=True)
            ],
            "days for 1T tokens": [1e12 / y / 86400 for y in ys],
            "weak-scaling efficiency": [p / per_gpu[0] for p in per_gpu],
        }
    raise ValueError(
        f"table {table.name!r} prints no times or step times to derive from; "
        "derived() works on the bus-bandwidth table with times and the training tables"
    )


def _size(size: float) -> str:
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= unit:
            return f"{size / unit:g} {name}"
    return f"{size:g} B"


def _bus_lines(table: ScaleTable) -> list[str]:
    (s0, b0), (s_peak, b_peak) = table.points[0], max(table.points, key=lambda p: p[1])
    text = (
        f"{table.label}: busbw {b0:g} GB/s at {_size(s0)}, peak {b_peak:g} GB/s at "
        f"{_size(s_peak)}."
    )
    if table.size_labels:
        text += (
            f" Its sizes, printed {table.size_labels[0]} to {table.size_labels[-1]}, "
            f"are {_size(s0)} to {_size(table.points[-1][0])}, doubling."
        )
    lines = [text]
    if table.columns:
        worked = derived(table)["busbw GB/s"]
        worst = max(abs(w - b) for w, (_, b) in zip(worked, table.points, strict=True))
        factor = bus_factor(table.world_size or 1)
        lines.append(
            f"Worked out from its size and time, x 2(n-1)/n = {factor:g}: "
            f"{worked[table.points.index((s_peak, b_peak))]:.1f} GB/s at the peak; "
            f"at most {worst:.2f} GB/s from the printed busbw at any size (the "
            "printed times and bandwidths are rounded)."
        )
    return lines


def _training_lines(table: ScaleTable) -> list[str]:
    worked = derived(table)
    tokens = ", ".join(f"{x}: {y:,.0f}" for x, y in table.points)
    mfu = table.column("MFU %")
    implied = [round(b) for b in worked["global batch"]]
    printed = [round(b) for b in table.column("global batch")]
    lines = [
        f"{table.label}, tokens/s by GPUs: {tokens}; MFU {mfu[0]:.2f}% to "
        f"{mfu[-1]:.2f}%.",
        f"Worked out: per-GPU throughput at {table.points[-1][0]} GPUs is "
        f"{worked['weak-scaling efficiency'][-1]:.1%} of that at "
        f"{table.points[0][0]}; MFU from tokens/s {worked['MFU %'][0]:.2f}% to "
        f"{worked['MFU %'][-1]:.2f}%; the throughput implies global batches "
        f"{', '.join(map(str, implied))}.",
    ]
    slips = [
        f"{p} at {x} GPUs"
        for p, i, (x, _) in zip(printed, implied, table.points, strict=True)
        if p != i
    ]
    if slips:
        lines.append(
            f"The table prints {', '.join(slips)}: a slip, since its own throughput "
            "and step time need the batch worked out above."
        )
    return lines


def scale_sources(width: int = 88) -> str:
    """Every published figure at scale with its source, and what follows from it.

    Args:
        width: the longest line, in characters; at least 40.

    Returns:
        The text: the bus-bandwidth and training tables (with the figures worked
        out from them, see :func:`derived`), the quoted bus bandwidths beside their
        link's line rate, and the quoted utilisation of large runs.

    Raises:
        ValueError: ``width`` below 40.

    Example:
        >>> print(scale_sources())                                  # doctest: +SKIP
    """
    import textwrap

    if isinstance(width, bool) or not isinstance(width, int) or width < 40:
        raise ValueError(f"width={width!r} must be a whole number, 40 or more")

    def wrap(text: str, indent: str = "- ") -> list[str]:
        return textwrap.wrap(
            text,
            width,
            initial_indent=indent,
            subsequent_indent=" " * len(indent) + "  ",
            break_on_hyphens=False,
            break_long_words=False,
        )

    lines = wrap(
        "All-reduce bus bandwidth, 8 GPUs in one node (plot_published_busbw, left):", ""
    )
    bus = [t for t in TABLES if t.x_unit == "bytes"]
    training = [t for t in TABLES if t.x_unit == "GPUs"]
    for table, part in [(t, _bus_lines) for t in bus] + [
        (t, _training_lines) for t in training
    ]:
        if table is training[0]:
            lines += wrap("Training throughput at scale (plot_published_mfu):", "")
        first, *rest = part(table)
        lines += wrap(first)
        for text in [*rest, table.setup + ".", f"Source: {table.source.cite()}"]:
            lines += wrap(text, "    ")
    lines += wrap(
        "Bus bandwidths quoted on their own, against their link's line "
        "rate (plot_published_busbw, right):",
        "",
    )
    others = []
    for quote in QUOTES:
        if not isinstance(quote, QuotedBandwidth):
            others.append(quote)
            continue
        low, high = quote.busbw_gbs
        share = f"{low / quote.line_rate_gbs:.0%}"
        if high != low:
            share += f" to {high / quote.line_rate_gbs:.0%}"
        lines += wrap(f"{quote.statement}.")
        lines += wrap(
            f"That is {share} of a {quote.line_rate_gbs:g} GB/s line rate "
            f"({quote.link}). Source: {quote.source.cite()}",
            "    ",
        )
    lines += wrap("Utilisation of large runs, quoted (not drawn):", "")
    for quote in others:
        lines += wrap(f"{quote.statement}.")
        lines += wrap(f"Source: {quote.source.cite()}", "    ")
    return "\n".join(lines)
