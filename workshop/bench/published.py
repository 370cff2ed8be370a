"""Published scaling figures, as plain data, each with its source, to set beside a
learner's own: ``plot_scaling(my_run, published_scaling())``.

Only figures read in their source are here, as the source gives them. A *table*
(GPUs, samples per second) can be drawn; a *quote* (one figure, or an efficiency with
no throughput behind it) is printed, not drawn, since a line through it would look
like a measurement nobody published. A figure credited to one of the workshop's
documents holds only numbers that document contains (:func:`figures_not_in_documents`);
the documents' other tables are in :mod:`workshop.sources.tables`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable

from ..checks import whole
from ..sources.documents import Document, document, missing_numbers, pick_named
from ..sources.published import PublishedQuote, PublishedTable, Source
from ..sources.tables import document_table

__all__ = [
    "figures_not_in_documents",
    "line_wrapper",
    "published_quotes",
    "published_scaling",
    "published_sources",
    "published_tables",
]


_NVIDIA = Source(
    title="ResNet50 v1.5 For PyTorch (PyTorch/Classification/ConvNets/resnet50v1.5/"
    "README.md), 'Training performance: NVIDIA DGX-1 16GB (8x V100 16GB)', "
    "pytorch-21.03 NGC container",
    organisation="NVIDIA DeepLearningExamples",
    year=2021,
    url="https://github.com/NVIDIA/DeepLearningExamples",
)
_HOROVOD = Source(
    title="Horovod documentation, Benchmarks (512-GPU benchmark); see also Sergeev "
    "and Del Balso, 'Horovod: fast and easy distributed deep learning in TensorFlow', "
    "arXiv:1802.05799",
    organisation="Horovod (LF AI & Data, originally Uber)",
    year=2018,
    url="https://github.com/horovod/horovod/blob/master/docs/benchmarks.rst",
)
_GOYAL = Source(
    title="Goyal et al., 'Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour', "
    "arXiv:1706.02677, abstract",
    organisation="Facebook AI Research",
    year=2017,
    url="https://arxiv.org/abs/1706.02677",
)


def _from_document(name: str, table_name: str, setup: str) -> PublishedTable:
    """A throughput table of a source document, as a drawable table."""
    table = document_table(table_name)
    return PublishedTable(
        name=name,
        label=table.label,
        setup=setup,
        points=tuple((n, x) for n, x in table.values()),
        source=table.document,
        table=table,
    )


_TABLES = (
    PublishedTable(
        name="resnet50-v100-fp32",
        label="ResNet-50 FP32, V100 (NVIDIA, published)",
        setup="ResNet-50 v1.5, PyTorch, one process per GPU, FP32, one DGX-1 (8x "
        "V100 16GB, NVLink), ImageNet (the README's default loader is DALI), a batch "
        "per GPU",
        points=((1, 367.0), (8, 2855.0)),
        source=_NVIDIA,
        stated_speedup=7.76,
    ),
    PublishedTable(
        name="resnet50-v100-amp",
        label="ResNet-50 mixed precision, V100 (NVIDIA, published)",
        setup="ResNet-50 v1.5, PyTorch, one process per GPU, mixed precision, one "
        "DGX-1 (8x V100 16GB, NVLink), ImageNet (the README's default loader is "
        "DALI), a batch per GPU",
        points=((1, 1200.0), (8, 8322.0)),
        source=_NVIDIA,
        stated_speedup=6.93,
    ),
    _from_document(
        "sharcnet-resnet50-v100",
        "resnet50-v100-batch128",
        "ResNet-50, TensorFlow (tensorflow/models), one Graham node of 8 V100s, "
        "synthetic data, batch 128 (the slide does not say per GPU or in all)",
    ),
    _from_document(
        "sharcnet-horovod-resnet50",
        "horovod-resnet50",
        "ResNet-50, TensorFlow with Horovod (ring all-reduce over NCCL2), 1 to 32 "
        "Graham nodes of 2 GPUs, batch 32 per GPU; at 64 GPUs the slide gives "
        "9318.20 and, in parentheses, 10143.52, which it does not explain: the "
        "first is drawn",
    ),
)

_QUOTES = (
    PublishedQuote(
        name="large-batch-16gpus",
        statement="16 GPUs on two machines trained 70% faster than 8 GPUs on one "
        "machine; the author puts the drop in accuracy, 68.82% to 63.73%, down to "
        "twice as many model replicas",
        source=document("002"),
    ),
    PublishedQuote(
        name="p100-vs-cpu-cores",
        statement="on the MNIST example (batch 256, 20000 iterations) a single "
        "Pascal P100 ran about 15 times as fast as 16 cores of an Intel E5-2683 v4 "
        "(Broadwell)",
        source=document("004"),
    ),
    PublishedQuote(
        name="horovod-512gpus",
        statement="512 GPUs (128 servers of 4 Pascal GPUs, 25 Gbit/s RoCE): 90% "
        "scaling efficiency for Inception V3 and ResNet-101, 68% for VGG-16",
        source=_HOROVOD,
    ),
    PublishedQuote(
        name="goyal-large-batch",
        statement="ResNet-50 on ImageNet: no loss of accuracy up to a minibatch of "
        "8192 images with the linear scaling rule and a warm-up; about 90% scaling "
        "efficiency from 8 to 256 GPUs",
        source=_GOYAL,
    ),
)


def figures_not_in_documents(
    *items: PublishedTable | PublishedQuote,
) -> list[str]:
    """The figures credited to a source document that the document does not hold.

    Args:
        *items: tables and quotes to check; none for all of this module's.

    Returns:
        A line per item with figures its document lacks (``"large-batch-16gpus [doc
        002]: 75"``); empty when every figure is found.

    Example:
        >>> figures_not_in_documents()
        []
    """
    problems = []
    for item in items or (*_TABLES, *_QUOTES):
        if isinstance(item.source, Document):
            missing = missing_numbers(item.source.key, item.numbers_text())
            if missing:
                problems.append(
                    f"{item.name} [doc {item.source.key}]: {', '.join(missing)}"
                )
    return problems


def published_tables(*names: str) -> list[PublishedTable]:
    """The published throughput tables, each with its source, in a fixed order.

    Raises:
        ValueError: an unknown name (``PublishedTable.name``); the message lists them.

    Example:
        >>> [t.name for t in published_tables()][:2]
        ['resnet50-v100-fp32', 'resnet50-v100-amp']
    """
    return pick_named(_TABLES, names, "published table")


def published_quotes(*names: str) -> list[PublishedQuote]:
    """Published figures that are not tables (one number, or an efficiency).

    Raises:
        ValueError: an unknown name (``PublishedQuote.name``); the message lists them.

    Example:
        >>> published_quotes("large-batch-16gpus")[0].statement[:21]
        '16 GPUs on two machin'
    """
    return pick_named(_QUOTES, names, "published quote")


def published_scaling(*names: str) -> dict[str, list[tuple[int, float]]]:
    """Published tables (see :func:`published_tables`) as ``{label: [(gpus,
    samples/s), ...]}`` for ``plot_scaling``.

    Raises:
        ValueError: an unknown name.

    Example:
        >>> published_scaling("resnet50-v100-fp32")
        {'ResNet-50 FP32, V100 (NVIDIA, published)': [(1, 367.0), (8, 2855.0)]}
    """
    return {t.label: list(t.points) for t in published_tables(*names)}


def line_wrapper(
    width: int, break_long_words: bool = True
) -> Callable[[str, str], list[str]]:
    """``wrap(text, indent="- ")``: an item of a list of sources, in lines at most
    ``width`` long (40 or more, else ValueError), the first after ``indent``."""
    whole("width", width, 40)

    def wrap(text: str, indent: str = "- ") -> list[str]:
        return textwrap.wrap(
            text,
            width,
            initial_indent=indent,
            subsequent_indent=" " * len(indent) + "  ",
            break_on_hyphens=False,  # keep addresses and names whole
            break_long_words=break_long_words,
        )

    return wrap


def published_sources(width: int = 88) -> str:
    """Every published table and quote with its source, as lines of text; each
    table's speed-up and efficiency worked out from its own numbers.

    Args:
        width: the longest line, in characters; at least 40.

    Raises:
        ValueError: ``width`` below 40.

    Example:
        >>> print(published_sources())                          # doctest: +SKIP
    """
    from ..sources.tables import document_tables

    wrap = line_wrapper(width)
    lines = wrap("Tables of throughput (drawn by plot_scaling):", "")
    for t in _TABLES:
        (n0, x0), (n, x) = t.points[0], t.points[-1]
        speedup = x / x0
        figures = ", ".join(f"{g}: {r:,.0f}" for g, r in t.points)
        stated = ""
        if t.stated_speedup is not None and round(t.stated_speedup, 2) != round(
            speedup, 2
        ):
            stated = (
                " from the rounded throughputs it prints (its own strong-scaling "
                f"column says {t.stated_speedup:.2f}x)"
            )
        elif t.stated_speedup is not None:
            stated = " (as its own strong-scaling column says)"
        lines += wrap(
            f"{t.label}, samples/s by GPUs: {figures}; speed-up {speedup:.2f}x on "
            f"{n // n0}x the GPUs{stated}, efficiency {speedup * n0 / n:.0%}.",
            "- ",
        )
        lines += wrap(f"{t.setup}.", "    ")
        lines += wrap(f"Source: {t.source.cite()}", "    ")
    tables = document_tables()
    keys = sorted({t.key for t in tables})
    lines += wrap(
        "Tables of the source documents "
        "(print(workshop.sources.document_table(name))):",
        "",
    )
    for t in tables:
        lines += wrap(f"{t.name}: {t.label.rsplit(' (', 1)[0]}", "- ")
    for key in keys:
        lines += wrap(f"Source: {document(key).cite()}", "    ")
    lines.append("Quoted figures (not drawn):")
    for q in _QUOTES:
        lines += wrap(f"{q.statement}.", "- ")
        lines += wrap(f"Source: {q.source.cite()}", "    ")
    return "\n".join(lines)
