"""From a plan to a job that runs, and its figures read back beside the estimate.

:func:`write_job` writes ``plan.json`` and ``job.sbatch`` (``srun`` starts one
``torchrun`` per node, each rank runs :mod:`workshop.planner.job_train` and writes
``rank-<rank>.json``); :func:`job_figures` reads them back and
:func:`job_against_estimate` sets them beside the estimate. Submitting is the
cluster's business (``workshop.cluster.submit``, which this wing may not import)::

    job = write_job("tiny", Layout(dp=2, pp=2, precision="fp32"), "runs/plan",
                    nodes=2, gpus_per_node=0, ranks_per_node=2)
    run = workshop.cluster.submit(job.script, output_dir=job.folder)
    run.wait()
    print(job_against_estimate(job_figures(job)))
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checks import list_of
from .estimator import estimate
from .job_train import WARM_UP, shape_fields
from .layout import Layout, ModelShape, check_counts, model_shape

__all__ = [
    "PlannedJob",
    "job_against_estimate",
    "job_figures",
    "job_rows",
    "write_job",
]

_TIME = re.compile(r"(\d+-)?\d{1,2}(:\d{2}){0,2}|\d+")
_MEM = re.compile(r"\d+[KMGT]?")
#: Bytes of one Adam step counter: a 0-d fp32 tensor per parameter tensor, which the
#: estimate leaves out (``FORMULAS["optimizer"]``).
STEP_COUNTER = 4
#: Bytes of the 0-d fp32 ``total_weight`` the cross-entropy saves for its backward,
#: which the estimate's activations leave out.
LOSS_WEIGHT = 4


@dataclass(frozen=True)
class PlannedJob:
    """The files :func:`write_job` wrote, and the plan they run.

    Attributes:
        folder: where the script and plan are, and where the ranks write.
        script: the batch script (``job.sbatch``).
        plan: the plan file (``plan.json``).
        model, layout: what is trained, and how it is split.
        nodes, ranks_per_node, gpus_per_node: the job's size (0 GPUs: CPU ranks).
    """

    folder: Path
    script: Path
    plan: Path
    model: ModelShape
    layout: Layout
    nodes: int
    ranks_per_node: int
    gpus_per_node: int


def _refuse(name: str, value: Any, why: str) -> ValueError:
    return ValueError(f"write_job: {name}={value!r} {why}")


def _check(
    shape: ModelShape,
    layout: Layout,
    nodes: int,
    ranks_per_node: int,
    gpus_per_node: int,
    time: str,
    mem: str | None,
    backend: str,
) -> None:
    """Every reason the job could not run as planned, before anything is written."""
    if not isinstance(layout, Layout):
        raise _refuse("layout", layout, "is not a Layout; e.g. Layout(dp=2, tp=2)")
    if shape.kind != "transformer":
        raise _refuse(
            "model",
            shape.name,
            "is a module; the job trains the planner's transformer: plan one of "
            "MODELS such as 'tiny', or a ModelShape",
        )
    layout.check_fits(shape)
    for name, value, default in (
        ("sequence_parallel", layout.sequence_parallel, False),
        ("virtual_stages", layout.virtual_stages, 1),
        ("tp_overlap", layout.tp_overlap, False),
    ):
        if value != default:
            raise _refuse(
                f"layout.{name}",
                value,
                "is planned but not built by the job: it trains plain tensor "
                "parallelism and a one-chunk pipeline schedule; plan it with "
                f"{name}={default!r}",
            )
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int):
        raise _refuse(
            "gpus_per_node", gpus_per_node, "must be a whole number, 0 or more"
        )
    if gpus_per_node < 0:  # before ranks_per_node, which it gives by default
        raise _refuse("gpus_per_node", gpus_per_node, "must be 0 (CPU ranks) or more")
    check_counts("write_job", nodes=nodes, ranks_per_node=ranks_per_node)
    lay = layout
    # (refused when, argument, value, why), in the order they are checked.
    for bad, name, value, why in (
        (gpus_per_node and ranks_per_node != gpus_per_node, "ranks_per_node",
         ranks_per_node, f"but gpus_per_node={gpus_per_node}: NCCL needs one GPU per "
         "rank; leave ranks_per_node out, or set gpus_per_node=0 for CPU ranks"),
        (nodes * ranks_per_node != lay.world_size, "nodes", nodes,
         f"x {ranks_per_node} ranks per node = {nodes * ranks_per_node} ranks, but "
         f"the layout needs dp x tp x pp = {lay.dp} x {lay.tp} x {lay.pp} "
         f"= {lay.world_size}; change nodes, the ranks per node or the layout so "
         "that they agree"),
        (lay.zero not in (0, 3), "layout.zero", lay.zero, "is not run by the job: "
         "it builds DDP (0) or FSDP2's fully_shard (3); use zero=0 or zero=3"),
        (lay.pp > 1 and lay.zero == 3, "layout.zero", 3, f"with pp={lay.pp}: a "
         "pipeline schedule gathers and reduces FSDP's shards once a step, not once a "
         "micro-batch as the estimate counts; use zero=0 with pp > 1"),
        (lay.pp > 1 and lay.dp > 1 and lay.micro_batches > 1, "layout.micro_batches",
         lay.micro_batches, f"with pp={lay.pp} and dp={lay.dp}: DDP inside "
         "torch.distributed.pipelining fails after a step of several micro-batches "
         "(its reducer rebuilds its buckets from every micro-batch's backward); use "
         "micro_batches=1, or dp=1"),
        (lay.precision == "bf16" and lay.zero == 0, "layout.precision", "bf16",
         "with zero=0: PyTorch's DDP under bf16 autocast keeps fp32 parameters, not "
         "the 2 + 2 + 12 bytes the estimate counts; use precision='fp32', or zero=3 "
         "(FSDP2 with bf16 compute)"),
        (not isinstance(time, str) or not _TIME.fullmatch(time), "time", time,
         "is not a Slurm time; use 'MM', 'HH:MM:SS' or 'D-HH:MM:SS'"),
        (mem is not None and (not isinstance(mem, str) or not _MEM.fullmatch(mem)),
         "mem", mem, "is not a Slurm memory size; use e.g. '8G' or '16000M'"),
        (backend not in ("auto", "gloo", "nccl"), "backend", backend,
         "is not one of 'auto', 'gloo', 'nccl'"),
        (backend == "nccl" and not gpus_per_node, "backend", "nccl",
         "with gpus_per_node=0: NCCL runs on GPUs; use 'gloo' (or 'auto') for CPU "
         "ranks"),
    ):  # fmt: skip
        if bad:
            raise _refuse(name, value, why)


def _environment() -> list[str]:
    """The lines that give the job this Python: its virtual environment, if any."""
    activate = Path(sys.prefix) / "bin" / "activate"
    if sys.prefix != sys.base_prefix and activate.is_file():
        return [
            "# shellcheck source=/dev/null",
            f"source {shlex.quote(str(activate))}",
        ]
    bindir = shlex.quote(str(Path(sys.executable).parent))
    return [f'export PATH={bindir}:"$PATH"']


def _script(job: PlannedJob, time: str, mem: str | None, cpus: int) -> str:
    lay, name = job.layout, f"plan-{job.model.name}"
    kind = f"{job.gpus_per_node} GPUs" if job.gpus_per_node else "CPU ranks"
    ranks = "GPU" if job.gpus_per_node else "CPU"
    folder = shlex.quote(str(job.folder))
    sbatch = [
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={job.nodes}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gpus-per-node={job.gpus_per_node}"] * bool(job.gpus_per_node)),
        f"#SBATCH --cpus-per-task={cpus}",
        f"#SBATCH --time={time}",
        f"#SBATCH --mem={mem}" if mem else "##SBATCH --mem=16G",
        f"#SBATCH --output={name}-%j.out",
        "##SBATCH --account=YOUR_ACCOUNT",
        "##SBATCH --partition=gpu",
    ]
    lines = [
        "#!/usr/bin/env bash",
        f"# job.sbatch: {job.model.name} split as {lay.describe()},",
        f"# on {job.nodes} nodes x {job.ranks_per_node} {ranks} ranks; written by "
        "workshop.planner.job.write_job.",
        "# srun starts one torchrun per node, torchrun the node's ranks; each builds "
        "the layout",
        "# (DeviceMesh, DTensor, DDP or FSDP2, torch.distributed.pipelining), trains "
        "a few Adam",
        "# steps, measures what it holds and sends; each writes rank-<rank>.json "
        "beside this.",
        "# NCCL on GPUs, gloo on CPUs: the same script.",
        "#",
        f"# Submit:             sbatch {shlex.quote(str(job.script))}",
        "# From a notebook:    workshop.cluster.submit(job.script, "
        "output_dir=job.folder)",
        "# Read it back:       job_against_estimate(job_figures(job))",
        "#",
        "# Edit for your site: the #SBATCH lines (account, partition, time, memory) "
        "and the line",
        "# that activates the Python environment. Keep nodes x ranks per node = "
        f"{lay.world_size},",
        f"# the layout's dp x tp x pp ({kind} per node); for another layout, "
        "write it again.",
        *sbatch,
        "",
        "set -euo pipefail",
        "",
        "# EDIT: the environment with torch and this package.",
        *_environment(),
        "",
        "# EDIT: where the plan is and the ranks write (on a cluster: a shared file "
        "system).",
        f"JOB_DIR={folder}",
        f"NPROC_PER_NODE={job.ranks_per_node}",
        "",
        "# The rendezvous runs on the first node, on a port derived from the job id, "
        "so two",
        "# jobs sharing a node do not collide.",
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        "MASTER_PORT=$((10000 + SLURM_JOB_ID % 20000))  # below the ephemeral ports",
        "",
        'echo "job ${SLURM_JOB_ID} (${SLURM_JOB_NAME}): ${SLURM_NNODES} nodes" \\',
        '    "(${SLURM_JOB_NODELIST}), ${NPROC_PER_NODE} ranks per node"',
        'echo "rendezvous at ${MASTER_ADDR}:${MASTER_PORT}; plan ${JOB_DIR}/plan.json"',
        "",
        "# Debugging hints: uncomment to see how NCCL connects, or to pin its network.",
        "# export NCCL_DEBUG=INFO",
        "# export NCCL_DEBUG_SUBSYS=INIT,NET",
        "# export NCCL_SOCKET_IFNAME=ib0",
        "# export TORCH_DISTRIBUTED_DEBUG=DETAIL",
        "",
        "# One torchrun per node, with all the task's CPUs (srun does not take "
        "--cpus-per-task",
        "# from sbatch since Slurm 22.05). --kill-on-bad-exit: when a node's torchrun "
        "fails,",
        "# stop the other nodes' too. --log-dir: each node's torchrun keeps its ranks'",
        "# error files (error.json) beside the job's, not in a torchelastic_* folder "
        "of",
        "# the node's /tmp that nothing removes.",
        'srun --nodes="$SLURM_NNODES" --ntasks="$SLURM_NNODES" --ntasks-per-node=1 \\',
        '    --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" --kill-on-bad-exit=1 \\',
        '    torchrun --nnodes="$SLURM_NNODES" --nproc-per-node="$NPROC_PER_NODE" \\',
        '    --rdzv-backend=c10d --rdzv-endpoint="${MASTER_ADDR}:${MASTER_PORT}" \\',
        '    --rdzv-id="$SLURM_JOB_ID" --log-dir="${JOB_DIR}/torchrun-logs" \\',
        '    -m workshop.planner.job_train --plan "${JOB_DIR}/plan.json"',
        "",
    ]
    return "\n".join(lines)


def write_job(
    model: str | ModelShape,
    layout: Layout,
    folder: str | Path,
    *,
    nodes: int,
    gpus_per_node: int,
    ranks_per_node: int | None = None,
    time: str = "00:10:00",
    mem: str | None = None,
    cpus_per_task: int | None = None,
    backend: str = "auto",
    steps: int = WARM_UP + 1,
    seed: int = 0,
    calibrate: bool = False,
) -> PlannedJob:
    """Write the batch script and plan file that train ``model`` split as ``layout``;
    ranks' figures from an earlier run are removed.

    Args:
        model: a transformer of ``MODELS`` ("tiny") or a ``ModelShape``.
        layout: zero 0 (DDP) or 3 (FSDP2), any tp, and pp with zero 0.
        folder: created if missing; the ranks write there too.
        nodes: ``--nodes``.
        gpus_per_node: ``--gpus-per-node``, one rank per GPU; 0 for CPU ranks.
        ranks_per_node: default ``gpus_per_node``.
        time: ``--time``, "HH:MM:SS", "D-HH:MM:SS" or minutes.
        mem: ``--mem`` ("8G"); by default the line is commented out.
        cpus_per_task: of the one task per node (default: one per rank).
        backend: "auto" (NCCL with GPUs, gloo without), "gloo" or "nccl".
        steps: Adam steps; the last is counted, after at least 2 of warm-up.
        seed: seeds the model and the data.
        calibrate: each rank measures its machine before its timed steps and
            writes the record beside its figures (for ``job_time_against_estimate``).

    Returns:
        The :class:`PlannedJob`: submit ``job.script``, then read :func:`job_figures`.

    Raises:
        ValueError: an argument or layout the job cannot run, or a folder that
            cannot be made; the message names the argument and what to do.

    Example:
        >>> job = write_job("tiny", Layout(dp=2, tp=2, precision="fp32"),
        ...                 "runs/plan", nodes=2, gpus_per_node=0,
        ...                 ranks_per_node=2)                   # doctest: +SKIP
        >>> job.script                                          # doctest: +SKIP
        PosixPath('runs/plan/job.sbatch')
    """
    shape = model_shape(model)
    if ranks_per_node is None:
        if not gpus_per_node:
            raise _refuse(
                "ranks_per_node",
                None,
                "with gpus_per_node=0: say how many CPU ranks each node runs, e.g. "
                "ranks_per_node=2",
            )
        ranks_per_node = gpus_per_node
    _check(shape, layout, nodes, ranks_per_node, gpus_per_node, time, mem, backend)
    check_counts("write_job", steps=steps)
    if steps <= WARM_UP:
        raise _refuse(
            "steps",
            steps,
            f"leaves no step to count: the first {WARM_UP} warm up (DDP rebuilds "
            f"its buckets, the pipeline infers its shapes); use steps={WARM_UP + 1} "
            "or more",
        )
    cpus = ranks_per_node if cpus_per_task is None else cpus_per_task
    check_counts("write_job", cpus_per_task=cpus)
    if isinstance(seed, bool) or not isinstance(seed, int):  # else every rank fails
        raise _refuse("seed", seed, "must be a whole number, e.g. seed=0")
    if not isinstance(calibrate, bool):  # 'no' would be read as True
        raise _refuse("calibrate", calibrate, "must be True or False")
    if isinstance(folder, bytes) or not isinstance(folder, (str, os.PathLike)):
        raise TypeError(
            f"write_job: folder must be a folder name, not {folder!r}; e.g. 'runs/plan'"
        )
    where = Path(folder).resolve()
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file in the way, or a folder that is not yours
        raise _refuse(
            "folder", str(folder), f"cannot be made ({exc.strerror}); pick another"
        ) from exc
    for old in where.glob("rank-*.json"):
        old.unlink()
    job = PlannedJob(
        where,
        where / "job.sbatch",
        where / "plan.json",
        shape,
        layout,
        nodes,
        ranks_per_node,
        gpus_per_node,
    )
    plan = {
        "model": shape_fields(shape),
        "layout": {k: getattr(layout, k) for k in layout.__dataclass_fields__},
        "steps": steps,
        "seed": seed,
        "calibrate": bool(calibrate),
        "backend": backend,
        "nodes": nodes,
        "ranks_per_node": ranks_per_node,
        "gpus_per_node": gpus_per_node,
    }
    job.plan.write_text(json.dumps(plan, indent=1) + "\n")
    job.script.write_text(_script(job, time, mem, cpus))
    return job


def job_figures(job: PlannedJob | str | Path) -> list[dict[str, Any]]:
    """What each rank of a finished job measured, rank 0 first.

    Args:
        job: the :class:`PlannedJob`, or its folder.

    Returns:
        One dict per rank (``rank``, ``stage``, ``held`` bytes, ``collectives`` of
        the last step as ``[calls, bytes]``, ``step_s``, ...).

    Raises:
        FileNotFoundError: some or all ranks' figures are missing.

    Example:
        >>> figures = job_figures("runs/plan")                   # doctest: +SKIP
        >>> figures[0]["held"]["params"]                         # doctest: +SKIP
        230528
    """
    if not isinstance(job, (PlannedJob, str, os.PathLike)):
        raise TypeError(
            f"job must be the PlannedJob write_job returned or its folder, not "
            f"{job!r}; e.g. job_figures(job) or job_figures('runs/plan')"
        )
    folder = job.folder if isinstance(job, PlannedJob) else Path(job)
    files = sorted(folder.glob("rank-*.json"), key=lambda p: int(p.stem[5:]))
    if not files:
        raise FileNotFoundError(
            f"no rank-*.json in {folder}: the job has not run there yet, or failed "
            "before its ranks wrote; wait for it (job.wait()) and read its output "
            "(job.output())"
        )
    try:  # a file cut short (a rank killed mid-write), said as such
        figures = [json.loads(p.read_text()) for p in files]
    except ValueError as e:
        why = f"{folder} holds a rank-*.json that is not JSON ({e})"
        raise ValueError(f"{why}; run the job again (job.output() says why)") from e
    _check_figures(figures, "job_figures")
    world = figures[0]["world_size"]
    missing = sorted(set(range(world)) - {f["rank"] for f in figures})
    if missing:
        raise FileNotFoundError(
            f"{folder} has the figures of {len(figures)} of {world} ranks; ranks "
            f"{missing} wrote none: the job failed or is still running; read its "
            "output (job.output())"
        )
    return figures


def _check_figures(figures: Any, who: str) -> None:
    # What job_rows and job_against_estimate read of each rank's figures.
    keys = ("rank", "world_size", "stage", "node", "model", "layout", "held")
    fix, what = "e.g. figures = job_figures(job)", "the ranks' figures (dicts)"
    list_of(f"{who}: figures", figures, dict, what, fix, empty=False, keys=keys)


def _estimate(first: dict[str, Any], stage: int, ranks_per_node: int):
    shape = ModelShape(**first["model"])
    return estimate(
        shape, Layout(**first["layout"]), gpus_per_node=ranks_per_node, stage=stage
    )


def job_rows(figures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The measured figures beside the estimate's, one row per rank and term.

    ``explained`` is the gap a known cause gives (:data:`STEP_COUNTER`,
    :data:`LOSS_WEIGHT`); receives are not compared (the estimate counts sends).

    Returns:
        ``[{"rank", "stage", "term", "estimate", "measured", "explained"}, ...]``;
        memory in bytes, collectives as ``[calls, bytes]``, None where one side has
        no figure.
    """
    _check_figures(figures, "job_rows")
    first = figures[0]
    per_node = sum(1 for f in figures if f["node"] == first["node"]) or 1
    rows: list[dict[str, Any]] = []
    for fig in figures:
        est = _estimate(first, fig["stage"], per_node)
        for term, key in (
            ("parameters", "params"),
            ("gradients", "grads"),
            ("optimizer", "optimizer"),
            ("activations", "activations"),
        ):
            counters = STEP_COUNTER * fig["parameter_tensors"]
            rows.append(
                {
                    "rank": fig["rank"],
                    "stage": fig["stage"],
                    "term": term,
                    "estimate": int(est.memory[term]),
                    "measured": fig["held"].get(key),
                    "explained": {
                        "optimizer": counters,
                        "activations": LOSS_WEIGHT,
                    }.get(term, 0),
                }
            )
        measured = {k: v for k, v in fig["collectives"].items() if k != "recv pp"}
        for key in sorted(set(est.collectives) | set(measured)):
            guess = est.collectives.get(key)
            rows.append(
                {
                    "rank": fig["rank"],
                    "stage": fig["stage"],
                    "term": key,
                    "estimate": None if guess is None else [guess[0], int(guess[1])],
                    "measured": measured.get(key),
                    "explained": 0,
                }
            )
    return rows


def _ranks(ranks: list[int]) -> str:
    return (
        f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
    )


def job_against_estimate(figures: list[dict[str, Any]]) -> str:
    """The job's measured memory and collectives beside the estimate, in 88
    columns; ranks that measured the same are shown together.

    Raises:
        ValueError: no figures.

    Example:
        >>> print(job_against_estimate(job_figures(job)))        # doctest: +SKIP
    """
    _check_figures(figures, "job_against_estimate")
    first, rows = figures[0], job_rows(figures)
    lay = Layout(**first["layout"])
    nodes = 1 + max(f["node"] for f in figures)
    device = first["device"].split(":")[0]
    lines = [
        f"{first['model']['name']}, {lay.describe()}: {len(figures)} {device} ranks "
        f"on {nodes} node{'s' * (nodes > 1)}, {first['backend']}, last of "
        f"{first['steps']} steps",
    ]
    groups: dict[str, list[int]] = {}
    for fig in figures:
        mine = [(r["term"], r["estimate"], r["measured"]) for r in rows
                if r["rank"] == fig["rank"]]  # fmt: skip
        groups.setdefault(json.dumps([fig["stage"], mine]), []).append(fig["rank"])
    for ranks in groups.values():
        fig = figures[ranks[0]]
        where = f"stage {fig['stage']} of {lay.pp}; " if lay.pp > 1 else ""
        lines.append(f"{_ranks(ranks)}: {where}{fig['how']}")
        lines.append(
            f"  {'memory (bytes)':<20}{'estimate':>13}{'measured':>13}"
            f"{'meas/est':>10}  difference"
        )
        mine = [r for r in rows if r["rank"] == ranks[0]]
        for r in mine[:4]:
            guess, seen = r["estimate"], r["measured"]
            if seen is None:
                lines.append(
                    f"  {r['term']:<20}{guess:>13,}{'-':>13}{'':>10}  "
                    "not measured in a pipeline"
                )
                continue
            gap = seen - guess
            why = "none" if gap == 0 else f"{gap:+,} B"
            if gap and gap == r["explained"] and r["term"] == "optimizer":
                why += f" = {fig['parameter_tensors']} step counters"
            elif gap and gap == r["explained"]:
                why += " = loss's total_weight"
            elif gap:
                why += ": unexplained"
            ratio = f"{seen / guess:.4f}" if guess else "-"
            lines.append(f"  {r['term']:<20}{guess:>13,}{seen:>13,}{ratio:>10}  {why}")
        lines.append(f"  {'collectives / step':<20}{'estimate':>18}{'measured':>18}")
        for r in mine[4:]:
            guess, seen = r["estimate"], r["measured"]
            shown = [
                "-" if v is None else f"{v[0]} x, {v[1]:,} B" for v in (guess, seen)
            ]
            same = "same" if guess == seen else "DIFFERENT"
            lines.append(f"  {r['term']:<20}{shown[0]:>18}{shown[1]:>18}  {same}")
    if lay.zero == 0 and lay.dp > 1:
        replicas: dict[tuple, set] = {}
        for fig in figures:
            c = fig["coordinates"]
            replicas.setdefault((c["pp"], c["tp"]), set()).add(
                round(fig["checksum"], 6)
            )
        agree = all(len(v) == 1 for v in replicas.values())
        lines.append(
            "data-parallel replicas hold the same weights after the steps: "
            f"{'yes' if agree else 'NO'}"
        )
    return "\n".join(line[:88] for line in lines)
