"""The instructor's node check, run on the reserved GPU node the day before class::

    python -m workshop check-node              # every step; a few minutes on a GPU node
    python -m workshop check-node --quick      # without the notebooks and ResNet-50
    make check-node CHECK_ARGS=--quick    # the same, with .venv's python if any

Run it in the environment the class will use. Seven steps (doctor, gpu-tests,
launch, nccl, compile, train, notebooks: ``check_steps.py``), each timed, each PASS,
FAILED or SKIPPED with the reason; then a one-screen verdict: READY, or each problem
with its fix.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import textwrap
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from .._cli import above_zero, whole_number, writable_file
from .._house import ROOT, WIDTH
from .._procs import interrupted
from ..checks import positive_number
from ..env import visible_gpu_count
from ..training.models import RESNETS, smallest_image
from .check_results import SKIPPED, STEPS, CheckReport, CheckStep, TrainSettings
from .check_steps import STEP_FUNCTIONS, Context

__all__ = ["check_node"]

QUICK_SKIPS = ("train", "notebooks")
DEFAULT_TIMEOUT = 900.0


# ------------------------------------------------------------------ the verdict
def steps_to_run(skip: Iterable[str] = (), quick: bool = False) -> dict[str, str]:
    """Which steps are left out, and why.

    Args:
        skip: step names given with ``--skip``.
        quick: ``--quick``: leave out the notebooks and the training benchmark.

    Returns:
        {step: "--skip" or "--quick"} for every step left out, in step order.

    Raises:
        ValueError: an unknown step name.

    Example:
        >>> steps_to_run(["nccl"], quick=True)
        {'nccl': '--skip', 'train': '--quick', 'notebooks': '--quick'}
    """
    skip = list(skip)
    unknown = [s for s in skip if s not in STEPS]
    if unknown:
        raise ValueError(
            f"unknown step {unknown[0]!r} to skip; the steps are " + ", ".join(STEPS)
        )
    reasons = {s: "--quick" for s in QUICK_SKIPS if quick}
    reasons.update({s: "--skip" for s in skip})
    return {s: reasons[s] for s in STEPS if s in reasons}


def _clip(text: str, width: int, lines: int = 1) -> list[str]:
    """``text`` wrapped to ``width``, at most ``lines`` lines (" ..." if cut)."""
    wrapped = textwrap.wrap(text, width, break_on_hyphens=False) or [""]
    if len(wrapped) > lines:
        wrapped = wrapped[:lines]
        wrapped[-1] = wrapped[-1][: width - 4].rstrip() + " ..."
    return wrapped


def format_verdict(report: CheckReport, width: int = WIDTH) -> str:
    """The one-screen verdict: a line per step, then READY or what to fix.

    Args:
        report: the steps' results.
        width: longest line.

    Returns:
        The verdict: at most ``width`` columns and 27 lines.

    Example:
        >>> steps = [CheckStep("doctor", "PASS", 1.0, "torch 2.6")]
        >>> print(format_verdict(CheckReport("gpu01", steps)).splitlines()[-1])
        READY: nothing failed.
    """
    failed = report.failed
    state = f"NOT READY ({len(failed)} failed)" if failed else "READY"
    title = f"workshop check-node on {report.host}: {state}, {report.seconds:.0f} s"
    lines = ["=" * width, title[:width], "-" * width]
    lines.append(f"{'step':<10} {'status':<7} {'time':>7}  what it found")
    for step in report.steps:
        found = _clip(step.summary, width - 28)[0]
        lines.append(
            f"{step.name:<10} {step.status:<7} {step.seconds:>5.1f} s  {found}"
        )
    lines.append("=" * width)
    if not failed:
        skipped = [s.name for s in report.steps if s.status == SKIPPED]
        tail = f" (skipped: {', '.join(skipped)})" if skipped else ""
        return "\n".join(lines + _clip(f"READY: nothing failed{tail}.", width, 2))
    lines.append(f"NOT READY: {len(failed)} of {len(report.steps)} steps failed.")
    each = 2 if len(failed) <= 3 else 1  # lines for each problem and each fix
    for step in failed:
        problem = _clip(f"{step.name}: {step.summary}", width - 4, each)
        fix = _clip(step.fix, width - 7, each)
        lines += [("  " if i == 0 else "    ") + ln for i, ln in enumerate(problem)]
        lines += [("    -> " if i == 0 else "       ") + ln for i, ln in enumerate(fix)]
    return "\n".join(lines)


def allocation_line() -> str | None:
    """Inside a Slurm job, the job's cores and memory that the check measures; None
    outside.

    Example:
        >>> allocation_line()                                   # doctest: +SKIP
        'inside Slurm job 8: 1 of 2 cores (...), 0.3 GiB available of a 0.3 GiB ...'
    """
    from ..allocation import cpu_limit, memory_limit, slurm_allocation

    job = slurm_allocation()
    if not job.inside:
        return None
    return (
        f"inside Slurm job {job.job_id}: {cpu_limit().describe()}; memory "
        f"{memory_limit().describe()}"
    )


# ------------------------------------------------------------------ the check
def check_node(
    skip: Iterable[str] = (),
    *,
    quick: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    cpu_train: bool = False,
    train: TrainSettings | None = None,
    launch_repeats: int = 3,
    json_path: str | os.PathLike | None = None,
    file: TextIO | None = None,
) -> CheckReport:
    """Check this node for a class: run each step, print it, then the verdict.

    Args:
        skip: steps to leave out, from :data:`STEPS`.
        quick: leave out the notebooks and the training benchmark.
        timeout: seconds each step (each notebook) may run.
        cpu_train: run the training benchmark where no GPU is visible too.
        train: what the training step runs (ResNet-50, bf16, channels_last).
        launch_repeats: timed launches after the first on the two fork paths.
        json_path: also write every step's status, time and figures here.
        file: where to print; ``sys.stdout`` when omitted.

    Returns:
        A :class:`CheckReport`; its ``exit_status`` is 0 when nothing failed.

    Raises:
        ValueError: an unknown step in ``skip``, or a timeout not above 0.
        KeyboardInterrupt: interrupted, after every process was stopped.

    Example:
        >>> report = check_node(quick=True)                     # doctest: +SKIP
        >>> report.exit_status                                  # doctest: +SKIP
        0
    """
    left_out = steps_to_run(skip, quick)
    positive_number("timeout", timeout, what="a number of seconds")
    out = sys.stdout if file is None else file
    gpus = visible_gpu_count()  # from NVML: CUDA is not started in this process
    train = train or TrainSettings()
    ctx = Context(float(timeout), gpus, ROOT, cpu_train, train, launch_repeats, out)
    report = CheckReport(socket.gethostname(), [])
    started = time.monotonic()
    print(
        f"workshop check-node on {report.host}: {len(STEPS) - len(left_out)} of "
        f"{len(STEPS)} steps, each stopped after {timeout:.0f} s",
        file=out,
    )
    scope = allocation_line()
    if scope:
        print(scope, file=out)
    for number, name in enumerate(STEPS, 1):
        print(f"\n[{number}/{len(STEPS)}] {name}", file=out, flush=True)
        if name in left_out:
            result = CheckStep(name, SKIPPED, summary=left_out[name])
        else:
            t0 = time.monotonic()
            try:
                result = STEP_FUNCTIONS[name](ctx)
            except KeyboardInterrupt:
                # Each step runs its commands under run_command, which stopped
                # them; one line in the cell instead of the steps' frames.
                raise interrupted(
                    f"workshop check-node: interrupted in step {name}; everything it "
                    "started was stopped"
                ) from None
            result.seconds = time.monotonic() - t0
        report.steps.append(result)
        ctx.say(f"{result.status} ({result.seconds:.1f} s): {result.summary}")
    report.seconds = time.monotonic() - started
    print("\n" + format_verdict(report), file=out, flush=True)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        print(f"wrote {json_path}", file=out)
    return report


# ------------------------------------------------------------------ command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m workshop check-node``."""
    parser.add_argument(
        "--quick", action="store_true", help="leave out the notebooks and ResNet-50"
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=STEPS,
        metavar="STEP",
        help=f"leave a step out (repeatable): {', '.join(STEPS)}",
    )
    parser.add_argument(
        "--json",
        type=writable_file("--json check.json"),
        metavar="PATH",
        help="also write the results here",
    )
    parser.add_argument(
        "--timeout",
        type=above_zero("--timeout 900"),
        default=DEFAULT_TIMEOUT,
        metavar="S",
        help=f"seconds each step (each notebook) may run (default {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument(
        "--launch-repeats",
        type=whole_number(1, "--launch-repeats 3"),
        default=3,
        metavar="N",
        help="timed launches after the first on the fork paths (default 3)",
    )
    train = parser.add_argument_group("the train step (python -m workshop.bench train)")
    train.add_argument(
        "--cpu-train", action="store_true", help="run it where no GPU is visible too"
    )
    train.add_argument(
        "--train-model",
        default="resnet50",
        choices=("smallcnn", *RESNETS),
        metavar="NAME",
        help=f"smallcnn or {', '.join(RESNETS)} (default resnet50)",
    )
    for name, least, default, metavar in (
        ("batch-size", 1, None, "N"),
        ("image-size", 1, 224, "PX"),
        ("steps", 1, 30, "N"),
        ("warmup", 0, 5, "N"),
    ):
        example = f"--train-{name} {default or 32}"
        train.add_argument(
            f"--train-{name}",
            type=whole_number(least, example),
            default=default,
            metavar=metavar,
        )


def run_from_args(args: argparse.Namespace) -> int:
    """Run :func:`check_node` with the parsed options; return its exit status."""
    fields = ("model", "batch_size", "image_size", "steps", "warmup")  # --train-*
    train = TrainSettings(**{name: getattr(args, f"train_{name}") for name in fields})
    # The benchmark's own batch sizes, where none is given, are 8 and 256.
    least = smallest_image(train.model, train.batch_size or 8)
    if train.image_size < least:  # said now, not when the train step comes
        batches = f" in batches of {train.batch_size}" if train.batch_size else ""
        print(
            f"python -m workshop check-node: error: --train-image-size "
            f"{train.image_size} is too small for {train.model}{batches}: {least} or "
            f"more; e.g. --train-image-size {max(least, 32)}",
            file=sys.stderr,
        )
        return 2
    report = check_node(
        args.skip,
        quick=args.quick,
        timeout=args.timeout,
        cpu_train=args.cpu_train,
        train=train,
        launch_repeats=args.launch_repeats,
        json_path=args.json,
    )
    return report.exit_status
