"""The training a planned job runs: the layout of a plan file, built with PyTorch's own
pieces, trained a few Adam steps, measured, one JSON file per rank.

:func:`workshop.planner.job.write_job` writes the plan file and a batch script whose
``torchrun`` starts this module on every node::

    torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d \\
        --rdzv-endpoint=HOST:PORT -m workshop.planner.job_train --plan plan.json
    torchrun --standalone --nproc-per-node=4 -m workshop.planner.job_train \\
        --plan runs/job/plan.json                                 # one machine

Every rank builds a ``(pp, dp, tp)`` device mesh, DTensor tensor parallelism
(:func:`~workshop.planner.fake_rank.tensor_parallel`, the fake-backend check's split),
DDP or FSDP2 and ``torch.distributed.pipelining``; the last step's collectives are
counted by mesh dimension (:class:`~workshop.planner.fake_record.Collectives`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import socket
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._cli import read_with, writable_folder
from ..env import backend_name, rank_device
from ..features import fsdp2_fully_shard
from ..ranks.worker import process_group
from .fake_rank import tensor_parallel
from .fake_record import Collectives, group_names
from .layout import Layout, ModelShape, model_shape
from .measured import held_by, saved_bytes, token_loss
from .transformer import build_transformer

__all__ = ["read_plan", "shape_fields", "train_planned"]

#: Steps before the counted one: DDP reduces all gradients in one bucket in its first
#: step and rebuilds its buckets in the second; the pipeline infers its shapes in the
#: first. The last step is counted, as every later one would be.
WARM_UP = 2


def shape_fields(shape: ModelShape) -> dict[str, Any]:
    """A transformer's :class:`~workshop.planner.layout.ModelShape` as plain data, for
    a JSON file (``ModelShape(**fields)`` builds it again)."""
    return {
        f.name: getattr(shape, f.name)
        for f in dataclasses.fields(shape)
        if f.name not in ("builder", "sample")
    }


def read_plan(path: str | Path) -> dict[str, Any]:
    """The plan file :func:`~workshop.planner.job.write_job` wrote, its model and
    layout as records.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a file that is not a plan.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no plan file {path}; write one with workshop.planner.job.write_job"
        )
    try:
        plan = json.loads(path.read_text())
        model = plan["model"]
        plan["model"] = (
            model_shape(model) if isinstance(model, str) else ModelShape(**model)
        )
        plan.setdefault("seed", 0)
        plan.setdefault("steps", WARM_UP + 1)
        plan["layout"] = Layout(**plan["layout"])
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{path} is not a plan written by write_job ({type(exc).__name__}: "
            f"{exc}); write it again with workshop.planner.job.write_job"
        ) from None
    return plan


class _Sends(Collectives):
    """:class:`Collectives` with a pipeline's receives set apart from its sends: the
    estimate counts sends (a receive is the neighbour's send)."""

    def _record(self, func: Any, args: tuple, kwargs: dict) -> None:
        name = func._schema.name.split("::")[-1]
        if "recv" in name:
            self.calls["recv pp"][0] += 1
            return
        super()._record(func, args, kwargs)


def _build(shape: ModelShape, layout: Layout, mesh: Any, device: torch.device):
    """This rank's stage of the model, split as ``layout`` says; with what it is."""
    stage = mesh.get_local_rank("pp")
    model = build_transformer(shape, stage, layout.pp, device=device)
    model.apply(lambda m: m.reset_parameters() if hasattr(m, "reset_parameters") else 0)
    how = []
    if layout.tp > 1:
        tensor_parallel(model, mesh["tp"], shape.tied, [])
        how.append(f"DTensor tensor parallel over {layout.tp}")
    if layout.zero == 3 and layout.dp > 1:
        fully_shard, found = fsdp2_fully_shard()
        if fully_shard is None:
            raise RuntimeError(found)
        kwargs: dict[str, Any] = {"mesh": mesh["dp"]}
        if layout.precision == "bf16":
            from torch.distributed.fsdp import MixedPrecisionPolicy

            kwargs["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=torch.bfloat16, reduce_dtype=torch.float32
            )
        for block in model.blocks:
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
        how.append(f"FSDP2 fully_shard over {layout.dp}")
    elif layout.dp > 1:
        model = nn.parallel.DistributedDataParallel(
            model, process_group=mesh["dp"].get_group()
        )
        how.append(f"DDP over {layout.dp}")
    return model, stage, "; ".join(how) or "one rank, unsplit"


def _stepper(model: nn.Module, layout: Layout, stage: int, mesh: Any, device):
    """``step(tokens, targets)``: the pipeline's schedule, or gradient accumulation
    (DDP reduces in the last micro-batch only, as the estimate counts)."""
    if layout.pp > 1:
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        pipe = PipelineStage(
            model, stage, layout.pp, device, group=mesh["pp"].get_group()
        )
        schedule = ScheduleGPipe(pipe, layout.micro_batches, loss_fn=token_loss)

        def step(tokens: torch.Tensor, targets: torch.Tensor) -> None:
            if stage == 0:
                schedule.step(tokens)
            elif stage == layout.pp - 1:
                schedule.step(target=targets)
            else:
                schedule.step()

        return step

    def step(tokens: torch.Tensor, targets: torch.Tensor) -> None:
        pairs = list(
            zip(
                tokens.chunk(layout.micro_batches),
                targets.chunk(layout.micro_batches),
                strict=True,
            )
        )
        quiet = getattr(model, "no_sync", contextlib.nullcontext)
        for i, (x, y) in enumerate(pairs):
            with quiet() if i < len(pairs) - 1 else contextlib.nullcontext():
                (token_loss(model(x), y) / len(pairs)).backward()

    return step


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def train_planned(
    plan: dict[str, Any], out: Path, node_rank: int = 0
) -> dict[str, Any]:
    """Run in every rank of a process group: build, train and measure ``plan``'s
    layout; write ``out/rank-<rank>.json`` and return what it holds.

    Raises:
        ValueError: a world that is not the layout's ``dp x tp x pp``.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    shape, layout = plan["model"], plan["layout"]
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if world_size != layout.world_size:
        raise ValueError(
            f"this job has {world_size} ranks, the plan's layout {layout.world_size} "
            f"({layout.describe()}); write the job again with nodes x ranks per node "
            f"= {layout.world_size}"
        )
    device = rank_device()
    mesh = init_device_mesh(
        device.type,
        (layout.pp, layout.dp, layout.tp),
        mesh_dim_names=("pp", "dp", "tp"),
    )
    torch.manual_seed(plan["seed"])
    model, stage, how = _build(shape, layout, mesh, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = _stepper(model, layout, stage, mesh, device)
    # The same batch on every rank of a replica; the data-parallel ranks differ.
    g = torch.Generator().manual_seed(plan["seed"] + 1 + mesh.get_local_rank("dp"))
    batch = layout.micro_batch * layout.micro_batches
    tokens, targets = (
        torch.randint(0, shape.vocab, (batch, shape.seq), generator=g).to(device)
        for _ in range(2)
    )
    recorder = _Sends(group_names(mesh))
    calibration = None
    if plan.get("calibrate"):
        from .calibrating import calibrate_here

        # The machine as the steps will find it: every rank measures at once.
        per_micro_batch = layout.micro_batch * shape.seq  # tokens
        calibration = calibrate_here(shape, layout.precision, per_micro_batch)
        calibration = calibration.as_data()
    times, cpu = [], []
    for i in range(plan["steps"]):
        counted = i == plan["steps"] - 1
        start, cpu_start = time.perf_counter(), time.process_time()
        optimizer.zero_grad(set_to_none=False)
        if counted:
            with recorder.mode:
                step(tokens, targets)
                optimizer.step()
        else:
            step(tokens, targets)
            optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
    params = list(model.parameters())
    held = held_by(model, optimizer)
    # Activations of one micro-batch outside a pipeline (a schedule keeps several in
    # flight, which one forward pass does not show).
    if layout.pp == 1:
        x, y = tokens[: layout.micro_batch], targets[: layout.micro_batch]
        held["activations"] = saved_bytes(model, x, y)
    found = {
        "rank": rank,
        "world_size": world_size,
        "node": node_rank,
        "host": socket.gethostname(),
        "device": str(device),
        "backend": backend_name(dist.get_backend()),  # "nccl", not "cpu:gloo,cuda:nccl"
        "model": shape_fields(shape),
        "layout": dataclasses.asdict(layout),
        "stage": stage,
        "coordinates": layout.coordinates(rank),
        "how": how,
        "held": held,
        "parameter_tensors": len(params),
        # Equal on every data-parallel replica of a stage and tensor-parallel rank
        # when the gradients were reduced: the check that the replicas agree.
        "checksum": float(sum(_local(p).detach().double().sum() for p in params)),
        "collectives": recorder.snapshot(),
        "steps": plan["steps"],
        "step_s": times[WARM_UP:] or times,
        # The CPU time of this rank's process in each step: what other processes on
        # a busy machine do not stretch (a CPU calibration is timed the same way).
        "step_cpu_s": cpu[WARM_UP:] or cpu,
        "calibration": calibration,
        # The compute threads the step ran with, for a calibration's to match.
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{rank}.json").write_text(json.dumps(found, indent=1) + "\n")
    return found


def main(argv: list[str] | None = None) -> None:
    """``python -m workshop.planner.job_train --plan PLAN [--out DIR]``, in every
    rank that ``torchrun`` (or ``srun``) starts."""
    parser = argparse.ArgumentParser(
        prog="python -m workshop.planner.job_train",
        description=__doc__.splitlines()[0],
    )
    # Both read and checked here, in every rank, before the process group starts.
    parser.add_argument(
        "--plan",
        required=True,
        type=read_with(lambda path: (path, read_plan(path)), "the plan"),
        help="the plan file write_job wrote",
    )
    parser.add_argument(
        "--out",
        default=None,
        type=writable_folder("--out runs/job"),
        help="where each rank's JSON goes (default: beside the plan)",
    )
    args = parser.parse_args(argv)
    path, plan = args.plan
    out = Path(args.out) if args.out else Path(path).parent
    with process_group(plan.get("backend", "auto")) as info:
        found = train_planned(plan, out, info.node_rank)
        if info.rank == 0:
            print(
                f"rank 0 of {info.world_size}: {found['how']}, {found['backend']}; "
                "every rank wrote its rank-<rank>.json",
                flush=True,
            )


if __name__ == "__main__":
    main()
