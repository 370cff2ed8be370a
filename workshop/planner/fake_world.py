"""One rank of a 1,024-GPU layout, on this machine: PyTorch's fake process group.

PyTorch's "fake" backend lets a process join a world of any size as rank ``r``, its
collectives returning at once, so the real ``DeviceMesh``, DTensor and FSDP2 cut a
model as on 1,024 GPUs and what one rank holds and sends can be set beside the
estimator (:func:`workshop.planner.fake_compare.compare`). Each call runs in a fresh
child, so the kernel never keeps a fake process group.

The fake backend still does work per rank: the mesh ~ ``world_size``, FSDP2's
sharding ~ ``dp`` per tensor, so a huge world is refused before it starts
(:func:`_least_seconds`). Measured on the 2-core development machine (torch 2.15,
CPU, one thread, a fresh process per row, meta device)::

    mesh, (1, W, 1)     W = 1,024  16,384  65,536  262,144  1,048,576
      seconds                0.07    0.60    2.03     9.17      81.2
      us per rank              67      37      31       35         77

    fully_shard, one 8B block (9 tensors), dp x tp
      dp x tp            1,024 x 1  8,192 x 1  65,536 x 1  1,024 x 8  8,192 x 8
      seconds             0.13-0.17  1.51-1.69   23.7-33.6  0.15-0.39  1.23-1.42
      us per tensor-rank    14-19      21-23      40-57      16-42      17-19

    start of the child (python, torch, workshop imported): 4.3-7.3 s

The issue's author measured 22.6 s for a 1,048,576-rank mesh and about 8 s per
8B block at 65,536 ranks: a machine about 4 times faster (:data:`SPEEDUP`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import traceback
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .._house import ROOT
from .._procs import die_with_parent, interrupted, signal_group
from ..checks import whole
from .fake_rank import MAX_BYTES, PHASE_MARK, run_job
from .fake_record import find_features, warm_up
from .layout import Layout, ModelShape, model_shape

__all__ = ["FakeReport", "fake_features", "fake_run", "fake_runs"]

_MARK = "FAKE-WORLD-REPORT "

# The least cost per unit measured here (the table above): a lower bound on this
# machine. Not the clock: the refusal's numbers come from these and the layout.
#: Seconds per rank of the world to build the DeviceMesh (31 us at 65,536 ranks).
MESH_SECONDS_PER_RANK = 31e-6
#: Seconds per parameter tensor per rank of its shard group in ``fully_shard``
#: (14 us: an 8B block of 9 tensors over dp=1,024 in 0.13 s).
SHARD_SECONDS_PER_TENSOR_RANK = 14e-6
#: The table's rows: (world size, seconds of the mesh) and (dp, seconds of one
#: 9-tensor 8B block). Time never falls as the world grows, so a measured row is a
#: lower bound for every bigger world.
MESH_MEASURED = ((1_024, 0.07), (16_384, 0.60), (65_536, 2.03), (262_144, 9.17))
MESH_MEASURED += ((1_048_576, 81.2),)
BLOCK_MEASURED = ((1_024, 0.13), (8_192, 1.51), (65_536, 23.7))
#: Seconds to start the child and import torch and the workshop (least seen: 4.3).
START_SECONDS = 4.0
#: How much faster than this machine the fastest one seen ran the same phases (the
#: issue's author: 22.6 s for the 1M mesh against 81 s here; 8 s per 8B block at
#: 65,536 ranks against 24-34 s here).
SPEEDUP = 4.0
#: Refuse only when even the fastest machine's time is this many times the timeout.
MARGIN = 2.0


@dataclass
class FakeReport:
    """What rank ``rank`` of a layout held and sent on the fake backend.

    ``held``: bytes after one step, each storage once. ``collectives``: ``{"all_gather
    dp": (count, bytes)}`` scaled to a whole step; ``measured``: the same for the one
    micro-batch that ran. Pipeline sends are counted from the split, not run.
    """

    model: str
    layout: str
    rank: int
    world_size: int
    coordinates: dict[str, int]
    stage_layers: tuple[int, int]
    wrapper: str
    held: dict[str, int]
    local_parameters: int
    shards: dict[str, tuple[list[int], list[int]]]
    collectives: dict[str, tuple[int, int]]
    measured: dict[str, tuple[int, int]]
    group_sizes: dict[str, int]
    comm_debug: dict[str, int]
    tokens: int
    layout_tokens: int
    layers_in_step: int
    times: dict[str, float]
    notes: list[str] = field(default_factory=list)
    torch_version: str = ""

    def table(self) -> str:
        """Held bytes and collectives per step, at most 88 columns."""
        first, stop = self.stage_layers
        where = ", ".join(f"{k} {v}" for k, v in self.coordinates.items())
        lines = [
            *textwrap.wrap(
                f"rank {self.rank} of {self.world_size} ({self.layout}; {where}); "
                f"{self.model} layers {first}..{stop - 1}; {self.wrapper}",
                88,
            ),
            f"{'held':<28}{'MB':>12}",
        ]
        for k, v in self.held.items():
            lines.append(f"  {k:<26}{v / 1e6:>12.3f}")
        lines.append(f"{'sent per step':<28}{'calls':>8}{'MB':>14}{'group':>7}")
        for k, (n, b) in self.collectives.items():
            size = self.group_sizes.get(k.split()[-1], "")
            lines.append(f"  {k:<26}{n:>8}{b / 1e6:>14.3f}{size:>7}")
        times = ", ".join(f"{k} {v:.2f}" for k, v in self.times.items())
        lines += textwrap.wrap(f"times (s): {times}", 88)
        for note in self.notes:
            lines += textwrap.wrap(f"note: {note}", 88, subsequent_indent="  ")
        return "\n".join(lines)


def fake_features() -> dict[str, str | None]:
    """Which pieces of the fake-world check this torch has, and where.

    Returns:
        The module each piece was found in, or None; and ``"missing"``: a sentence
        saying what is missing and what to do, or None.

    Example:
        >>> fake_features()["fully_shard"]
        'torch.distributed.fsdp'
    """
    found: dict[str, str | None] = dict(find_features())
    gone = [k for k, v in found.items() if v is None]
    found["missing"] = None
    if gone:
        import torch

        found["missing"] = (
            f"torch {torch.__version__} lacks {', '.join(gone)}: the fake-world check "
            "needs torch 2.4 or newer (pip install 'torch>=2.4'); the estimate alone "
            "still works"
        )
    return found


def _job(
    model: str | ModelShape,
    layout: Layout,
    rank: int,
    step: bool,
    batch_tokens: int | None,
    layers_in_step: int | None,
) -> dict[str, Any]:
    shape = model_shape(model)
    if not isinstance(layout, Layout):
        raise ValueError(
            f"layout={layout!r} is not a Layout; build one with Layout(dp=..)"
        )
    if shape.kind != "transformer":
        raise ValueError(
            f"fake_run builds transformers by their shapes; {shape.name} is a module "
            "(use a transformer ModelShape, or the estimate alone for modules)"
        )
    layout.check_fits(shape)
    # The estimator allows stages of different sizes; build_transformer builds each
    # stage with layers / (pp x v) blocks, so the fake world needs them to divide.
    v = layout.virtual_stages
    if shape.layers % (layout.pp * v):
        stages = f"pp={layout.pp}" + (f" x virtual_stages={v}" if v > 1 else "")
        raise ValueError(
            f"{stages} does not divide {shape.name}'s layers={shape.layers}: "
            "fake_run builds every stage with the same number of layers; choose "
            "stages that divide them"
        )
    stage = layout.coordinates(rank)["pp"]  # raises for a rank outside the world
    if layout.tp > 1 and layout.dp > 1 and layout.zero < 2:
        raise ValueError(
            f"zero={layout.zero} with tp={layout.tp} and dp={layout.dp}: PyTorch's DDP "
            "(and ZeroRedundancyOptimizer) take plain tensors, not the DTensor shards "
            "tensor parallelism makes; use zero=2 or 3 (FSDP2 shards DTensors), as "
            "torchtitan does for 2-D layouts"
        )
    need = _state_bytes(shape, layout, stage)
    if need > MAX_BYTES:
        raise ValueError(
            f"rank {rank} of {layout.describe()} would hold about {need / 1e9:.1f} GB "
            f"of {shape.name}'s parameters, gradients and Adam state: over this "
            f"check's {MAX_BYTES / 1e9:.1f} GB; shard more (dp with zero=3, tp, pp) "
            "or take a smaller model"
        )
    if batch_tokens is not None and (
        isinstance(batch_tokens, bool)
        or not isinstance(batch_tokens, int)
        or batch_tokens < 1
        or (batch_tokens > shape.seq and batch_tokens % shape.seq)
    ):
        raise ValueError(
            f"batch_tokens={batch_tokens!r}: give a whole number up to "
            f"seq={shape.seq}, or a multiple of it (whole sequences), e.g. 16 or "
            f"{2 * shape.seq}"
        )
    if layers_in_step is not None:
        whole("layers_in_step", layers_in_step, fix="or None for every layer")
    shape_fields = {
        f.name: getattr(shape, f.name)
        for f in fields(shape)
        if f.name not in ("builder", "sample")
    }
    return {
        "model": shape_fields,
        "layout": asdict(layout),
        "rank": rank,
        "step": bool(step),
        "batch_tokens": batch_tokens,
        "layers_in_step": layers_in_step,
    }


def _stage_tensors(shape: ModelShape, layout: Layout, stage: int) -> tuple[int, int]:
    """(parameter tensors per block, the root's tensors) of one pipeline stage."""
    block = 2 + 4 + (3 if shape.mlp == "swiglu" else 2)  # norms, q k v o, MLP
    first, last = stage == 0, stage == layout.pp - 1
    root = int(first) + (1 + int(not (shape.tied and first)) if last else 0)
    return block, root


def _least_seconds(shape: ModelShape, layout: Layout, stage: int) -> dict[str, float]:
    """The least time a run takes here, by phase, from the module's table."""
    block, root = _stage_tensors(shape, layout, stage)
    per_tensor = _least(
        SHARD_SECONDS_PER_TENSOR_RANK,
        [(n, s / 9) for n, s in BLOCK_MEASURED],
        layout.dp,
    )
    shards = layout.zero >= 2 and layout.dp > 1
    cost = {
        "mesh": _least(MESH_SECONDS_PER_RANK, MESH_MEASURED, layout.world_size),
        "blocks": shape.layers // layout.pp,
        "block": per_tensor * block if shards else 0.0,
        "root": per_tensor * root if shards else 0.0,
    }
    cost["total"] = cost["mesh"] + cost["blocks"] * cost["block"] + cost["root"]
    return cost


def _least(per_unit: float, measured: Any, size: int) -> float:
    """The per-unit bound, or the time measured at the biggest size not above."""
    return max(per_unit * size, max((s for n, s in measured if n <= size), default=0))


def _check_time(jobs: list[dict[str, Any]], timeout: float) -> None:
    """Refuse runs whose least time, on a machine :data:`SPEEDUP` times faster than
    this one, is still :data:`MARGIN` times the timeout."""
    costs = []
    for job in jobs:
        shape, layout = ModelShape(**job["model"]), Layout(**job["layout"])
        stage = layout.coordinates(job["rank"])["pp"]
        costs.append((shape, layout, _least_seconds(shape, layout, stage)))
    here = START_SECONDS + sum(c["total"] for _, _, c in costs)
    if (here - START_SECONDS) / SPEEDUP <= MARGIN * timeout:
        return  # only what grows with the world: a short timeout stops the start
    shape, layout, worst = max(costs, key=lambda c: c[2]["total"])
    parts = f"mesh {worst['mesh']:,.1f} s"
    if worst["block"]:
        parts += (
            f" + sharding {worst['blocks']} blocks x {worst['block']:,.2f} s"
            f" + root {worst['root']:,.2f} s"
        )
    runs = f"; {len(jobs)} runs, {here:,.0f} s in all" if len(jobs) > 1 else ""
    cause = (
        f"FSDP2 cuts each tensor into dp={layout.dp:,} shards"
        if worst["block"] * worst["blocks"] > worst["mesh"]
        else f"the DeviceMesh holds all {layout.world_size:,} ranks"
    )
    one = START_SECONDS + worst["total"]
    raise ValueError(
        f"fake_run: a world of {layout.world_size:,} ranks ({shape.name}, "
        f"{layout.describe()}) would take at least {one:,.0f}"
        f" s here (start {START_SECONDS:.0f} s + {parts}){runs}, and at least "
        f"{here / SPEEDUP:,.0f} s on a machine {SPEEDUP:.0f}x faster: more than "
        f"{MARGIN:.0f} x timeout={timeout:g} s. The time grows with the world, not "
        f"the model: {cause}. HINT: choose a smaller layout (fewer ranks: a smaller "
        f"dp), or raise timeout= to at least {here:,.0f}"
    )


def _state_bytes(shape: ModelShape, layout: Layout, stage: int) -> float:
    """About what one rank allocates: fp32 state of its stage, split by tp and ZeRO."""
    values = shape.layers // layout.pp * shape.layer_parameters()
    values += shape.vocab * shape.hidden * ((stage == 0) + (stage == layout.pp - 1))
    values /= layout.tp
    dp = layout.dp
    parts = (
        4 / (dp if layout.zero >= 2 else 1),
        4 / (dp if layout.zero >= 2 else 1),
        8 / (dp if layout.zero >= 1 else 1),
    )
    return values * sum(parts)


def fake_run(
    model: str | ModelShape,
    layout: Layout,
    rank: int = 0,
    step: bool = True,
    batch_tokens: int | None = None,
    layers_in_step: int | None = None,
    timeout: float = 120.0,
) -> FakeReport:
    """Run rank ``rank`` of ``layout`` on PyTorch's fake backend, in a child process.

    The rank builds its stage on the meta device, shards it with DTensor ("tp") and
    FSDP2 or DDP ("dp", by ``zero``), runs one micro-batch and an Adam step while
    recording every collective, and measures the bytes it holds.

    Args:
        model: a name of :data:`~workshop.planner.layout.MODELS` or a ModelShape.
        layout: the degrees, ZeRO stage and precision.
        rank: which rank to be, ``0 .. world_size - 1``.
        step: run the step and record collectives (else only the memory).
        batch_tokens: tokens in the micro-batch that runs (default 16); the report
            scales the traffic to the layout's ``micro_batch x seq``.
        layers_in_step: blocks the step runs (default: as many as fit in
            :data:`.fake_rank.STEP_BUDGET`); the per-block traffic is scaled to all.
        timeout: seconds before the child is stopped.

    Returns:
        A :class:`FakeReport`.

    Raises:
        ValueError: a rank outside the world, a layout the model cannot take, or a
            rank whose shards would not fit this machine (:data:`MAX_BYTES`).
        RuntimeError: this torch lacks a piece (see :func:`fake_features`), the
            child failed, or it ran past ``timeout``.
    """
    return fake_runs(
        [(model, layout, rank)],
        step=step,
        batch_tokens=batch_tokens,
        layers_in_step=layers_in_step,
        timeout=timeout,
    )[0]


def fake_runs(
    runs: list[tuple],
    step: bool = True,
    batch_tokens: int | None = None,
    layers_in_step: int | None = None,
    timeout: float = 300.0,
) -> list[FakeReport]:
    """Several runs in one child (its imports paid once, each run a fork). Each run
    is ``(model, layout, rank)`` or ``(model, layout, rank, {"layers_in_step": 1})``;
    other arguments as :func:`fake_run`.

    Raises:
        ValueError: as :func:`fake_run`, or a run that is not such a tuple.
    """
    jobs = []
    for run in runs:
        if (
            not isinstance(run, tuple)
            or len(run) not in (3, 4)
            or (len(run) == 4 and not isinstance(run[3], dict))
        ):
            raise ValueError(
                f"run {run!r}: give (model, layout, rank) or (model, "
                "layout, rank, {'layers_in_step': ...})"
            )
        own = {
            "step": step,
            "batch_tokens": batch_tokens,
            "layers_in_step": layers_in_step,
            **(run[3] if len(run) == 4 else {}),
        }
        unknown = set(own) - {"step", "batch_tokens", "layers_in_step"}
        if unknown:
            raise ValueError(
                f"run {run[:3]!r}: unknown options {sorted(unknown)}; use "
                "step, batch_tokens, layers_in_step"
            )
        jobs.append(_job(*run[:3], **own))
    _check_time(jobs, timeout)
    answers = _in_child(jobs, timeout)
    reports = []
    for answer in answers:
        if "error" in answer:
            kind = ValueError if answer["error"] == "ValueError" else RuntimeError
            raise kind(answer["message"])
        answer["stage_layers"] = tuple(answer["stage_layers"])
        for key in ("collectives", "measured"):
            answer[key] = {k: tuple(v) for k, v in answer[key].items()}
        answer["shards"] = {k: tuple(v) for k, v in answer["shards"].items()}
        reports.append(FakeReport(**answer))
    return reports


def _in_child(jobs: list[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), env.get("PYTHONPATH")])
    )
    env["WORKSHOP_FAKE_PARENT"] = str(os.getpid())
    env["WORKSHOP_FAKE_STARTED"] = repr(time.time())
    child = subprocess.Popen(
        [sys.executable, "-m", "workshop.planner.fake_world"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = child.communicate(json.dumps(jobs), timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(child, close=False)
        try:  # what the child said before it was stopped: where it got to
            _, err = child.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            err = ""
        _stop(child)
        raise RuntimeError(
            f"fake_run: the child (pid {child.pid}) ran past timeout={timeout:g} s "
            f"and was stopped, {_where(err or '', jobs)}"
        ) from None
    except KeyboardInterrupt:
        _stop(child)
        raise interrupted(
            f"fake_run: interrupted; stopped the child (pid {child.pid})"
        ) from None
    answers = [
        json.loads(line[len(_MARK) :])
        for line in out.splitlines()
        if line.startswith(_MARK)
    ]
    if child.returncode != 0 or len(answers) != len(jobs):
        tail = "\n".join(err.strip().splitlines()[-15:])
        raise RuntimeError(
            f"fake_run: the child (pid {child.pid}) ended with exit code "
            f"{child.returncode} after {len(answers)} of {len(jobs)} runs:\n{tail}"
        )
    return answers


def _where(err: str, jobs: list[dict[str, Any]]) -> str:
    """Where the stopped child had got to, and the advice that fits that phase."""
    said = [
        line[len(PHASE_MARK) :].split()
        for line in err.splitlines()
        if line.startswith(PHASE_MARK)
    ]
    if not said:
        return (
            f"still starting (python, torch and the workshop's imports: "
            f"{START_SECONDS:.0f} s or more here, longer on a busy machine). HINT: "
            f"give timeout={4 * START_SECONDS:.0f} or more"
        )
    number, phase = int(said[-1][0]), said[-1][1]
    job = jobs[number]
    layout = Layout(**job["layout"])
    run = f"in run {number + 1} of {len(jobs)} " if len(jobs) > 1 else ""
    more = "; or fewer runs per call" if len(jobs) > 1 else ""
    if phase == "mesh":
        return (
            f"{run}while building the DeviceMesh of {layout.world_size:,} ranks "
            f"(about {MESH_SECONDS_PER_RANK * 1e6:.0f} us per rank here). HINT: a "
            f"smaller world (pp x dp x tp), or a longer timeout{more}"
        )
    if phase == "shard":
        return (
            f"{run}while FSDP2 sharded each tensor into dp={layout.dp:,} chunks "
            f"(about {SHARD_SECONDS_PER_TENSOR_RANK * 1e6:.0f} us per tensor per rank "
            f"here). HINT: a smaller dp, or a longer timeout{more}"
        )
    if phase in ("step", "optimizer"):
        return (
            f"{run}in the {phase} (layers_in_step={job['layers_in_step']}, "
            f"batch_tokens={job['batch_tokens']}). HINT: a smaller layers_in_step "
            f"or batch_tokens, or step=False, or a longer timeout{more}"
        )
    return f"{run}in phase {phase!r}. HINT: a longer timeout{more}"


def _stop(child: subprocess.Popen, close: bool = True) -> None:
    """TERM, grace, KILL the child's group; ``close=False`` keeps its pipes to read."""
    signal_group(child.pid, signal.SIGTERM)
    try:
        child.wait(timeout=3)
    except subprocess.TimeoutExpired:
        signal_group(child.pid, signal.SIGKILL)
        child.wait()
    if not close:
        return
    for stream in (child.stdin, child.stdout, child.stderr):
        if stream is not None:
            stream.close()


def _main() -> None:
    """The child: each job in a fork, as PyTorch's group registry does not survive
    a second world in one process, and a fork costs ms where imports cost seconds."""
    parent = int(os.environ.get("WORKSHOP_FAKE_PARENT", "0"))
    if parent:
        die_with_parent(parent)
    started = float(os.environ.get("WORKSHOP_FAKE_STARTED", time.time()))
    jobs = json.loads(sys.stdin.read())
    warm_up()  # the imports, once, before the forks

    for number, job in enumerate(jobs):
        first = {"start": time.time() - started} if number == 0 else {}
        pid = os.fork()
        if pid == 0:
            die_with_parent(os.getppid())
            _run_one(job, first, number)
            sys.stdout.flush()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            message = f"run {number + 1} ended with wait status {status}"
            error = {"error": "RuntimeError", "message": message}
            print(_MARK + json.dumps(error), flush=True)


def _run_one(job: dict[str, Any], first: dict[str, float], number: int) -> None:
    start = time.perf_counter()
    try:
        answer = run_job(job, number)
        # The first run pays the child's start and imports (python, torch, the
        # workshop package): "start", from the parent's call to the first fork.
        answer["times"] = {
            **first,
            **answer["times"],
            "total": time.perf_counter() - start,
        }
    except ValueError as e:
        answer = {"error": "ValueError", "message": str(e)}
    except Exception as e:
        where = "".join(traceback.format_exception(e)[-6:])
        answer = {"error": type(e).__name__, "message": f"in the child:\n{where}"}
    print(_MARK + json.dumps(answer), flush=True)


if __name__ == "__main__":
    _main()
