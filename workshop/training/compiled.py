"""The compiled path: ``torch.compile`` for the training loop, and what it costs.

``torch.compile`` traces the model's Python into graphs and hands each to a backend
(by default inductor, which writes fused kernels: C++ on a CPU, Triton on a GPU).
The first call of each new graph pays for the tracing and the code generation; a
later call whose inputs differ in shape (the smaller last batch of an epoch) may
compile again, once, with that dimension left symbolic. Under
``DistributedDataParallel`` the graph is cut at the gradient buckets' boundaries,
so that each bucket's all-reduce still starts while the backward pass goes on:
one graph per bucket.

:func:`workshop.training.loop.train` takes ``compile=True`` (inductor) or a
backend's name; it counts the graphs each step compiled (:func:`graphs_compiled`),
and its History keeps the steps that compiled and their time apart from the
steady state.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from torch import nn

__all__ = ["check_compile", "compile_model", "graphs_compiled", "missing_compiler"]


def _backends() -> list[str]:
    import torch._dynamo

    # The debug backends too: "aot_eager" traces and splits as inductor does but
    # generates no code, which makes the mechanics cheap to show.
    return sorted(set(torch._dynamo.list_backends(exclude_tags=())) | {"inductor"})


def check_compile(value: Any) -> str | None:
    """The backend ``train(compile=value)`` asks for: None for eager, "inductor"
    for True, else the name given.

    Raises:
        TypeError: neither True, False nor a string.
        ValueError: a name torch does not know, with the ones it does.
    """
    if value is False or value is None:
        return None
    if value is True:
        return "inductor"
    if not isinstance(value, str):
        raise TypeError(
            f"compile must be True, False or a torch.compile backend's name, got "
            f"{value!r}; e.g. compile=True (inductor)"
        )
    known = _backends()
    if value not in known:
        raise ValueError(
            f"compile={value!r} is not a torch.compile backend here; give True "
            f"(inductor) or one of {', '.join(known)}"
        )
    return value


def missing_compiler() -> str | None:
    """Why inductor cannot compile for a CPU here, or None: it writes C++ and builds
    it with ``$CXX``, else ``g++`` (torch._inductor.config.cpp.cxx), which must be on
    the PATH. (A GPU's kernels need Triton's toolchain instead: the node check,
    ``python -m workshop check``, tries it.)"""
    compiler = os.environ.get("CXX") or "g++"
    if shutil.which(compiler):
        return None
    if os.environ.get("CXX"):
        where = f"CXX={compiler} is not a program on the PATH"
    else:
        where = "g++ is not on the PATH"
    return (
        f"inductor cannot compile for the CPU here: {where}; module load gcc (on a "
        "cluster) or apt-get install g++, or set CXX to a C++ compiler"
    )


# Graphs handed to a backend in this process: the count the loop reads per step.
_GRAPHS = [0]


def compile_model(model: nn.Module, backend: str | None) -> nn.Module:
    """``model`` compiled with ``backend`` (None: the model itself). The compiled
    module shares the model's parameters: an optimizer made on either steps both,
    and a DDP model keeps ``no_sync`` (the wrapper passes attributes through).

    Each graph Dynamo hands the backend is counted (:func:`graphs_compiled`): under
    DDP it hands one per gradient bucket, which is the split to see.

    torch.compile's caches in this process are emptied first: its compiled code
    serves any model of the same code, so a second run would borrow the first one's
    warm-up and report none. (Inductor's cache on disk still spares a recompilation
    its code generation: that is what a job that starts again gets too.)"""
    if backend is None:
        return model
    import torch
    import torch._dynamo

    compiler = torch._dynamo.lookup_backend(backend)

    def counted(graph: Any, example_inputs: Any) -> Any:
        _GRAPHS[0] += 1
        return compiler(graph, example_inputs)

    torch._dynamo.reset()
    return torch.compile(model, backend=counted)


def graphs_compiled() -> int:
    """Graphs the models of :func:`compile_model` have handed their backend in this
    process so far: a step that raised it compiled (the first step, a
    recompilation, or under DDP one graph per bucket)."""
    return _GRAPHS[0]
