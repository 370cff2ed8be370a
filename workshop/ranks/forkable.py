"""May this process fork its ranks, and so how a launch starts them.

Forking the kernel is the fastest way to start ranks, and on a CPU machine it is
always safe. On a GPU machine two things in the kernel make a forked child unusable,
and neither can be undone without restarting the kernel:

- **CUDA was started** (a CUDA tensor, ``torch.cuda.is_available()``,
  ``get_device_name()``): the child cannot use the GPU ("CUDA error: initialization
  error"). torch marks such children as a "bad fork"; a forked child is asked.
- **A backward pass ran**, even on CPU tensors: with a GPU visible, autograd's engine
  then starts one worker thread per device (named ``pt_autograd_0``, ...) and
  installs a fork handler, and every child forked afterwards fails at its first
  backward ("Unable to handle autograd's threading in combination with fork-based
  multiprocessing") and at its first CUDA call. Neither ``torch.cuda.is_initialized()``
  in the parent nor ``_is_in_bad_fork()`` in the child sees it; the threads do, and
  they appear exactly when children break (measured on an H100 node, torch 2.11;
  ``shared/GPU-NODE.md``). On a CPU-only machine the engine starts no such thread.

Either way ranks then start from the clean fork server (or spawn):
:func:`choose_start_method` is where that is decided.
"""

from __future__ import annotations

import os
import sys

from .._procs import answer_in_child, thread_names

START_METHODS = ("auto", "fork", "server", "spawn")

# What makes forking unsafe, as (the reason in a launch header, what to do instead of
# start_method="fork"). The keys are what fork_hazard() returns.
CUDA = "cuda"
AUTOGRAD = "autograd"
HAZARDS: dict[str, str] = {
    CUDA: "CUDA is initialised in this kernel, so it must not fork",
    AUTOGRAD: "this kernel ran a backward pass on a GPU machine: "
    "ranks start from the fork server",
}
# Printed once per kernel, the first time the fork server is used because of it.
EXPLANATIONS: dict[str, str] = {
    CUDA: "workshop.launch: CUDA is already initialised in this kernel, and a "
    "process that has initialised CUDA cannot be forked safely. Ranks are started "
    "from a clean fork server instead (torch preloaded, CUDA untouched); its first "
    "start takes a few seconds.",
    AUTOGRAD: "workshop.launch: this kernel ran a backward pass on a GPU machine, "
    "which started autograd's GPU threads; a rank forked from it would fail at its "
    "first backward pass or CUDA call. Ranks are started from a clean fork server "
    "instead (torch preloaded, no autograd threads); its first start takes a few "
    "seconds.",
}
_REFUSALS: dict[str, str] = {
    CUDA: "start_method='fork' but CUDA is already initialised in this process, "
    "and a forked child cannot use CUDA; pass start_method='server' (or 'auto'), or "
    "restart the kernel and launch before touching the GPU",
    AUTOGRAD: "start_method='fork' but this kernel ran a backward pass on a GPU "
    "machine: autograd's GPU threads are running, and a forked rank would fail at "
    "its first backward pass (\"Unable to handle autograd's threading in combination "
    "with fork-based multiprocessing\") or CUDA call; pass start_method='server' (or "
    "'auto'), or restart the kernel and launch before the first backward pass",
}

_AUTOGRAD_THREAD = "pt_autograd_"
# Where this process's threads are listed (a test may point it elsewhere).
TASK_DIR = "/proc/self/task"


def autograd_threads(task_dir: str | None = None) -> list[str]:
    """Names of autograd's per-device worker threads running in this process.

    They exist only after a backward pass on a machine where torch sees a GPU (or
    another accelerator), and never go away. Reads each thread's name from
    ``task_dir`` (default ``TASK_DIR``; well under 1 ms); [] where there is no /proc.
    """
    names = thread_names(TASK_DIR if task_dir is None else task_dir) or []
    return sorted(name for name in names if name.startswith(_AUTOGRAD_THREAD))


def _driver_loaded(maps_file: str = "/proc/self/maps") -> bool:
    """True when ``libcuda.so`` is mapped here. Without it no CUDA call can have
    run; with it nothing is known yet: ``import torch`` alone maps it on some GPU
    nodes (measured on one with torch 2.11), and a child forked then is fine."""
    try:
        with open(maps_file) as maps:
            return any("libcuda.so" in line for line in maps)
    except OSError:  # no /proc (macOS): assume the driver may be there, and ask
        return True


_POISONED = False


def _fork_is_poisoned() -> bool:
    """Ask a forked child whether torch marked it a "bad fork": so it marks every
    child forked after this process asked the CUDA runtime anything (not
    ``torch.cuda.device_count()``, which asks NVML). The answer only turns from no
    to yes, so a yes is kept. Costs one fork, about 15 ms."""
    global _POISONED
    if _POISONED:
        return True
    import torch

    answer = answer_in_child(lambda: 1 if torch.cuda._is_in_bad_fork() else 0, 10.0)
    if answer is None:  # no answer (never seen): the server is the safe way
        return True
    _POISONED = answer == 1
    return _POISONED


def _cuda_initialized(maps_file: str = "/proc/self/maps") -> bool:
    """True once this process has started CUDA in a way a forked rank cannot survive.

    ``torch.cuda.is_initialized()`` only knows torch's own context, while
    ``torch.cuda.is_available()`` starts the driver (``cuInit``) without one: so
    without the driver library loaded nothing has started; with it, a forked child
    is asked whether torch marked it a "bad fork"."""
    import torch

    if torch.cuda.is_initialized():
        return True
    if not hasattr(os, "fork") or not _driver_loaded(maps_file):
        return False
    return _fork_is_poisoned()


def fork_hazard() -> str | None:
    """Why ranks forked from this process would be broken, or None when they would not.

    Returns:
        ``"cuda"`` (CUDA was started here), ``"autograd"`` (a backward pass ran with
        a GPU visible: autograd's device threads and their fork handler), or None.
        ``HAZARDS[key]`` says it in words.

    Example:
        >>> fork_hazard() is None  # a fresh CPU-only process
        True
    """
    import torch

    if torch.cuda.is_initialized():
        return CUDA
    # Before asking a child about CUDA: reading thread names costs no fork.
    if autograd_threads():
        return AUTOGRAD
    return CUDA if _cuda_initialized() else None


def choose_start_method(
    requested: str, hazard: str | None, platform: str = sys.platform
) -> tuple[str, str]:
    """Pick how to start ranks, and say why.

    Args:
        requested: "auto", "fork", "server" or "spawn".
        hazard: what makes forking this process unsafe (a key of ``HAZARDS``, as
            :func:`fork_hazard` returns), or None.
        platform: ``sys.platform``.

    Returns:
        (start method, reason in a few words).

    Raises:
        ValueError: "fork" asked for where it is unsafe or impossible, or an
            unknown ``hazard``.

    Example:
        >>> choose_start_method("auto", "autograd", "linux")[0]
        'server'
    """
    if hazard is not None and hazard not in HAZARDS:
        raise ValueError(
            f"unknown hazard={hazard!r}; pass None or one of {sorted(HAZARDS)}"
        )
    can_fork = hasattr(os, "fork")
    if requested == "fork":
        if not can_fork:
            raise ValueError(
                "start_method='fork' is not possible on this system; "
                "pass start_method='spawn'"
            )
        if hazard is not None:
            raise ValueError(_REFUSALS[hazard])
        return "fork", "asked for"
    if requested in ("server", "spawn"):
        if requested == "server" and not can_fork:
            raise ValueError(
                "start_method='server' needs fork; pass start_method='spawn'"
            )
        return requested, "asked for"
    if not can_fork:
        return "spawn", "this system cannot fork"
    if hazard is not None:
        return "server", HAZARDS[hazard]
    if platform == "darwin":
        return "server", "macOS system libraries are not safe to fork"
    return "fork", "fastest: ranks are forked from this kernel"
