"""The compiled path: ``torch.compile`` for the training loop, and what it costs.

The first call of each new graph pays for tracing and code generation; a batch of
another shape may compile once more; under DDP there is one graph per gradient
bucket. :func:`workshop.training.loop.train` takes ``compile=True`` (inductor) or a
backend's name, and counts the graphs each step compiled (:func:`graphs_compiled`).
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
    """Point torch.compile's cache (``TORCHINDUCTOR_CACHE_DIR``) at
    ``~/.cache/scaling-pytorch-hpc/inductor`` unless it is set, or that cannot be
    made; returns the folder set, or None. Left unset, torch keeps its kernels in
    the temporary folder; set at import, it is inherited by ranks and commands."""
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
    """The C++ compiler inductor builds with in this process (its config, read from
    ``$CXX`` at its first import, not at each compile)."""
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

    A compiler on the PATH is not enough (g++ can lack cc1plus), so this compiles a
    tiny function with inductor once, in this process and without a time limit (it
    tests what the real compile will meet), and keeps the answer. Its cost is mostly
    the warm-up the next compile would pay anyway: about 4 s warm, 20 s cold.

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
    """Import ``torch.utils.cpp_extension`` without its "No CUDA runtime is found"
    warning, which concerns GPU builds only and would print into a lesson's cell on
    some machines and not others."""
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
    """Inductor compiling for a CPU starts no pool of Triton compile workers: on 2
    cores they took the CPU from the first steps (a fraction of eager's speed was
    measured) and, with torch 2.11, hung the process at exit."""
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
    """``model`` compiled with ``backend`` (None: the model itself), sharing its
    parameters; each graph handed to the backend is counted
    (:func:`graphs_compiled`). Dynamo's caches are emptied first, or a second run
    would borrow the first one's warm-up and report none."""
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
    process so far: a step that raised it compiled."""
    return _GRAPHS[0]
