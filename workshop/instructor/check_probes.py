"""Probes of the node check: what runs in a process of its own, so that this
check's state (CUDA, a fork server) can spoil nothing. Each prints one line,
``workshop-check-answer: {JSON}``::

    python -m workshop.instructor.check_probes launch fork 2 3  # path, size, repeats
    python -m workshop.instructor.check_probes after-backward 2  # world size
    python -m workshop.instructor.check_probes nccl 268435456 900  # bytes, timeout
    python -m workshop.instructor.check_probes notebook IN.ipynb OUT.ipynb 900

An answer with "error" says what went wrong in one line; the whole error is on stderr.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ANSWER = "workshop-check-answer: "


def _rank_sum() -> int:
    """What each rank of the launch step runs: an all-reduce of rank + 1."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([dist.get_rank() + 1])
    dist.all_reduce(value)
    return int(value.item())


def _nccl_rank(size_bytes: int) -> dict[str, Any]:
    """What each rank of the NCCL step runs: a checked sum, then one timed size."""
    import torch
    import torch.distributed as dist

    from ..bench.allreduce_worker import allreduce_sweep
    from ..ranks.worker import rank_device

    device = rank_device()
    value = torch.full((4,), float(dist.get_rank() + 1), device=device)
    dist.all_reduce(value)
    answer = {"device": str(device), "sum": value[0].item()}
    if dist.get_world_size() > 1:  # one GPU sends nothing: no bandwidth to measure
        sweep = allreduce_sweep([size_bytes], repeats=5, warmup=2, min_time=0.0)
        answer["busbw"] = sweep.busbw[0] if sweep.sizes else None
    return answer


def _probe_launch(method: str, world_size: str, repeats: str) -> dict[str, Any]:
    """Launch once, checked; then the launch benchmark's timing of later launches."""
    from ..bench.launch_bench import time_launch
    from ..ranks.launcher import launch

    n = int(world_size)
    t0 = time.perf_counter()
    result = launch(_rank_sum, world_size=n, start_method=method, show="none")
    first = time.perf_counter() - t0
    # Every spawn launch is a cold start; the fork paths' later launches are faster.
    timed = method != "spawn" and int(repeats) > 0
    later = time_launch(method, n, int(repeats)) if timed else None
    return {
        "took": result.start_method,
        "backend": result.backend,
        "sum_ok": result.returns == [n * (n + 1) // 2] * n,
        "first": first,
        "median": later.median if later else None,
    }


def _rank_backward() -> float:
    """What each rank of the after-backward probe runs: a backward pass on its
    device (its GPU under NCCL), then an all-reduce of the gradient's sum."""
    import torch
    import torch.distributed as dist

    from ..ranks.worker import rank_device

    weight = torch.ones(4, device=rank_device(), requires_grad=True)
    (weight * (dist.get_rank() + 1)).sum().backward()
    total = weight.grad.sum().reshape(1)
    dist.all_reduce(total)
    return float(total.item())


def _probe_after_backward(world_size: str) -> dict[str, Any]:
    """A kernel that trained before it launches, as notebook 02's does: one backward
    pass here, then ranks started with start_method="auto" that each run one."""
    import torch

    from ..ranks.forkable import HAZARDS, fork_hazard
    from ..ranks.launcher import launch

    weight = torch.ones(2, requires_grad=True)
    (weight * weight).sum().backward()  # on the CPU, as a learner's first step is
    hazard = fork_hazard()
    n = int(world_size)
    result = launch(_rank_backward, world_size=n, show="none")
    expected = 4.0 * n * (n + 1) / 2
    return {
        "took": result.start_method,
        "hazard": hazard,
        "reason": HAZARDS.get(hazard or "", "the kernel can still fork"),
        "backend": result.backend,
        "sum_ok": result.returns == [expected] * n,
    }


def _probe_nccl(size_bytes: str, timeout: str) -> dict[str, Any]:
    from ..env import visible_gpu_count
    from ..ranks.launcher import launch

    n = visible_gpu_count()
    result = launch(
        _nccl_rank,
        int(size_bytes),
        world_size=n,
        backend="nccl",
        show="none",
        timeout=0.9 * float(timeout),  # its own error, before the keeper's kill
    )
    return {"world_size": n, "ranks": result.returns}


def _probe_notebook(source: str, copy: str, timeout: str) -> dict[str, Any]:
    """Execute a notebook with this interpreter's kernel, going on past errors;
    write the executed copy and count the cells that raised."""
    import ipykernel.kernelspec
    import nbformat
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    class ThisPython(KernelSpecManager):  # not whatever "python3" names elsewhere
        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
            spec = ipykernel.kernelspec.get_kernel_dict()
            return KernelSpec(resource_dir=ipykernel.kernelspec.RESOURCES, **spec)

    notebook = nbformat.read(source, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=int(float(timeout)),
        allow_errors=True,
        km=KernelManager(kernel_spec_manager=ThisPython()),
        resources={"metadata": {"path": str(Path(source).parent)}},
    )
    try:
        client.execute()
    finally:
        nbformat.write(notebook, copy)
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        and "raises-exception" not in cell.metadata.get("tags", [])
        for output in cell.get("outputs", [])
        if output.output_type == "error"
    ]
    first = f"{errors[0].ename}: {errors[0].evalue}" if errors else None
    return {"cells": len(notebook.cells), "errors": len(errors), "first_error": first}


_PROBES: dict[str, Callable[..., dict[str, Any]]] = {
    "launch": _probe_launch,
    "after-backward": _probe_after_backward,
    "nccl": _probe_nccl,
    "notebook": _probe_notebook,
}


def _probe_main(argv: list[str]) -> int:
    """``PROBE ARG ...``: run one probe and print its answer; 1 if it raised."""
    try:
        answer, code = _PROBES[argv[0]](*argv[1:]), 0
    except Exception as exc:  # the answer says what went wrong, in one line
        first = str(exc).strip().splitlines()[:1] or [""]
        answer, code = {"error": f"{type(exc).__name__}: {first[0]}"}, 1
        print(exc, file=sys.stderr)
    print(ANSWER + json.dumps(answer), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(_probe_main(sys.argv[1:]))
