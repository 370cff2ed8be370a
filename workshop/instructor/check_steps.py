"""The steps of the node check (:mod:`workshop.instructor.check_node`), each
returning a :class:`~workshop.instructor.check_results.CheckStep`, and their probes,
each run in a fresh process (this one's CUDA state cannot spoil them) that prints
``workshop-check-answer: {JSON}``::

    python -m workshop.instructor.check_steps launch fork 2 3  # path, size, repeats
    python -m workshop.instructor.check_steps after-backward 2  # world size
    python -m workshop.instructor.check_steps nccl 268435456 900  # bytes, timeout
    python -m workshop.instructor.check_steps notebook IN.ipynb OUT.ipynb 900
    python -m workshop.instructor.check_steps compile  # a tiny model, inductor

An answer with "error" says what went wrong in one line (the whole error on stderr).
Every command runs under :func:`workshop.cluster.commands.run_command`'s keeper.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any, TextIO

from .._house import ROOT  # the clone: tests/ and notebooks/
from .check_compile import probe_compile
from .check_results import FAILED, PASS, SKIPPED, CheckStep, TrainSettings

START_PATHS = ("fork", "server", "spawn")
NCCL_BYTES = 256 * 2**20
_PIP_ALL = 'pip install -e ".[lab,test]"'
ANSWER = "workshop-check-answer: "


@dataclass
class Context:
    """What every step is given: the check's settings and where to print."""

    timeout: float
    gpus: int
    root: Path
    cpu_train: bool
    train: TrainSettings
    launch_repeats: int
    out: TextIO

    def say(self, text: str) -> None:
        """Print ``text`` indented under the step's heading."""
        for line in text.rstrip("\n").splitlines():
            print(f"      {line}", file=self.out, flush=True)


def _failed(name: str, summary: str, fix: str, figures: Any = None) -> CheckStep:
    return CheckStep(name, FAILED, summary=summary, fix=fix, figures=figures or {})


# ------------------------------------------------------------------ commands
@dataclass
class _Ran:
    code: int | None  # None: stopped at the timeout
    stdout: str
    stderr: str
    seconds: float


def _run(command: Sequence[str], timeout: float, cwd: Path | None = None) -> _Ran:
    """Run ``command`` with this clone importable; never raises on its failure."""
    from ..cluster.commands import CommandError, run_command

    env = {}
    if (ROOT / "pyproject.toml").is_file():  # a clone, perhaps not installed
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
        )
    try:
        done = run_command(
            list(command),
            env=env,
            cwd=cwd,
            timeout=max(1.0, timeout),
            check=False,
            show=False,
            grace=3.0,
        )
    except CommandError as exc:  # only raised at the timeout, with check=False
        late = exc.results[0]
        return _Ran(None, late.stdout, late.stderr, late.seconds)
    return _Ran(done.returncode, done.stdout, done.stderr, done.seconds)


def _probe(timeout: float, *args: object) -> dict[str, Any]:
    """Run one probe of this module: its answer, or ``{"error": ...}`` with "log",
    the end of its stderr."""
    probes = [sys.executable, "-m", "workshop.instructor.check_steps"]
    ran = _run([*probes, *map(str, args)], timeout)
    log = "\n".join(ran.stderr.strip().splitlines()[-15:])
    for line in reversed(ran.stdout.splitlines()):
        if line.startswith(ANSWER):
            answer = json.loads(line[len(ANSWER) :]) | {"seconds": ran.seconds}
            return answer | ({"log": log} if "error" in answer else {})
    timed_out = ran.code is None
    if timed_out:
        why = f"ran past {timeout:.0f} s and was stopped"
    else:
        why = f"exited with code {ran.code}: {log.splitlines()[-1] if log else ''}"
    return {"error": why, "timed_out": timed_out, "seconds": ran.seconds, "log": log}


# ------------------------------------------------------------------ the steps
def step_doctor(ctx: Context) -> CheckStep:
    """The doctor's table; FAILED where a probe broke or torch misses a GPU."""
    from ..machine.doctor import doctor

    table = io.StringIO()
    rows = doctor(file=table)
    print(table.getvalue().rstrip("\n"), file=ctx.out, flush=True)
    found = {(r.section, r.item): r.value for r in rows}
    torch_version = found.get(("PyTorch", "torch"), "not found").split(" (")[0]
    backend = found.get(("Workshop defaults", "backend"), "?").split(" (")[0]
    figures = {"rows": [list(r) for r in rows], "gpus": ctx.gpus}
    errors = [f"{r.section}: {r.value}" for r in rows if r.item == "error"]
    if errors:
        fix = "run `python -m workshop doctor` and read its error rows"
        return _failed("doctor", f"a probe failed: {errors[0]}", fix, figures)
    note = found.get(("GPUs", "note"))
    if note and ctx.gpus == 0:  # nvidia-smi lists GPUs that torch cannot use
        fix = (
            "use the site's CUDA build of torch (module load ...); check "
            "CUDA_VISIBLE_DEVICES and the allocation's --gpus"
        )
        return _failed("doctor", note, fix, figures)
    summary = f"torch {torch_version}, {ctx.gpus} GPUs visible, backend {backend}"
    return CheckStep("doctor", PASS, summary=summary, figures=figures)


def parse_pytest_counts(output: str) -> dict[str, int]:
    """The counts of pytest's last summary line.

    Example:
        >>> parse_pytest_counts("1 failed, 8 passed, 595 deselected in 1.59s")
        {'failed': 1, 'passed': 8, 'deselected': 595}
    """
    plural = {"error": "errors", "warning": "warnings"}
    for line in reversed(output.splitlines()):
        if re.search(r"\bin [\d.]+s\b", line):
            pairs = re.findall(r"(\d+) ([a-z]+)", line)
            return {plural.get(word, word): int(n) for n, word in pairs}
    return {}


def step_gpu_tests(ctx: Context) -> CheckStep:
    """``python -m pytest -q -m gpu tests/``; SKIPPED where no GPU is visible."""
    name = "gpu-tests"
    if find_spec("pytest") is None:
        fix = f"pip install pytest pytest-timeout (or {_PIP_ALL})"
        return _failed(name, "pytest is missing in this environment", fix)
    if not (ctx.root / "tests").is_dir():
        fix = "run the check from a clone of the workshop (pip install -e .)"
        return _failed(name, f"no tests/ folder in {ctx.root}", fix)
    if ctx.gpus == 0:
        # Each of them would skip: collecting the suite to say so costs 10 to 15 s.
        why = "no GPU visible (the tests marked gpu need one; not run)"
        return CheckStep(name, SKIPPED, summary=why)
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/"]
    ran = _run(command, ctx.timeout, cwd=ctx.root)
    counts = parse_pytest_counts(ran.stdout)
    ctx.say((ran.stdout.strip().splitlines() or [""])[-1])
    rerun = "python -m pytest -m gpu tests/ -x -v"
    if ran.code is None:
        summary = f"the GPU tests ran past {ctx.timeout:.0f} s"
        return _failed(name, summary, f"a test hangs: `{rerun}` shows which", counts)
    bad = counts.get("failed", 0) + counts.get("errors", 0)
    if ran.code != 0 or bad:
        first = [ln[7:] for ln in ran.stdout.splitlines() if ln.startswith("FAILED ")]
        what = f"{bad} GPU tests failed" if bad else f"pytest exited with {ran.code}"
        what += f": {first[0]}" if first else ""
        return _failed(name, what, f"run `{rerun}`; read the first failure", counts)
    passed, skipped = counts.get("passed", 0), counts.get("skipped", 0)
    extra = f", {skipped} skipped (they need more GPUs)" if skipped else ""
    return CheckStep(name, PASS, summary=f"{passed} passed{extra}", figures=counts)


def step_launch(ctx: Context) -> CheckStep:
    """Two ranks from each start path, each from a fresh process."""
    deadline = time.monotonic() + ctx.timeout
    paths, problems, parts = [], [], []
    for method in START_PATHS:
        left = deadline - time.monotonic()
        answer = _probe(left, "launch", method, 2, ctx.launch_repeats)
        paths.append(answer | {"asked": method})
        if "error" in answer:
            problems.append(f"start_method={method!r} failed: {answer['error']}")
            ctx.say(f"{method:<7} FAILED: {answer['error']}\n{answer['log']}")
            continue
        took, first, warm = answer["took"], answer["first"], answer["median"]
        if took != method:
            problems.append(f"start_method={method!r} ran on {took}")
        if not answer["sum_ok"]:
            problems.append(f"start_method={method!r}: the ranks' sum was wrong")
        then = f", then {warm:.2f} s (median)" if warm else ""
        ctx.say(f"{method:<7} took {took:<7} first launch {first:.2f} s{then}")
        if warm and method == "server":  # its first launch starts the server
            parts.append(f"{took} {warm:.2f} s (first {first:.1f} s)")
        else:
            parts.append(f"{took} {warm or first:.2f} s")
    after = _after_backward(ctx, deadline, problems)
    figures = {"world_size": 2, "paths": paths, "after_backward": after}
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        bench = "python -m workshop.bench launch --world-size 2 --no-torchrun "
        bench += "--in-a-row 0"  # its start paths: fork, server, spawn
        fix = f"see the whole error: `{bench}`"
        if any(path.get("timed_out") for path in paths):
            fix = f"a launch hung or was slow: pass a longer --timeout, or {fix}"
        return _failed("launch", problems[0] + more, fix, figures)
    return CheckStep("launch", PASS, summary=", ".join(parts), figures=figures)


def _after_backward(
    ctx: Context, deadline: float, problems: list[str]
) -> dict[str, Any]:
    """A launch after a backward pass in the kernel, as a learner's: on a GPU
    machine it must not fork (fork_hazard), and the ranks' sums must be right."""
    world_size = ctx.gpus or 2
    answer = _probe(deadline - time.monotonic(), "after-backward", world_size)
    if "error" in answer:
        problems.append(f"a launch after a backward pass failed: {answer['error']}")
        ctx.say(f"after a backward pass: FAILED: {answer['error']}\n{answer['log']}")
        return answer
    took, reason = answer["took"], answer["reason"]
    ctx.say(f"after a backward pass: {took} ({reason})")
    if answer["hazard"] is not None and took == "fork":
        problems.append("a launch after a backward pass forked a kernel that cannot")
    elif not answer["sum_ok"]:
        problems.append("the ranks' backward passes after the kernel's gave wrong sums")
    return answer


def step_nccl(ctx: Context) -> CheckStep:
    """An NCCL all-reduce on every visible GPU, checked, and its bus bandwidth."""
    if ctx.gpus == 0:
        return CheckStep("nccl", SKIPPED, summary="no GPU visible")
    answer = _probe(ctx.timeout, "nccl", NCCL_BYTES, ctx.timeout)
    fix = "check `nvidia-smi topo -m`; rerun with NCCL_DEBUG=INFO set to see why"
    if "error" in answer:
        ctx.say(f"{answer['error']}\n{answer['log']}")
        return _failed(
            "nccl", f"NCCL all_reduce failed: {answer['error']}", fix, answer
        )
    n, ranks = answer["world_size"], answer["ranks"]
    expected = n * (n + 1) / 2
    if any(r["sum"] != expected for r in ranks):
        sums = [r["sum"] for r in ranks]
        what = f"NCCL all_reduce gave {sums}, expected {expected:g} on each GPU"
        return _failed("nccl", what, fix, answer)
    busbw = ranks[0].get("busbw")
    if busbw:
        speed = f"busbw {busbw / 1e9:.1f} GB/s at 256 MiB"
    else:  # one GPU sends nothing; or 256 MiB did not fit beside what was there
        speed = "no busbw (1 GPU)" if n == 1 else "no busbw (256 MiB did not fit)"
    ctx.say(f"{n} ranks on {', '.join(r['device'] for r in ranks)}: {speed}")
    summary = f"{n} GPU{'s' if n > 1 else ''}, sum correct, {speed}"
    return CheckStep("nccl", PASS, summary=summary, figures=answer)


def step_compile(ctx: Context) -> CheckStep:
    """torch.compile of a tiny model in a fresh process (``check_compile.py``)."""
    answer = _probe(ctx.timeout, "compile")
    if "error" in answer and "ok" not in answer:  # the probe itself died
        ctx.say(f"FAILED: {answer['error']}\n{answer['log']}")
        fix = "see the whole error: python -m workshop.instructor.check_steps compile"
        return _failed("compile", f"the probe {answer['error']}", fix, answer)
    if not answer["ok"]:
        ctx.say(f"{answer['missing']}\n({answer['error']})")
        return _failed("compile", answer["missing"], answer["fix"], answer)
    first, second = answer["first_seconds"], answer["second_seconds"]
    summary = (
        f"inductor on {answer['device']}: warm-up {first:.1f} s (first call), then "
        f"{second * 1e3:.1f} ms"
    )
    ctx.say(summary)
    return CheckStep("compile", PASS, summary=summary, figures=answer)


def step_train(ctx: Context) -> CheckStep:
    """``python -m workshop.bench train``, with and without ``--bare``."""
    if ctx.gpus == 0 and not ctx.cpu_train:
        why = "ResNet-50 on a CPU says nothing about the node (--cpu-train)"
        return CheckStep("train", SKIPPED, summary=why)
    deadline = time.monotonic() + ctx.timeout
    rates: dict[str, float] = {}
    bench = [sys.executable, "-m", "workshop.bench", "train", *ctx.train.args()]
    with tempfile.TemporaryDirectory(prefix="workshop-check-") as tmp:
        for loop, extra in (("workshop", []), ("bare", ["--bare"])):
            out = Path(tmp, f"{loop}.json")
            command = [*bench, *extra, "--json", str(out)]
            ran = _run(command, deadline - time.monotonic(), ctx.root)
            ctx.say(ran.stdout.strip() or ran.stderr.strip()[-400:])
            if ran.code != 0 or not out.exists():
                why = "ran past the timeout" if ran.code is None else "failed"
                fix = "run it alone: python -m workshop.bench train " + " ".join(
                    ctx.train.args() + extra
                )
                summary = f"the benchmark of the {loop} loop {why}"
                return _failed("train", summary, fix, {"samples_per_second": rates})
            rates[loop] = json.loads(out.read_text())["samples_per_second"]
    ratio = rates["workshop"] / rates["bare"] if rates["bare"] > 0 else None
    summary = (
        f"{ctx.train.model} samples/s: workshop {rates['workshop']:,.0f}, plain "
        f"{rates['bare']:,.0f}" + (f", ratio {ratio:.2f}" if ratio is not None else "")
    )
    figures = {"samples_per_second": rates, "ratio": ratio, **asdict(ctx.train)}
    return CheckStep("train", PASS, summary=summary, figures=figures)


def step_notebooks(ctx: Context) -> CheckStep:
    """Every notebook executed into a temporary folder, its error cells counted."""
    missing = [m for m in ("nbformat", "nbclient", "ipykernel") if not find_spec(m)]
    if missing:
        fix = f"pip install {' '.join(missing)} (or {_PIP_ALL})"
        return _failed("notebooks", f"{', '.join(missing)} missing", fix)
    notebooks = sorted((ctx.root / "notebooks").glob("*.ipynb"))
    if not notebooks:
        fix = "run the check from a clone of the workshop"
        return _failed("notebooks", f"no notebooks in {ctx.root / 'notebooks'}", fix)
    folder = Path(tempfile.mkdtemp(prefix="workshop-check-notebooks-"))
    runs, problems = [], []
    for notebook in notebooks:
        copy = folder / notebook.name
        answer = _probe(ctx.timeout, "notebook", notebook, copy, ctx.timeout)
        runs.append(answer | {"notebook": notebook.name, "copy": str(copy)})
        if "error" in answer:
            problems.append(f"{notebook.name} {answer['error']}")
            found = f"{answer['error']}\n{answer['log']}"
        else:
            found = f"{answer['errors']} error cells of {answer['cells']}"
            if answer["errors"]:
                problems.append(
                    f"{notebook.name}: {answer['errors']} error cells "
                    f"(first: {answer['first_error']})"
                )
        ctx.say(f"{notebook.name:<36} {answer['seconds']:6.1f} s  {found}")
    figures = {"folder": str(folder), "notebooks": runs}
    if problems:
        # Kept for reading; with every notebook clean there is nothing to read.
        ctx.say(f"executed copies in {folder}")
        fix = (
            f"open the executed copy in {folder} and read the first error "
            f"(a slow notebook: --timeout {2 * ctx.timeout:.0f}); then remove the "
            "folder"
        )
        return _failed("notebooks", problems[0], fix, figures)
    shutil.rmtree(folder, ignore_errors=True)
    figures = {"notebooks": [{k: v for k, v in r.items() if k != "copy"} for r in runs]}
    times = ", ".join(f"{r['notebook'][:2]} {r['seconds']:.0f} s" for r in runs)
    summary = f"{len(runs)} notebooks, no error cells ({times})"
    return CheckStep("notebooks", PASS, summary=summary, figures=figures)


STEP_FUNCTIONS: dict[str, Callable[[Context], CheckStep]] = {
    "doctor": step_doctor,
    "gpu-tests": step_gpu_tests,
    "launch": step_launch,
    "nccl": step_nccl,
    "compile": step_compile,
    "train": step_train,
    "notebooks": step_notebooks,
}


# ------------------------------------------------------------------ the probes
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
    from ..env import rank_device

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
    """Each rank of the after-backward probe: a backward pass, its sum all-reduced."""
    import torch
    import torch.distributed as dist

    from ..env import rank_device

    weight = torch.ones(4, device=rank_device(), requires_grad=True)
    (weight * (dist.get_rank() + 1)).sum().backward()
    total = weight.grad.sum().reshape(1)
    dist.all_reduce(total)
    return float(total.item())


def _probe_after_backward(world_size: str) -> dict[str, Any]:
    """A kernel that trained before it launches (notebook 02's): one backward pass,
    then ranks from start_method="auto"."""
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
    """Execute a notebook with this interpreter's kernel, past errors; write the
    copy and count the cells that raised."""
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
    # The kernel's connection file beside the copy: a KernelManager given none makes
    # one in /tmp (tempfile.mkstemp). And nbclient shuts down only a kernel manager
    # it made itself, so this one is shut down here, which removes that file.
    connection = Path(copy).with_name(f".{Path(copy).stem}-kernel.json")
    km = KernelManager(
        kernel_spec_manager=ThisPython(), connection_file=str(connection)
    )
    client = NotebookClient(
        notebook,
        timeout=int(float(timeout)),
        allow_errors=True,
        km=km,
        resources={"metadata": {"path": str(Path(source).parent)}},
    )
    try:
        client.execute()
    finally:
        try:
            if km.has_kernel:
                km.shutdown_kernel(now=True)
        finally:
            connection.unlink(missing_ok=True)
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
    "compile": probe_compile,
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
