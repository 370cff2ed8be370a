"""The benchmark tables of the source documents, as data.

Every cell is kept as the document writes it ("762.10", "9318.20 (10143.52)", a
blank where the slide has none, "*" where it marks a count it could not run), so
that :func:`workshop.sources.documents.holds` can check each one against the
document. Speed-up and efficiency are worked out here from those cells, never copied::

    table = document_table("cpu-batch50")
    print(table)                 # the cells, speed-up and efficiency, the source
    table.speedups()             # {label: [(cores, speed-up), ...]} for a plot

Only document 004 (W. Guan, SHARCNET / Compute Canada) has benchmark tables.
"""

from __future__ import annotations

from .doc_table import DocumentTable
from .documents import pick_named

__all__ = ["document_table", "document_tables"]

_GRAHAM_CPU = (
    "Graham (SHARCNET) CPU node, 32 cores, Intel E5-2683 v4 Broadwell (the slides "
    "name that CPU beside the 16-core comparison)"
)
_TF = "TensorFlow 1.13 and 2.0 Beta"
_MNIST = "handwritten digit recognition (MNIST)"
_P100 = "Graham GPU node, 2 nVidia Pascal p100"
_V100 = "Graham AI GPU node, 8 nVidia Volta v100"
_NO_BLANK = "blank cells: the slide gives no figure for that count"


def _mnist(**fields) -> DocumentTable:
    """A table of the slides' MNIST runs: seconds of 20000 steps, TensorFlow."""
    mnist = {"key": "004", "unit": "s", "bigger_is_better": False, "software": _TF}
    return DocumentTable(**{**mnist, "model": _MNIST, "iterations": 20000, **fields})


_TABLES: tuple[DocumentTable, ...] = (
    _mnist(
        name="cpu-batch50",
        caption="Benchmark of multiple CPUs",
        label="MNIST on CPU cores, batch 50 (SHARCNET)",
        columns=("CPU cores", "time"),
        rows=(("1", "2854.43"), ("2", "2295.09"), ("4", "1582.72"),
              ("8", "1153.90"), ("16", "762.10"), ("32", "1187.92")),
        count="CPU cores",
        hardware=_GRAHAM_CPU,
        batch="50",
        notes=("the slide heads the first column '# of CPUs'; they are the cores "
               "of one node",),
    ),
    _mnist(
        name="cpu-batch256",
        caption="Benchmark of multiple CPUs (cont.)",
        label="MNIST on CPU cores, batch 256 (SHARCNET)",
        columns=("CPU cores", "time"),
        rows=(("1", "11193.94"), ("2", "8757.93"), ("4", "6645.16"),
              ("8", "3838.28"), ("16", "2559.46"), ("32", "2336.07")),
        count="CPU cores",
        hardware=_GRAHAM_CPU,
        batch="256",
    ),
    _mnist(
        name="gpu-p100-apis",
        caption="Benchmark of single GPU",
        label="MNIST on one P100, per API (SHARCNET)",
        columns=("API", "time"),
        rows=(("low-level API", "~157"), ("Keras", "~133"), ("estimator", "~185")),
        count=None,
        hardware=_P100 + " (one used)",
        batch="256",
        notes=("the next slide gives Keras on the P100 as 135 s, this one ~133 s",),
    ),
    _mnist(
        name="gpu-p100-v100-apis",
        caption="Benchmark of single GPU (cont.)",
        label="MNIST on one GPU, per API (SHARCNET)",
        columns=("API", "P100", "V100"),
        rows=(("low-level API", "157", "103"), ("Keras", "135", "128"),
              ("Estimator", "185", "133")),
        count=None,
        hardware=f"{_P100}; {_V100} (one GPU used)",
        batch="256",
    ),
    _mnist(
        name="keras-gpus-batch256",
        caption="Benchmark of multiple GPUs (Keras)",
        label="MNIST Keras, batch 256 (SHARCNET)",
        columns=("GPUs", "P100", "V100"),
        rows=(("1", "135", "128"), ("2", "161", "164"), ("4", "", "190"),
              ("6", "", "196"), ("8", "", "229")),
        count="GPUs",
        hardware=f"{_P100}; {_V100}",
        software=_TF + ", Keras API, mirrored strategy",
        batch="256",
        notes=(_NO_BLANK,),
    ),
    _mnist(
        name="estimator-gpus-batch256",
        caption="Benchmark of multiple GPUs (Estimator)",
        label="MNIST Estimator, batch 256 (SHARCNET)",
        columns=("GPUs", "P100", "V100"),
        rows=(("1", "185", "133"), ("2", "252", "231"), ("4", "", "239"),
              ("6", "*", "*"), ("8", "", "338")),
        count="GPUs",
        hardware=f"{_P100}; {_V100}",
        software=_TF + ", Estimator API, mirrored strategy",
        batch="256",
        notes=(
            _NO_BLANK,
            "'*' at 6 GPUs: the slide says the batch size must be a multiple of "
            "the number of GPUs",
        ),
    ),
    *(
        _mnist(
            name=f"{api.lower()}-v100-batch{batch}",
            caption=f"Benchmark of multiple GPUs ({api})",
            label=f"MNIST {api} V100, batch {batch} (SHARCNET)",
            columns=("GPUs", "time"),
            rows=tuple(zip(("1", "2", "4", "8"), times, strict=True)),
            count="GPUs",
            hardware=_V100,
            software=f"{_TF}, {api} API, mirrored strategy",
            batch=batch,
            notes=("the slides' test of their hypothesis that the MNIST task "
                   "(~3 million trainable parameters) is far below one GPU's "
                   "capacity: increase the batch size",),
        )
        for api, batch, times in (
            ("Keras", "2048", ("343", "301", "269", "268")),
            ("Keras", "8192", ("1203", "873", "856", "828")),
            ("Estimator", "2048", ("723", "447", "357", "431")),
            ("Estimator", "8192", ("2791", "1246", "818", "714")),
        )
    ),
    DocumentTable(
        name="resnet50-v100-batch128",
        key="004",
        caption="Benchmark of ResNet50, batch_size=128",
        label="ResNet-50, V100, one node (SHARCNET)",
        columns=("GPUs", "examples/s"),
        rows=(("1", "345"), ("2", "567"), ("4", "877"), ("8", "1132")),
        count="GPUs",
        unit="examples/s",
        bigger_is_better=True,
        hardware=_V100,
        software="TensorFlow, the tensorflow/models repository",
        model="ResNet-50 (50 layers, image size 224, 23 million trainable "
        "parameters), synthetic data instead of real images",
        batch="128",
        iterations=None,
        notes=("the slide does not say whether 128 is the batch of each GPU or of "
               "all GPUs together",),
    ),
    DocumentTable(
        name="horovod-resnet50",
        key="004",
        caption="Benchmarks with ResNet50",
        label="ResNet-50, Horovod, 2 GPUs per node (SHARCNET)",
        columns=("nodes", "GPUs", "images/s"),
        rows=(("1", "2", "322.93"), ("2", "4", "629.01"), ("4", "8", "1238.57"),
              ("8", "16", "2443.49"), ("16", "32", "4825.47"),
              ("32", "64", "9318.20 (10143.52)")),
        count="GPUs",
        unit="images/s",
        bigger_is_better=True,
        hardware="Graham, 2 GPUs per node (the slide names no GPU model; Graham's "
        "nodes with 2 GPUs are its p100 nodes)",
        software="TensorFlow, Horovod with NCCL2 (tf_cnn_benchmarks.py, "
        "--variable_update horovod), started by mpirun",
        model="ResNet-50 (tf_cnn_benchmarks)",
        batch="32 per GPU",
        iterations=None,
        notes=(
            "64 GPUs: the slide gives a second figure in parentheses and does not "
            "say what it is (another run? the best step rather than the mean? a "
            "count without warm-up?); speed-up and efficiency here use the first",
        ),
    ),
)  # fmt: skip


def document_tables(*names: str) -> list[DocumentTable]:
    """The source documents' benchmark tables (all from document 004).

    Args:
        *names: which tables (see ``DocumentTable.name``); none for all.

    Returns:
        The tables, in the order of the document.

    Raises:
        ValueError: a name that is not known; the message lists the known ones.

    Example:
        >>> [t.name for t in document_tables()][:2]
        ['cpu-batch50', 'cpu-batch256']
    """
    return pick_named(_TABLES, names, "document table")


def document_table(name: str) -> DocumentTable:
    """One benchmark table of a source document, by name.

    Raises:
        ValueError: an unknown name; the message lists the known ones.

    Example:
        >>> print(document_table("cpu-batch50"))      # doctest: +SKIP
    """
    (table,) = document_tables(name)
    return table
