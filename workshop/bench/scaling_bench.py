"""Weak and strong scaling of DDP training: ``python -m workshop.bench scaling``::

    python -m workshop.bench scaling                  # 1, 2, 4 ranks, both modes
    python -m workshop.bench scaling --mode strong --global-batch 64 --out runs/scale
    torchrun --nproc_per_node=8 -m workshop.bench scaling --out runs/scale8

Each world size is a separate launch; under torchrun, srun or mpirun the command
measures that one world size with the same :func:`scaling_worker` and rank 0 writes
the rows. Weak scaling keeps ``batch`` per rank (efficiency = X_N / (N X_1)); strong
scaling splits a global batch (speed-up = T_1 / T_N, efficiency = speed-up / N). How a
step is split into compute and communication: :mod:`workshop.bench.scaling_measure`.
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

from .._cli import above_zero, read_with, zero_or_more
from ..env import RankInfo
from ..training.models import RESNETS
from .bench_output import check_writable, count_option, save_or_keep
from .scaling_measure import (
    CNN_NAMES,
    _fit_sizes,
    _gradient_bytes,
    check_divides,
    check_settings,
    default_image_size,
    given_alpha_beta,
    measure_scaling,
    scaling_batch,
    scaling_worker,
)
from .scaling_plots import load_scaling, plot_scaling
from .scaling_results import MODES, ScalingResult, assemble, check_baseline

__all__ = ["add_arguments", "main"]


# ------------------------------------------------------------------ command line
def _allreduce_json(text: str) -> str:
    """--allreduce-json: read now, so a bad file is said before anything is measured."""
    given_alpha_beta(None, None, text)
    return text


def _world_sizes_arg(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1 or len(set(sizes)) < len(sizes):
        raise argparse.ArgumentTypeError(
            f"{text} is not a list of rank counts, each 1 or more and none twice; "
            "e.g. --world-sizes 1,2,4"
        )
    return sizes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m workshop.bench scaling``."""
    from ..env import BACKENDS

    parser.add_argument(
        "--world-sizes",
        type=_world_sizes_arg,
        help="rank counts, one launch each (default 1,2,4 on the CPU; 1,2,4,... up "
        "to the GPUs there are)",
    )
    parser.add_argument("--mode", choices=[*MODES, "both"], default="both")
    parser.add_argument(
        "--model",
        default="cnn",
        choices=(*CNN_NAMES, *RESNETS),
        metavar="NAME",
        help=f"cnn (SmallCNN) or {', '.join(RESNETS)} (default cnn)",
    )
    count_option(
        parser,
        "--batch",
        1,
        None,
        "samples per rank per step, weak scaling (default 32; 128 on GPUs)",
        "--batch 32",
    )
    count_option(
        parser,
        "--global-batch",
        1,
        None,
        "samples per step over all ranks, strong scaling (default: --batch)",
        "--global-batch 64",
    )
    count_option(
        parser,
        "--image-size",
        1,
        None,
        "default 32 (cnn, 4 at least), 224 (ResNet)",
        "--image-size 32",
    )
    count_option(parser, "--steps", 1, 20, "timed steps of each kind")
    count_option(parser, "--warmup", 0, 5, "untimed steps first")
    parser.add_argument("--backend", choices=BACKENDS, default="auto")
    parser.add_argument(
        "--alpha",
        type=zero_or_more("--alpha 1e-5 --beta 1e9"),
        help="seconds per ring step (+ --beta)",
    )
    parser.add_argument(
        "--beta",
        type=above_zero("--alpha 1e-5 --beta 1e9"),
        help="bytes/s per link (+ --alpha)",
    )
    parser.add_argument(
        "--allreduce-json",
        metavar="PATH",
        type=read_with(_allreduce_json, "the all-reduce fit"),
        help="alpha and beta from this file",
    )
    parser.add_argument(
        "--baseline",
        metavar="PATH",
        type=read_with(load_scaling, "a baseline"),
        help="under torchrun: JSON of an earlier run (1 rank, say) to compare with",
    )
    parser.add_argument(
        "--timeout",
        type=above_zero("--timeout 600"),
        default=600.0,
        help="s per launch",
    )
    parser.add_argument("--out", metavar="PREFIX", help="write PREFIX.json and .csv")
    parser.add_argument(
        "--plot", action="store_true", help="also write PREFIX.png (needs --out)"
    )


def _default_world_sizes(gpus: int) -> list[int]:
    if not gpus:
        return [1, 2, 4]
    sizes = [2**k for k in range(gpus.bit_length()) if 2**k <= gpus]
    return sizes if sizes[-1] == gpus else [*sizes, gpus]


def _under_launcher(
    args: argparse.Namespace, info: RankInfo, batch: int
) -> ScalingResult | None:
    """This world size only, as torchrun/srun/mpirun started it; rank 0's result."""
    from ..ranks.worker import process_group

    _, modes = check_settings(
        [info.world_size], args.mode, args.steps, args.warmup, batch, args.model,
        args.image_size,
    )  # fmt: skip
    global_batch = args.global_batch or batch
    batches = {"weak": batch, "strong": global_batch}
    if "strong" in modes:
        check_divides(global_batch, [info.world_size])
    given = given_alpha_beta(args.alpha, args.beta, args.allreduce_json)
    baseline = args.baseline  # read when the options were parsed
    if baseline is not None:  # before measuring, not after: say at once
        per_rank = {m: scaling_batch(m, batches[m], info.world_size) for m in modes}
        planned = [
            SimpleNamespace(
                mode=m, batch_per_rank=per_rank[m], global_batch=global_batch
            )
            for m in modes
        ]
        size = args.image_size or default_image_size(args.model)
        check_baseline(baseline, {"model": args.model, "image_size": size}, planned)
    fit = [] if given else _fit_sizes(_gradient_bytes(args.model))
    if args.world_sizes and info.is_main:
        print(f"{info.launcher} started {info.world_size} ranks: --world-sizes ignored")
    raws = []
    with process_group(args.backend, timeout=args.timeout):
        for m in modes:
            raws.append(
                scaling_worker(
                    m,
                    batches[m],
                    steps=args.steps,
                    warmup=args.warmup,
                    model=args.model,
                    image_size=args.image_size,
                    fit_sizes=fit if m == modes[0] else [],
                )
            )
    if not info.is_main:
        return None
    return assemble(
        raws,
        steps=args.steps,
        warmup=args.warmup,
        launcher=info.launcher,
        given=given,
        baseline=baseline,
    )


def main(args: argparse.Namespace) -> int:
    """Run the scaling benchmark, print its table and explanation."""
    from ..env import rank_info, visible_gpu_count
    from ..ranks.session import LaunchError

    if args.plot and not args.out:
        print(
            "python -m workshop.bench scaling: error: --plot writes PREFIX.png; "
            "pass --out PREFIX too",
            file=sys.stderr,
        )
        return 2
    started = time.perf_counter()
    gpus = visible_gpu_count()
    batch = args.batch if args.batch is not None else (128 if gpus else 32)
    info = rank_info()
    try:
        if args.baseline is not None and info.launcher == "none":
            raise ValueError(
                "--baseline compares a run that torchrun, srun or mpirun started at "
                "one world size with an earlier run; this run measures every world "
                "size itself and compares them with the smallest. Leave --baseline "
                "out, or run under a launcher (torchrun --nproc_per_node=2 -m "
                "workshop.bench scaling --baseline ...)"
            )
        if args.out:  # before minutes of measuring, not after; on every rank, so
            check_writable(args.out, "--out")  # all stop if rank 0 could not write
        if info.launcher != "none":
            result = _under_launcher(args, info, batch)
            if result is None:
                return 0
        else:
            sizes = args.world_sizes or _default_world_sizes(gpus)
            check_settings(  # again in measure_scaling: here, before saying it starts
                sizes, args.mode, args.steps, args.warmup, batch, args.model,
                args.image_size,
            )  # fmt: skip
            print(
                f"measuring {args.model} at world sizes {','.join(map(str, sizes))}, "
                f"{args.mode} scaling, one launch each",
                flush=True,
            )
            result = measure_scaling(
                sizes,
                args.mode,
                steps=args.steps,
                warmup=args.warmup,
                batch=batch,
                global_batch=args.global_batch,
                model=args.model,
                image_size=args.image_size,
                backend=args.backend,
                alpha=args.alpha,
                beta=args.beta,
                allreduce_json=args.allreduce_json,
                timeout=args.timeout,
                verbose=True,
            )
    except (ValueError, OSError) as exc:
        print(f"python -m workshop.bench scaling: error: {exc}", file=sys.stderr)
        return 2
    except LaunchError as exc:
        print(
            f"python -m workshop.bench scaling: a launch failed: {exc}", file=sys.stderr
        )
        return 1
    print("\n" + result.report())
    code = 0
    if args.out:
        written = save_or_keep(result.save, args.out, result.to_json)
        for path in written:
            print(f"wrote {path}")
        if args.plot and written:
            figure = plot_scaling(result, title=f"DDP scaling of {args.model}")
            figure.savefig(f"{args.out}.png", dpi=110)
            print(f"wrote {args.out}.png")
        code = 0 if written else 1
    print(f"finished in {time.perf_counter() - started:.1f} s")
    return code
