"""Published scaling figures, as plain data, each with its source.

To set a learner's own measurements beside figures others published, in the form
:func:`workshop.bench.scaling_plots.plot_scaling` draws::

    plot_scaling(my_run, published_scaling())

Only figures read in their source are here, copied as the source gives them. A
*table* (GPUs, samples per second) can be drawn; a *quote* (one figure, or an
efficiency with no throughput behind it) is printed with its source, not drawn, since
a line through one point, or through points worked back from a percentage, would
look like a measurement that nobody published. Where the workshop's source material
quotes a figure whose original table could not be found, the quote says so
("as quoted in the workshop's source material").

Not here, because their numbers could not be found in a source: the source
material's TensorFlow MNIST runs on 1 to 32 CPU cores, its Keras and Estimator runs
on 1 to 8 GPUs at batch 256, 2048 and 8192, its ResNet-50 runs on 1 to 8 V100s
(NVIDIA's published 1- and 8-GPU figures stand in) and the full table of its Horovod
ResNet-50 benchmark on 2 to 64 GPUs (only the 64-GPU figure is quoted).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "PublishedQuote",
    "PublishedTable",
    "Source",
    "published_quotes",
    "published_scaling",
    "published_sources",
    "published_tables",
]


@dataclass(frozen=True)
class Source:
    """Where a published figure comes from.

    Attributes:
        title: the document's title (and the part of it that holds the figure).
        organisation: who published it.
        year: the year of the figures, None where the source does not say.
        url: where to read it, None where it is not known.
    """

    title: str
    organisation: str
    year: int | None
    url: str | None

    def cite(self) -> str:
        """One line: organisation, title, year and address."""
        year = f", {self.year}" if self.year else ""
        url = f", {self.url}" if self.url else ""
        return f"{self.organisation}: {self.title}{year}{url}"


@dataclass(frozen=True)
class PublishedTable:
    """A published throughput table: (GPUs, samples per second) pairs.

    Attributes:
        name: a short key, e.g. "resnet50-v100-fp32".
        label: the legend entry, naming model, hardware and source.
        setup: how it was measured (model, precision, batch, software).
        points: (GPUs, samples per second), as the source gives them.
        source: where it was published.
    """

    name: str
    label: str
    setup: str
    points: tuple[tuple[int, float], ...]
    source: Source


@dataclass(frozen=True)
class PublishedQuote:
    """A published figure that is not a table: printed with its source, not drawn.

    Attributes:
        name: a short key.
        statement: the figure, in words, as the source gives it.
        source: where it was published (or quoted).
    """

    name: str
    statement: str
    source: Source


_NVIDIA = Source(
    title="ResNet50 v1.5 For PyTorch (PyTorch/Classification/ConvNets/resnet50v1.5/"
    "README.md), 'Training performance: NVIDIA DGX-1 16GB (8x V100 16GB)', "
    "pytorch-21.03 NGC container",
    organisation="NVIDIA DeepLearningExamples",
    year=2021,
    url="https://github.com/NVIDIA/DeepLearningExamples",
)
_MATERIAL = Source(
    title="the workshop's source material (SHARCNET / Compute Canada training "
    "material); the original table was not found",
    organisation="SHARCNET",
    year=None,
    url=None,
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

_TABLES = (
    PublishedTable(
        name="resnet50-v100-fp32",
        label="ResNet-50 FP32, V100 (NVIDIA, published)",
        setup="ResNet-50 v1.5, PyTorch, FP32, one DGX-1 (8x V100 16GB, NVLink), "
        "ImageNet; strong scaling 7.76x on 8 GPUs as the source states",
        points=((1, 367.0), (8, 2855.0)),
        source=_NVIDIA,
    ),
    PublishedTable(
        name="resnet50-v100-amp",
        label="ResNet-50 mixed precision, V100 (NVIDIA, published)",
        setup="ResNet-50 v1.5, PyTorch, mixed precision, one DGX-1 (8x V100 16GB, "
        "NVLink), ImageNet; strong scaling 6.93x on 8 GPUs as the source states",
        points=((1, 1200.0), (8, 8322.0)),
        source=_NVIDIA,
    ),
)

_QUOTES = (
    PublishedQuote(
        name="horovod-resnet50-64gpus",
        statement="Horovod, ResNet-50: 9,318 images/s on 64 GPUs, about 90% "
        "scaling efficiency against 2 GPUs",
        source=_MATERIAL,
    ),
    PublishedQuote(
        name="large-batch-16gpus",
        statement="16 GPUs at the same per-GPU batch: 70% faster, accuracy "
        "down from 68.8% to 63.7% after the same epochs",
        source=_MATERIAL,
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


def _pick(items: tuple, names: tuple[str, ...], what: str) -> list:
    known = [item.name for item in items]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(
            f"no published {what} named {unknown}; the known ones are {known}; pass "
            "some of those, or nothing for all"
        )
    return [item for item in items if not names or item.name in names]


def published_tables(*names: str) -> list[PublishedTable]:
    """The published throughput tables, each with its source.

    Args:
        *names: which tables (see ``PublishedTable.name``); none for all.

    Returns:
        The tables, in a fixed order.

    Raises:
        ValueError: a name that is not known; the message lists the known ones.

    Example:
        >>> [t.name for t in published_tables()]
        ['resnet50-v100-fp32', 'resnet50-v100-amp']
    """
    return _pick(_TABLES, names, "table")


def published_quotes(*names: str) -> list[PublishedQuote]:
    """Published figures that are not tables (one number, or an efficiency).

    Args:
        *names: which quotes (see ``PublishedQuote.name``); none for all.

    Returns:
        The quotes, in a fixed order.

    Raises:
        ValueError: a name that is not known; the message lists the known ones.

    Example:
        >>> published_quotes("large-batch-16gpus")[0].statement[:9]
        '16 GPUs a'
    """
    return _pick(_QUOTES, names, "quote")


def published_scaling(*names: str) -> dict[str, list[tuple[int, float]]]:
    """Published tables as ``{label: [(gpus, samples/s), ...]}`` for ``plot_scaling``.

    Args:
        *names: which tables (see :func:`published_tables`); none for all.

    Returns:
        One series per table; each label names the model, the GPU and the source.

    Raises:
        ValueError: a name that is not known.

    Example:
        >>> published_scaling("resnet50-v100-fp32")
        {'ResNet-50 FP32, V100 (NVIDIA, published)': [(1, 367.0), (8, 2855.0)]}
        >>> fig = plot_scaling(my_run, published_scaling())     # doctest: +SKIP
    """
    return {t.label: list(t.points) for t in published_tables(*names)}


def published_sources(width: int = 88) -> str:
    """Every published table and quote with its source, as lines of text.

    Each table's efficiency against its smallest GPU count is worked out from its own
    numbers (speed-up / N), so the reader sees what the figures say.

    Args:
        width: the longest line, in characters; at least 40.

    Returns:
        The text, lines at most ``width`` long.

    Raises:
        ValueError: ``width`` below 40.

    Example:
        >>> print(published_sources())                          # doctest: +SKIP
    """
    import textwrap

    if isinstance(width, bool) or not isinstance(width, int) or width < 40:
        raise ValueError(f"width={width!r} must be a whole number, 40 or more")

    def wrap(text: str, indent: str) -> list[str]:
        return textwrap.wrap(
            text,
            width,
            initial_indent=indent,
            subsequent_indent=" " * len(indent) + "  ",
            break_on_hyphens=False,  # keep addresses and names whole
        )

    lines = ["Tables (drawn):"]
    for t in _TABLES:
        (n0, x0), (n, x) = t.points[0], t.points[-1]
        speedup = x / x0
        figures = ", ".join(f"{g} GPU{'s' * (g > 1)}: {r:,.0f}/s" for g, r in t.points)
        lines += wrap(
            f"{t.label}: {figures}; speed-up {speedup:.2f}x on {n // n0}x the GPUs, "
            f"efficiency {speedup * n0 / n:.0%}.",
            "- ",
        )
        lines += wrap(f"{t.setup}.", "    ")
        lines += wrap(f"Source: {t.source.cite()}", "    ")
    lines.append("Quoted figures (not drawn):")
    for q in _QUOTES:
        lines += wrap(f"{q.statement}.", "- ")
        lines += wrap(f"Source: {q.source.cite()}", "    ")
    return "\n".join(lines)
