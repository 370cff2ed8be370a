"""The node check's ``compile`` step, its probe and its reading of a failure: does
``torch.compile`` work here, and how long is its warm-up?

Inductor needs a C++ compiler on a CPU, and a C compiler and ``ptxas`` on a GPU
(Triton); a missing or broken one is the common failure on a fresh node, and its
error is long: this module turns it into one line naming the program and the fix.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..training.compiled import compiler_error_line

__all__ = ["explain_compile_error", "probe_compile"]

_MODULE_HINT = "module load gcc (on a cluster) or apt-get install g++ (on your own)"


def explain_compile_error(error: str, cxx: str | None = None) -> tuple[str, str]:
    """What a failed ``torch.compile`` says, as (what is missing, what to do).

    Args:
        error: the exception's text (its type's name and message).
        cxx: the C++ compiler inductor was told to use (``$CXX``), if any.

    Returns:
        One line naming the missing program, and one concrete fix.

    Example:
        >>> explain_compile_error("InvalidCxxCompiler: No working C++ compiler")[0]
        'no C++ compiler for inductor: g++ is not on the PATH'
    """
    text = error.lower()
    if "invalidcxxcompiler" in text or "no working c++ compiler" in text:
        where = f"CXX={cxx} does not run" if cxx else "g++ is not on the PATH"
        fix = f"{_MODULE_HINT}, or set CXX to a C++ compiler that runs"
        return f"no C++ compiler for inductor: {where}", fix
    if "cppcompileerror" in text or "c++ compile error" in text:
        program = os.path.basename(cxx.split()[0]) if cxx and cxx.split() else "g++"
        said = compiler_error_line(error) or "it failed with no error line"
        fix = f"{_MODULE_HINT}, or set CXX to a C++ compiler that works"
        return f"{program} cannot compile for inductor: {said}", fix
    if "ptxas" in text:
        return (
            "Triton could not run ptxas, the CUDA toolchain's assembler",
            "module load cuda (a toolkit matching the driver), or set "
            "TRITON_PTXAS_PATH to a working ptxas",
        )
    if "failed to find c compiler" in text or "no c compiler" in text:
        return "no C compiler for Triton's launcher (cc, gcc)", _MODULE_HINT
    if "triton" in text and ("no module" in text or "cannot find" in text):
        return (
            "Triton is not installed: inductor cannot write GPU kernels",
            "pip install triton (the version your torch names)",
        )
    first = error.strip().splitlines()[0] if error.strip() else "no message"
    return (
        f"torch.compile failed: {first[:200]}",
        "see the whole error: python -m workshop.instructor.check_steps compile",
    )


def probe_compile() -> dict[str, Any]:
    """Compile a tiny model with inductor on this process's device and time it.

    Returns:
        {"ok": True, "device", "first_seconds", "second_seconds"}, or {"ok": False,
        "device", "error", "missing", "fix"} (:func:`explain_compile_error`).
    """
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    ).to(device)
    # A batch of its own: the kernels' code holds it, so no cache on disk has them
    # and the warm-up timed is tracing, code generation and the compiler's work.
    x = torch.randn(8 + int.from_bytes(os.urandom(2), "little"), 16, device=device)
    compiled = torch.compile(model, backend="inductor")
    times = []
    try:
        for _ in range(2):
            t0 = time.perf_counter()
            compiled(x).sum().item()  # .item(): the device's work done
            times.append(time.perf_counter() - t0)
    except Exception as exc:  # inductor's errors come wrapped: read their text
        error = f"{type(exc).__name__}: {exc}"
        missing, fix = explain_compile_error(error, os.environ.get("CXX"))
        first = error.strip().splitlines()[0][:300]
        return dict(ok=False, device=device, error=first, missing=missing, fix=fix)
    return dict(ok=True, device=device, first_seconds=times[0], second_seconds=times[1])
