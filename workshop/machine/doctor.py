"""Doctor: what this machine and allocation have, and what the workshop will use:
``python -m workshop doctor`` (or under ``srun``), or ``workshop.doctor();`` in a cell.

It only reports: anything missing is a row saying so, and the command always exits
0. It never initialises CUDA in the calling process, so a kernel can still fork ranks
afterwards: the GPU count comes from NVML, names and memory from ``nvidia-smi``.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple, TextIO

from .. import env
from .._house import WIDTH
from ..allocation import cpu_limit, memory_limit, slurm_allocation
from ..ranks.streams import display_path
from .doctor_probes import (
    Items,
    _run,
    nccl_version,
    nvidia_smi_gpus,
    slurm_unconfigured,
    torch_build,
    torchvision_version,
    version_line,
)

__all__ = ["Row", "collect_rows", "doctor", "format_rows"]

#: Columns of the printed table: fits a terminal and a projector.

#: Seconds each outside command (``nvidia-smi``, ``mpirun --version``, ...) may take.
COMMAND_TIMEOUT_S = 5.0


class Row(NamedTuple):
    """One line of the report: ``Row("Backends", "gloo", "available")``."""

    section: str
    item: str
    value: str


# One function per section. Each returns (item, value) pairs; collect_rows turns an
# exception in one of them into an "error" row, so one broken probe spoils nothing else.


def _python_items() -> Items:
    version = f"{platform.python_version()} ({platform.python_implementation()})"
    return [
        ("version", version),
        ("executable", display_path(sys.executable)),
        ("platform", f"{platform.system()} {platform.machine()}"),
    ]


def _pytorch_items() -> Items:
    import torch

    build = torch_build(torch.version.cuda, getattr(torch.version, "hip", None))
    return [
        ("torch", f"{torch.__version__} ({build})"),
        ("torchvision", torchvision_version()),
    ]


def _job_gpus() -> int | None:
    """GPUs the Slurm job has on this node ("4", or ids "0,1"); None if none asked."""
    given = slurm_allocation().gpus_on_node
    if not given:
        return None
    return int(given) if given.isdigit() else len(given.split(","))


def _gpu_items() -> Items:
    visible = env.visible_gpu_count()
    items = [("visible to torch", str(visible) if visible else "0 (none: CPU ranks)")]
    job = _job_gpus()
    if job is not None and job != visible:
        # Without Slurm's device cgroup a job sees the node's GPUs, those of other
        # jobs too; CUDA_VISIBLE_DEVICES, which Slurm sets, is what torch obeys.
        mismatch = (
            f"has {job} GPU{'s' if job != 1 else ''} on this node, but torch sees "
            f"{visible}: check CUDA_VISIBLE_DEVICES "
            f"({os.environ.get('CUDA_VISIBLE_DEVICES', 'not set')})"
        )
        items.append(("Slurm job", mismatch))
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [*items, ("nvidia-smi", "not found")]
    ok, output = _run(
        [smi, "--query-gpu=index,name,memory.total", "--format=csv,noheader"],
        COMMAND_TIMEOUT_S,
    )
    if not ok:
        return [*items, ("nvidia-smi", output)]
    listed = nvidia_smi_gpus(output)
    if not listed:
        return [*items, ("nvidia-smi", "lists no GPU")]
    items += listed
    if len(listed) != visible:
        note = (
            f"torch sees {visible} of the {len(listed)} GPUs nvidia-smi lists "
            "(CUDA_VISIBLE_DEVICES, the allocation or a CPU build of torch decides)"
        )
        items.append(("note", note))
    return items


def _cpu_items() -> Items:
    # Inside a Slurm job, a container or a cgroup the process may use fewer cores
    # than the node has; each figure the workshop derives (ranks, threads per
    # rank) follows the smaller one, so say which it is and where it was read.
    limit = cpu_limit()
    if limit.cores < limit.node_cores:
        usable = f"{limit.cores} usable by this process: {limit.source}"
        items = [("cores", f"{limit.node_cores} ({usable})")]
    else:
        items = [("cores", str(limit.node_cores))]
    narrow = limit.narrow_binding()
    if narrow:
        items.append(("note", narrow))
    return items


def _memory_items() -> Items:
    return [("available", memory_limit().describe())]


def _backend_items() -> Items:
    import torch.distributed as dist

    if not dist.is_available():
        return [("torch.distributed", "not available in this torch build")]
    if dist.is_nccl_available():
        version = nccl_version()
        nccl = f"available (NCCL {version})" if version else "available"
        if env.visible_gpu_count() == 0:
            nccl += ", but it needs a GPU per rank"
    else:
        nccl = "not available (a CPU build of torch)"
    gloo = "available" if dist.is_gloo_available() else "not available"
    mpi = "not available (pip wheels are built without MPI)"
    mpi = "available" if dist.is_mpi_available() else mpi
    return [("nccl", nccl), ("gloo", gloo), ("mpi", mpi)]


def _launcher_items() -> Items:
    items = []
    for name in ("mpirun", "srun"):
        path = shutil.which(name)
        if path is None:
            items.append((name, "not found"))
            continue
        ok, output = _run([path, "--version"], COMMAND_TIMEOUT_S)
        if not ok and name == "srun":
            # srun exits with "res_nsearch error: Unknown host" where Slurm is
            # installed without a cluster: say that, in plain words.
            output = slurm_unconfigured(output) or output
        where = display_path(path)
        items.append((name, f"{version_line(output)} ({where})" if ok else output))
    items.append(("torchrun", _torchrun()))
    return items


def _torchrun() -> str:
    """Where ``torchrun`` is; a kernel's environment is often not on PATH."""
    path = shutil.which("torchrun")
    if path:
        return display_path(path)
    beside = Path(sys.executable).with_name("torchrun")
    if beside.exists():
        return f"not on PATH, but beside this Python: {display_path(beside)}"
    return "not found"


def _slurm_items() -> Items:
    allocation = slurm_allocation()
    if not allocation.inside:
        return [("allocation", "none (not inside a Slurm job)")]
    nodes = "not set" if allocation.nodes is None else str(allocation.nodes)
    if allocation.nodelist:
        nodes += f" ({allocation.nodelist})"
    cpus, memory = allocation.cpus_on_node, allocation.memory_on_node
    memory = (
        "not set (the whole node's)" if memory is None else f"{memory / 2**30:.1f} GiB"
    )
    items = [
        ("job id", str(allocation.job_id)),
        ("partition", allocation.partition or "not set"),
        ("nodes", nodes),
        ("tasks", "not set" if allocation.tasks is None else str(allocation.tasks)),
        ("CPUs on node", "not set" if cpus is None else str(cpus)),
        ("memory on node", memory),
        ("GPUs on node", allocation.gpus_on_node or "none requested"),
    ]
    if allocation.in_step:
        # A portal's notebook kernel runs as a job step: what it starts from a cell
        # is not that step's task (see rank_env and cluster/run.environment).
        step = (
            "this process is a task of a job step (a notebook kernel that a "
            "portal started with srun): ranks and commands it starts get the "
            "job's variables but not the step's, and srun from a cell needs "
            "--overlap (workshop.cluster.srun_command adds it)"
        )
        items.append(("job step", step))
    return items


def _process_items() -> Items:
    info = env.rank_info()
    if info.launcher == "none":
        rank = "0 of 1 (no launcher)"
    else:
        rank = (
            f"{info.rank} of {info.world_size}, local rank {info.local_rank} of "
            f"{info.local_world_size}, node {info.node_rank} (from {info.launcher})"
        )
    items = [("rank", rank)]
    if info.master_addr or info.master_port:
        addr = info.master_addr or "address not set"
        port = info.master_port or "not set"
        items.append(("master", f"{addr}, port {port}"))
    return items


def _default_items() -> Items:
    from ..ranks.forkable import choose_start_method, fork_hazard

    gpus = env.visible_gpu_count()
    world_size = env.default_world_size(gpus)
    cores = env.usable_cores()
    backend = env.choose_backend("auto", world_size, gpus=gpus)
    if backend == "nccl":
        backend += " (one GPU per rank)"
    elif gpus == 0:
        backend += " (CPU ranks: no GPU visible)"
    else:
        backend += " (CPU ranks: this torch has no NCCL)"
    # The kernel's own state decides (a CUDA call, or a backward pass with a GPU
    # visible, leaves it unable to fork ranks), as it does for launch().
    method, reason = choose_start_method("auto", fork_hazard())
    ranks = (
        f"{world_size} (CPU ranks, for {cores} usable core{'s' if cores != 1 else ''})"
    )
    return [
        ("world_size", f"{world_size} (one per GPU)" if gpus else ranks),
        ("backend", backend),
        ("start method", f"{method} ({reason})"),
    ]


_SECTIONS: tuple[tuple[str, Callable[[], Items]], ...] = (
    ("Python", _python_items),
    ("PyTorch", _pytorch_items),
    ("GPUs", _gpu_items),
    ("CPU", _cpu_items),
    ("Memory", _memory_items),
    ("Backends", _backend_items),
    ("Launchers", _launcher_items),
    ("Slurm", _slurm_items),
    ("This process", _process_items),
    ("Workshop defaults", _default_items),
)


def collect_rows() -> list[Row]:
    """This machine's report as plain data, in the printed order; a probe that fails
    gives a row with item "error" and the exception instead of raising.

    Example:
        >>> {(r.section, r.item): r.value for r in collect_rows()}[("Backends", "gloo")]
        'available'
    """
    rows = []
    for section, probe in _SECTIONS:
        try:
            items = probe()
        # The doctor reports what it finds; whatever a probe raises becomes its row.
        except Exception as e:
            items = [("error", f"{type(e).__name__}: {e}")]
        rows.extend(Row(section, item, value) for item, value in items)
    return rows


def format_rows(rows: Iterable[Row], width: int = WIDTH) -> str:
    """Lay rows out as a plain-text table: a heading per section, aligned values
    wrapped to ``width``; no trailing newline.

    Example:
        >>> print(format_rows([Row("CPU", "cores", "8")]))
        CPU
          cores  8
    """
    rows = list(rows)
    indent = "  "
    key_width = min(max((len(row.item) for row in rows), default=0), 24)
    value_width = max(width - len(indent) - key_width - 2, 20)
    pad = " " * (len(indent) + key_width + 2)
    lines: list[str] = []
    section = None
    for row in rows:
        if row.section != section:
            section = row.section
            if lines:
                lines.append("")
            lines.append(section)
        chunks = textwrap.wrap(row.value, value_width, break_on_hyphens=False) or [""]
        if len(row.item) > key_width:
            lines.append(indent + row.item)
            lines.extend(pad + chunk for chunk in chunks)
            continue
        lines.append(f"{indent}{row.item:<{key_width}}  {chunks[0]}".rstrip())
        lines.extend(pad + chunk for chunk in chunks[1:])
    return "\n".join(lines)


def doctor(file: TextIO | None = None) -> list[Row]:
    """Print what this machine and allocation have and what the workshop will use:
    Python, torch, GPUs, CPU cores, backends, launchers, the Slurm allocation, and the
    world size, backend and start method ``workshop.launch`` picks by default. Paths
    are shown from the current folder, with ``~`` for the home folder.

    Args:
        file: where to print; ``sys.stdout`` when omitted.

    Returns:
        The printed rows, as :class:`Row` tuples (section, item, value); in a
        notebook end the line with ``;`` so the cell shows only the table.

    Example:
        >>> rows = workshop.doctor()  # doctest: +SKIP
    """
    from .._version import __version__

    rows = collect_rows()
    title = f"workshop {__version__} doctor: what this machine has and what the "
    title += "workshop will use"
    out = sys.stdout if file is None else file
    print(title, "=" * min(len(title), WIDTH), format_rows(rows), sep="\n", file=out)
    return rows
