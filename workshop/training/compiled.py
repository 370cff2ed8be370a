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

import contextlib
import logging
import os
import re
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch import nn

__all__ = [
    "check_compile",
    "compile_model",
    "compiler_error_line",
    "graphs_compiled",
    "inductor_unavailable",
    "keep_compiled_code_in_cache",
]


INDUCTOR_CACHE = "TORCHINDUCTOR_CACHE_DIR"


def keep_compiled_code_in_cache(environ: dict[str, str] | None = None) -> str | None:
    """Point torch.compile's cache (``TORCHINDUCTOR_CACHE_DIR``) at this user's cache
    folder, ``~/.cache/scaling-pytorch-hpc/inductor`` (or under
    ``$XDG_CACHE_HOME``), unless it is set already; returns the folder set, or None.

    Left unset, torch makes ``torchinductor_USER`` in the temporary folder as soon as
    any process imports ``torch._dynamo`` (torchrun's agent does on its way out), and
    keeps its compiled kernels there. The package sets it when imported, before any
    of its code compiles, so that the kernel, its ranks, the bench and the commands
    a cell runs (they inherit the variable) share one cache that is where a cache
    belongs. Where that folder cannot be made (no home, or one not writable), the
    variable is left unset and torch's default holds.
    """
    environ = os.environ if environ is None else environ
    if environ.get(INDUCTOR_CACHE):
        return None
    try:
        home = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    except RuntimeError:  # no home for this user
        return None
    folder = home / "scaling-pytorch-hpc" / "inductor"
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is None or not os.access(existing, os.W_OK | os.X_OK):
        return None
    environ[INDUCTOR_CACHE] = str(folder)
    return str(folder)


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


def _configured_compiler() -> str:
    """The C++ compiler inductor builds with in this process: the last entry of
    torch._inductor.config.cpp.cxx, which inductor reads from ``$CXX`` (else
    ``g++``) when it is first imported, not at each compile."""
    try:
        from torch._inductor import config

        choices = config.cpp.cxx
        if isinstance(choices, str):
            choices = (choices,)
        named = [c for c in choices if c]
        if named:
            return str(named[-1])
    except (ImportError, AttributeError):  # a torch without inductor's config
        pass
    return os.environ.get("CXX") or "g++"


def compiler_error_line(output: str) -> str | None:
    """The compiler's own first error in its ``output`` (or the linker's), without
    the program's name and "fatal error:" ahead of it; None when none is there.

    Example:
        >>> compiler_error_line("g++: fatal error: cannot execute 'cc1plus': execvp")
        "cannot execute 'cc1plus': execvp"
    """
    for line in output.splitlines():
        # gcc quotes with U+2018/U+2019 in a UTF-8 locale, with ' in C.
        line = line.strip().replace("\u2018", "'").replace("\u2019", "'")
        # The linker names what it missed before collect2 says it failed.
        match = re.search(r"\b(?:fatal error|error|ld(?:\.\w+)?):\s*(.+)", line)
        if match:
            return match.group(1)[:200]
    return None


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the errors it wraps: inductor's come inside Dynamo's
    (BackendCompilerFailed, InductorError), by cause or ``inner_exception``."""
    found: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in found:
        found.append(current)
        inner = getattr(current, "inner_exception", None)
        current = inner or current.__cause__ or current.__context__
    return found


def _why_probe_failed(error: BaseException, compiler: str) -> str:
    """One line naming why inductor's probe failed, from the compiler's words."""
    name = os.path.basename(shlex.split(compiler)[0]) if compiler.strip() else "g++"
    for inner in _chain(error):
        kind = type(inner).__name__
        if kind == "CppCompileError":
            said = compiler_error_line(str(getattr(inner, "output", "") or inner))
            return f"{name} cannot compile: {said or 'it failed with no error line'}"
        if kind == "InvalidCxxCompiler":
            return f"{name} does not run ({compiler} --version failed)"
    first = (str(error).strip().splitlines() or ["no message"])[0]
    return f"a tiny function failed to compile: {type(error).__name__}: {first[:200]}"


_FIX = (
    "module load gcc (on a cluster) or apt-get install g++, or set CXX to a C++ "
    "compiler that works; meanwhile compile='aot_eager' traces without generating code"
)
# inductor_unavailable's answers in this process, by compiler and where it is.
_ANSWERS: dict[tuple[str, str | None], str | None] = {}


def inductor_unavailable() -> str | None:
    """Why inductor cannot compile for a CPU in this process, in one line with what
    to do; None when it can.

    Inductor writes C++ for a CPU and builds it with ``$CXX``, else ``g++``. A
    compiler's name on the PATH is not enough (a node's g++ can lack its back end,
    cc1plus), so this compiles a tiny function with inductor once, here, and keeps
    the answer for the process (a notebook's kernel). The first step is quick: no
    compiler on the PATH is said without compiling. The probe's cost is mostly the
    warm-up the next compile would pay anyway (inductor's imports, its check of the
    CPU's vector units, its precompiled header): on the 2-core machine, about 4 s in
    a fresh process with inductor's caches warm, about 20 s cold. It runs in this
    process, so that it tests the compiler this process's inductor
    will use, and it has no time limit for the same reason: a compile that hangs
    here would hang the real one too. (A GPU's kernels need Triton's toolchain
    instead: the node check, ``python -m workshop check-node``, tries it.)

    Example:
        >>> print(inductor_unavailable())  # doctest: +SKIP
        inductor cannot compile for the CPU here: g++ cannot compile: cannot
        execute 'cc1plus': execvp: No such file or directory; module load gcc ...
    """
    compiler = _configured_compiler()
    words = shlex.split(compiler) if compiler.strip() else []
    found = shutil.which(words[0]) if words else None
    key = (compiler, found)
    if key not in _ANSWERS:
        if found is None:
            named = f"CXX={compiler}" if os.environ.get("CXX") else compiler
            where = "here" if os.sep in words[0] else "on the PATH" if words else ""
            why = f"{named} is not a program {where}".rstrip()
        else:
            why = _probe_inductor(compiler)
        _ANSWERS[key] = (
            None
            if why is None
            else f"inductor cannot compile for the CPU here: {why}; {_FIX}"
        )
    return _ANSWERS[key]


def _quiet_cuda_home_guess() -> None:
    """Import ``torch.utils.cpp_extension`` (inductor does, at its first compile)
    without its warning "No CUDA runtime is found, using CUDA_HOME=...": on a
    machine with no GPU but a CUDA toolkit on the PATH it guesses CUDA's home at
    import and says so on stderr, which concerns GPU builds only, not a CPU's C++,
    and would print into the lesson's cell on some machines and not others."""
    log = logging.getLogger("torch.utils.cpp_extension")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        import torch.utils.cpp_extension  # noqa: F401
    finally:
        log.setLevel(level)


def _probe_inductor(compiler: str) -> str | None:
    """Compile ``x * 2 + 1`` with inductor on the CPU: None, or why it failed."""
    import torch
    import torch._dynamo

    _quiet_cuda_home_guess()

    # A length of its own: the kernel's C++ holds it, so no cache on disk has this
    # kernel built and the compiler must run (a cached one would prove nothing).
    length = 1024 + int.from_bytes(os.urandom(3), "little")

    def tiny(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    # Code of its own too: Dynamo keeps compiled code per code object, and after a
    # few shapes of one it would run it eagerly, silently (its cache limit). With
    # suppress_errors, a failed compile would run eagerly as well: not here.
    tiny.__code__ = tiny.__code__.replace(co_name=f"inductor_probe_{length}")
    compiled = torch.compile(tiny, backend="inductor", dynamic=False)
    # One compile thread: inductor then starts no pool of compile workers for a
    # kernel this small (no_triton_pool says why a pool costs on 2 cores).
    from torch._inductor import config

    try:
        with (
            torch.no_grad(),
            torch._dynamo.config.patch(suppress_errors=False),
            config.patch(compile_threads=1),
        ):
            out = compiled(torch.ones(length))
    except Exception as error:  # inductor's errors come wrapped: read their chain
        return _why_probe_failed(error, compiler)
    if out.shape != (length,) or float(out[0]) != 3.0:
        return f"a tiny function compiled to wrong results ({float(out[0])}, not 3.0)"
    return None


@contextlib.contextmanager
def no_triton_pool() -> Iterator[None]:
    """Inductor compiling for a CPU starts no pool of compile workers.

    Each inductor compile starts ("warms") a pool of worker processes for Triton's
    kernels, which a CPU's C++ kernels never use (they build in threads). On a
    2-core machine the pool's processes, still starting while the first steps after
    a quick compile (inductor's caches warm) ran, took the CPU from them: the
    compiled steady state measured a fraction of eager's. With torch 2.11 the
    process could then hang at exit, waiting for them. ``TORCH_WARM_POOL=0``, read
    by torch when it compiles, leaves the pool unstarted.
    """
    before = os.environ.get("TORCH_WARM_POOL")
    os.environ["TORCH_WARM_POOL"] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TORCH_WARM_POOL", None)
        else:
            os.environ["TORCH_WARM_POOL"] = before


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
    _quiet_cuda_home_guess()

    def counted(graph: Any, example_inputs: Any) -> Any:
        _GRAPHS[0] += 1
        on_gpu = any(
            isinstance(t, torch.Tensor) and t.device.type != "cpu"
            for t in example_inputs
        )
        if backend != "inductor" or on_gpu:
            return compiler(graph, example_inputs)
        with no_triton_pool():
            return compiler(graph, example_inputs)

    torch._dynamo.reset()
    return torch.compile(model, backend=counted)


def graphs_compiled() -> int:
    """Graphs the models of :func:`compile_model` have handed their backend in this
    process so far: a step that raised it compiled (the first step, a
    recompilation, or under DDP one graph per bucket)."""
    return _GRAPHS[0]
