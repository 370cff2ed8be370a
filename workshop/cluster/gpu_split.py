"""Torchrun agents started together on one machine share its GPUs (notebook 03).

Two agents on one machine, standing in for two nodes, each count only their own
ranks, so both give local rank 0 ``cuda:0``: :func:`split_gpus` gives each its own
``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..env import visible_gpu_count
from .run import environment, is_torchrun

__all__ = ["GpuSplit", "split_for", "split_gpus"]


@dataclass(frozen=True)
class GpuSplit:
    """How commands started together share the GPUs: ``envs[i]`` is added to
    command ``i``'s environment; ``note`` says what was decided, if anything."""

    envs: list[dict[str, str]]
    note: str | None = None


def split_gpus(
    ranks: Sequence[int | None], gpu_count: int, environ: Mapping[str, str]
) -> GpuSplit:
    """Share the visible GPUs between launchers started together on one machine.

    Each launcher gets as many of the visible GPUs as it has ranks; with fewer GPUs
    than ranks in all, none gets any, so that backend "auto"
    (:func:`workshop.env.choose_backend`) picks gloo. One launcher alone, or no GPU,
    changes nothing.

    Args:
        ranks: per command, the ranks it starts here; None for a non-launcher.
        gpu_count: GPUs this process sees (:func:`workshop.env.visible_gpu_count`).
        environ: the commands' environment; its ``CUDA_VISIBLE_DEVICES`` names the
            GPUs to share.

    Returns:
        A :class:`GpuSplit`, one mapping per command in ``ranks``.

    Example:
        >>> split_gpus([1, 1], 2, {}).envs
        [{'CUDA_VISIBLE_DEVICES': '0'}, {'CUDA_VISIBLE_DEVICES': '1'}]
        >>> print(split_gpus([1, 1], 1, {}).note)  # doctest: +NORMALIZE_WHITESPACE
        note: 2 agents x 1 rank need 2 GPUs, 1 visible: the agents run on the CPU
        with gloo (CUDA_VISIBLE_DEVICES=""); NCCL needs a GPU of its own for every
        rank, and agents on one machine would all start at cuda:0
    """
    agents = [i for i, n in enumerate(ranks) if n is not None]
    envs: list[dict[str, str]] = [{} for _ in ranks]
    gpus = _visible_gpu_ids(gpu_count, environ.get("CUDA_VISIBLE_DEVICES"))
    if len(agents) < 2 or not gpus:
        return GpuSplit(envs)
    wanted = [ranks[i] or 0 for i in agents]
    who = _agents_text(wanted)
    if sum(wanted) > len(gpus):
        for i in agents:
            envs[i]["CUDA_VISIBLE_DEVICES"] = ""
        return GpuSplit(
            envs,
            f"note: {who} need {sum(wanted)} GPUs, {len(gpus)} visible: the agents "
            'run on the CPU with gloo (CUDA_VISIBLE_DEVICES=""); NCCL needs a GPU of '
            "its own for every rank, and agents on one machine would all start at "
            "cuda:0",
        )
    start = 0
    for i, count in zip(agents, wanted, strict=True):
        envs[i]["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[start : start + count])
        start += count
    given = " / ".join(envs[i]["CUDA_VISIBLE_DEVICES"] or "none" for i in agents)
    return GpuSplit(
        envs,
        f"note: {who}, {len(gpus)} GPU{'s' if len(gpus) != 1 else ''} visible: each "
        f"agent gets GPUs of its own, as on separate nodes (CUDA_VISIBLE_DEVICES "
        f"{given})",
    )


def _visible_gpu_ids(count: int, listed: str | None) -> list[str]:
    """The ids of the ``count`` visible GPUs (CUDA reads ``listed`` up to an empty or
    negative entry)."""
    if listed is None:
        return [str(i) for i in range(count)]
    ids = []
    for entry in (e.strip() for e in listed.split(",")):
        if not entry or entry.startswith("-"):
            break
        ids.append(entry)
    return ids[:count]


def _agents_text(ranks: list[int]) -> str:
    """ "2 agents x 1 rank", or "2 agents with 1 + 3 ranks" when they differ."""
    if len(set(ranks)) == 1:
        return f"{len(ranks)} agents x {ranks[0]} rank{'s' if ranks[0] != 1 else ''}"
    return f"{len(ranks)} agents with {' + '.join(map(str, ranks))} ranks"


def _torchrun_ranks(command: Sequence[str]) -> int | None:
    """A torchrun command's nproc_per_node (1 by default); None for another command
    or a count torchrun works out itself ("gpu")."""
    if not is_torchrun(command):
        return None
    value = "1"  # torchrun's default
    for word, following in zip(command, [*command[1:], ""], strict=True):
        name, equals, given = word.partition("=")
        if name in ("--nproc_per_node", "--nproc-per-node"):
            value = given if equals else following
            break
    return int(value) if value.isdigit() else None


def split_for(
    commands: list[list[str]], env: Mapping[str, str | None] | None
) -> GpuSplit:
    """:func:`split_gpus` for commands about to run with this environment plus
    ``env``; GPUs are only counted when two or more are torchrun agents."""
    ranks = [_torchrun_ranks(command) for command in commands]
    if sum(n is not None for n in ranks) < 2:
        return GpuSplit([{} for _ in commands])
    environ, _ = environment(commands[0], env)  # what the commands start with
    return split_gpus(ranks, visible_gpu_count(), environ)
