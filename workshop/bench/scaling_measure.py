"""Measuring scaling from a notebook or the command line: :func:`measure_scaling`.

Checks the settings before anything starts, launches :func:`scaling_worker` once per
world size and mode, and turns the workers' plain dicts into a
:class:`ScalingResult`, with the alpha-beta prediction of the gradient's all-reduce.
See :mod:`workshop.bench.scaling_bench` for what is measured and why.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ..comm.costmodel import fit_alpha_beta, ring_all_reduce_time
from .allreduce_result import load_allreduce
from .scaling_results import (
    MODES,
    ScalingResult,
    ScalingRow,
    add_speedups,
    ranks_text,
    why_not_comparable,
)
from .scaling_worker import (
    CNN_NAMES,
    check_divides,
    default_image_size,
    scaling_worker,
)

__all__ = ["measure_scaling"]

_CNN_MIN_IMAGE = 4  # pixels: SmallCNN's two 2x2 poolings need 4 to leave 1


# ------------------------------------------------------------------ measuring
def _whole(name: str, value: Any, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name}={value!r} must be a whole number, {least} or more")


def check_settings(
    world_sizes: Any,
    mode: str,
    steps: int,
    warmup: int,
    batch: int,
    model: str,
    image_size: int | None = None,
) -> tuple[list[int], list[str]]:
    from ..training.models import RESNETS

    if isinstance(world_sizes, (str, bytes)) or not isinstance(world_sizes, Sequence):
        raise ValueError(
            f"world_sizes={world_sizes!r} must be a list of rank counts, for example "
            "(1, 2, 4)"
        )
    if not world_sizes:
        raise ValueError("world_sizes is empty; pass rank counts such as (1, 2, 4)")
    for n in world_sizes:
        _whole("each of world_sizes", n, 1)
    if len(set(world_sizes)) != len(world_sizes):
        raise ValueError(f"world_sizes={list(world_sizes)} repeats a rank count")
    if mode not in (*MODES, "both"):
        raise ValueError(f"mode={mode!r} is not known; pass 'weak', 'strong' or 'both'")
    _whole("steps", steps, 1)
    _whole("warmup", warmup, 0)
    _whole("batch", batch, 1)
    if model not in (*CNN_NAMES, *RESNETS):
        raise ValueError(
            f"model={model!r} is not known; pass 'cnn' or one of " + ", ".join(RESNETS)
        )
    if image_size is not None:  # None: the model's default; 0 is not that
        # The CNN halves the image twice (2x2 pooling): below 4 pixels nothing is
        # left, and the ranks would fail in their first step.
        least = _CNN_MIN_IMAGE if model in CNN_NAMES else 1
        if (
            isinstance(image_size, bool)
            or not isinstance(image_size, int)
            or image_size < least
        ):
            why = " (its two 2x2 poolings need 4)" if model in CNN_NAMES else ""
            raise ValueError(
                f"image_size={image_size!r} is not a whole number of pixels, {least} "
                f"or more, for model {model!r}{why}; pass, e.g., image_size="
                f"{default_image_size(model)}, or None for that default"
            )
    return sorted(world_sizes), list(MODES) if mode == "both" else [mode]


def _gradient_bytes(model: str) -> int:
    from .scaling_worker import build_model

    net = build_model(model)[0]
    return sum(
        p.numel() * p.element_size() for p in net.parameters() if p.requires_grad
    )


def _fit_sizes(gradient_bytes: int) -> list[int]:
    """4 KiB (for latency), and 1/16, 1/4 and all of the gradient (for bandwidth)."""
    return sorted(
        {4096, *(max(4096, gradient_bytes // k // 4 * 4) for k in (16, 4, 1))}
    )


def _get(holder: Any, name: str) -> Any:
    return (
        holder.get(name) if isinstance(holder, Mapping) else getattr(holder, name, None)
    )


def given_alpha_beta(
    alpha: float | None, beta: float | None, allreduce_json: Any
) -> tuple[float, float, str] | None:
    """(alpha, beta, where they came from), or None to fit them in the run."""
    if (alpha is None) != (beta is None):
        raise ValueError(
            f"got alpha={alpha!r} and beta={beta!r}; pass both (alpha: seconds per "
            "ring step, beta: bytes/s per link) or neither, to fit them in the run"
        )
    if alpha is not None:
        if allreduce_json is not None:
            raise ValueError(
                "pass alpha and beta, or an all-reduce JSON file, not both"
            )
        if not (alpha >= 0 and beta > 0):
            raise ValueError(
                f"need alpha >= 0 and beta > 0, got {alpha!r} and {beta!r}"
            )
        return (
            float(alpha),
            float(beta),
            f"given (alpha {alpha:g} s, beta {beta:g} B/s)",
        )
    if allreduce_json is None:
        return None
    data = load_allreduce(allreduce_json)
    fit = _get(data, "fit")
    fit = fit() if callable(fit) else fit  # a method that fits, or a stored fit
    for holder in (data, fit):
        a, b = _get(holder, "alpha"), _get(holder, "beta")
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0:
            return float(a), float(b), f"from {allreduce_json}"
    raise ValueError(
        f"{str(allreduce_json)!r} holds no alpha and beta fit; run "
        "`python -m workshop.bench allreduce` with its fit, or pass --alpha and --beta"
    )


def _progress(raw: dict[str, Any]) -> str:
    row = _row(raw, None)
    return (
        f"  {row.mode} scaling, {ranks_text(row.world_size)}, "
        f"{row.batch_per_rank} per rank: {row.samples_per_second:,.0f} samples/s, "
        f"{row.step_seconds * 1e3:.2f} ms per step, "
        f"compute {row.compute_seconds * 1e3:.2f} ms"
    )


def measure_scaling(
    world_sizes: Sequence[int] = (1, 2, 4),
    mode: str = "both",
    *,
    steps: int = 20,
    warmup: int = 5,
    batch: int = 32,
    global_batch: int | None = None,
    model: str = "cnn",
    image_size: int | None = None,
    backend: str = "auto",
    alpha: float | None = None,
    beta: float | None = None,
    allreduce_json: str | os.PathLike[str] | None = None,
    seed: int = 0,
    timeout: float = 600.0,
    verbose: bool = False,
) -> ScalingResult:
    """Measure DDP training at several world sizes, one launch each.

    Args:
        world_sizes: rank counts; speed-up and efficiency are against the smallest.
        mode: "weak" (``batch`` per rank), "strong" (``global_batch`` split across
            the ranks) or "both".
        steps: timed steps of each kind (with and without the all-reduce).
        warmup: untimed steps of each kind first.
        batch: samples per rank per step in weak scaling.
        global_batch: samples per step over all ranks in strong scaling; ``batch``
            when None. Must divide by every world size.
        model: "cnn" (the workshop's SmallCNN) or a ResNet name ("resnet18", ...).
        image_size: synthetic images' size; None for 32 (the CNN, which needs 4
            at least) or 224 (a ResNet).
        backend: "auto", "gloo" or "nccl", the same at every world size: "auto"
            gives NCCL only where the largest world size has a GPU per rank, so
            that every row is measured on the same hardware.
        alpha, beta: the ring model's latency per step (s) and bandwidth per link
            (bytes/s), both or neither; fitted to all-reduces timed in the run when
            neither they nor ``allreduce_json`` are given.
        allreduce_json: a JSON of ``python -m workshop.bench allreduce`` to read
            alpha and beta from.
        seed: seeds the weights and data.
        timeout: seconds each launch may take.
        verbose: print a line after each launch.

    Returns:
        A :class:`ScalingResult`; ``print(result.table())`` shows it,
        ``result.explain()`` explains it, ``result.save("runs/scale")`` keeps it.

    Raises:
        ValueError: bad settings, such as a global batch that does not divide by a
            world size, or NCCL with fewer GPUs than the largest world size
            (checked before anything starts).
        workshop.LaunchError: a rank failed or a launch passed ``timeout``.

    Example:
        >>> result = measure_scaling((1, 2), mode="weak", steps=10)  # doctest: +SKIP
        >>> print(result.table())                                    # doctest: +SKIP
    """
    from ..env import choose_backend
    from ..ranks.launcher import launch

    sizes, modes = check_settings(
        world_sizes, mode, steps, warmup, batch, model, image_size
    )
    global_batch = batch if global_batch is None else global_batch
    if "strong" in modes:
        _whole("global_batch", global_batch, 1)
        check_divides(global_batch, sizes)
    # Chosen once, for the largest world size: left to each launch, "auto" on a node
    # with 1 GPU would run 1 rank on the GPU (NCCL) and 2 on the CPU (gloo), and the
    # speed-up between them would compare two machines.
    backend = choose_backend(backend, max(sizes))
    given = given_alpha_beta(alpha, beta, allreduce_json)
    fit = [] if given else _fit_sizes(_gradient_bytes(model))
    raws = []
    for m in modes:
        for n in sizes:
            run = launch(
                scaling_worker,
                world_size=n,
                backend=backend,
                timeout=timeout,
                show="none",
                mode=m,
                batch=batch if m == "weak" else global_batch,
                steps=steps,
                warmup=warmup,
                model=model,
                image_size=image_size,
                fit_sizes=fit if m == modes[0] and n > 1 else [],
                seed=seed,
            )
            raws.append(run.returns[0])
            if verbose:
                print(_progress(raws[-1]), flush=True)
    return assemble(raws, steps=steps, warmup=warmup, launcher="workshop", given=given)


# ------------------------------------------------------------------ assembling
def _row(raw: dict[str, Any], ab: tuple[float, float] | None) -> ScalingRow:
    n = raw["world_size"]
    step = max(statistics.median(t) for t in raw["step_seconds"])
    compute = max(statistics.median(t) for t in raw["compute_seconds"])
    predicted = None
    if n == 1:
        predicted = 0.0
    elif ab is not None:
        predicted = ring_all_reduce_time(raw["gradient_bytes"], n, ab[0], ab[1])
    return ScalingRow(
        mode=raw["mode"],
        world_size=n,
        batch_per_rank=raw["batch_per_rank"],
        global_batch=raw["global_batch"],
        threads_per_rank=raw["threads_per_rank"],
        samples_per_second=raw["global_batch"] / step,
        step_seconds=step,
        compute_seconds=compute,
        comm_seconds=max(0.0, step - compute),
        allreduce_seconds=statistics.median(raw["allreduce_seconds"]),
        predicted_allreduce_seconds=predicted,
        alpha=ab[0] if ab and n > 1 else None,
        beta=ab[1] if ab and n > 1 else None,
        step_times=raw["step_seconds"],
        compute_times=raw["compute_seconds"],
        allreduce_times=raw["allreduce_seconds"],
        fit_sizes=raw["fit_sizes"],
        fit_seconds=raw["fit_seconds"],
    )


def check_baseline(
    baseline: ScalingResult, first: dict, rows: list[ScalingRow]
) -> None:
    """A baseline must have measured the same thing at another world size."""
    why = why_not_comparable(
        (baseline.model, baseline.image_size, baseline.rows),
        (first["model"], first["image_size"], rows),
    )
    if why:
        raise ValueError(
            f"the baseline cannot be compared with this run: it measured {why}; "
            "pass a baseline of the same model and image size, or --batch and "
            "--global-batch to match it"
        )


def assemble(
    raws: list[dict[str, Any]],
    *,
    steps: int,
    warmup: int,
    launcher: str,
    given: tuple[float, float, str] | None,
    baseline: ScalingResult | None = None,
) -> ScalingResult:
    """A :class:`ScalingResult` from the dicts :func:`scaling_worker` returned.

    Args:
        raws: rank 0's dict of each launch.
        steps, warmup: the settings the workers ran with.
        launcher: "workshop", "torchrun", "srun" or "mpirun".
        given: (alpha, beta, where from), or None to fit them to the all-reduces the
            workers timed, one fit per world size.
        baseline: an earlier run whose rows may hold the smallest world size.
    """
    import torch

    fits: dict[int, tuple[float, float]] = {}
    for raw in raws:
        n = raw["world_size"]
        if given is None and raw["fit_seconds"] and n not in fits:
            fit = fit_alpha_beta(raw["fit_sizes"], raw["fit_seconds"], n)
            fits[n] = (fit.alpha, fit.beta)
    rows = [_row(r, given[:2] if given else fits.get(r["world_size"])) for r in raws]
    if baseline is not None:
        check_baseline(baseline, raws[0], rows)
    add_speedups(rows, baseline.rows if baseline else ())
    if given is not None:
        source = given[2]
    elif fits:
        source = "fitted in this run to all-reduces of 4 sizes at each world size"
    else:
        source = "none (pass --alpha and --beta for a prediction)"
    first = raws[0]
    return ScalingResult(
        rows=rows,
        model=first["model"],
        image_size=first["image_size"],
        parameters=first["parameters"],
        gradient_bytes=first["gradient_bytes"],
        steps=steps,
        warmup=warmup,
        backend=first["backend"],
        device=first["device"],
        launcher=launcher,
        alpha_beta_source=source,
        machine={
            "host": platform.node(),
            "system": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
        },
        versions={
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": str(torch.version.cuda),
        },
        created=datetime.datetime.now().isoformat(timespec="seconds"),
    )
