"""What a rank commonly imports, imported once before ranks are forked.

A forked rank inherits every module its parent had imported; whatever the parent had
not, each rank imports by itself, all ranks at once on the same cores. The costly one
is ``torch._dynamo`` (with sympy and triton behind it, about 900 modules): torch.optim
imports it the first time an optimizer is built, and DDP's constructor does too. A
2-rank launch that builds DDP and AdamW and steps once took 1.82 s against 0.10 s for
a trivial launch; with ``torch._dynamo`` imported in the parent first, 0.12 s
(issue 32).

So the fork path calls :func:`preload` before its first fork (``launcher.py``) and the
fork server calls it at its start (``forkserver.py``). The kernel pays it once, at its
first forked launch rather than at ``import workshop`` (a process that never forks
pays nothing; a thread importing in the background could hold an import lock at a
fork): 1.3 to 3.0 s (4.5 s with the cores busy) and 149 MB of RSS, measured on a
2-core VM with torch 2.15 (``docs/benchmarks.md``). Ranks share those pages with the
kernel, where each used to import its own copy. Nothing here touches CUDA: these are
imports only, so a GPU kernel stays forkable (``forkable.py``).
"""

from __future__ import annotations

import importlib
import os
import time
import warnings
from dataclasses import dataclass, field

# Each entry is what a rank uses, as "module" or "module:name"; the first choice
# that imports (and has the name) is kept, and an entry none of whose modules this
# torch has (2.4 to 2.15) is skipped.
WANTED: tuple[tuple[str, ...], ...] = (
    # What torch.optim imports on the first optimizer built, and DDP on its first.
    ("torch._dynamo",),
    ("torch.nn.parallel:DistributedDataParallel",),
    # FSDP2's fully_shard: public from torch 2.6, under _composable in 2.4 and 2.5.
    (
        "torch.distributed.fsdp:fully_shard",
        "torch.distributed._composable.fsdp:fully_shard",
    ),
    ("torch.distributed.fsdp:FullyShardedDataParallel",),
    # DTensor: public from torch 2.5, torch.distributed._tensor in 2.4.
    ("torch.distributed.tensor:DTensor", "torch.distributed._tensor:DTensor"),
    ("torch.distributed.device_mesh:init_device_mesh",),
)

# Set to "0" to start ranks without preloading (to measure what it saves).
PRELOAD_VAR = "WORKSHOP_PRELOAD"


@dataclass
class Preloaded:
    """What :func:`preload` imported, what this torch lacks, and what it cost."""

    imported: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    seconds: float = 0.0
    rss_mb: float = 0.0  # growth of this process's resident memory
    skipped: bool = False  # PRELOAD_VAR=0


_DONE: Preloaded | None = None


def _rss_mb() -> float:
    """This process's resident memory in MB (0 where there is no /proc)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _import_first(choices: tuple[str, ...]) -> str | None:
    """Import the first of ``choices`` that exists; its "module[:name]", or None."""
    for choice in choices:
        module_name, _, name = choice.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception:  # not in this torch (or not built with distributed)
            continue
        if not name or hasattr(module, name):
            return choice
    return None


def preload(wanted: tuple[tuple[str, ...], ...] | None = None) -> Preloaded:
    """Import what ranks commonly use, without touching CUDA.

    Args:
        wanted: the entries to import, each a tuple of choices "module" or
            "module:name" of which the first that imports is kept. None (the
            launcher's call): ``WANTED``, once per process; a later call returns
            the first call's record and imports nothing.

    Returns:
        A :class:`Preloaded`: the choices imported, the entries this torch lacks,
        and the seconds and MB of RSS it cost. With ``WORKSHOP_PRELOAD=0`` in the
        environment nothing is imported and ``skipped`` is True.

    Example:
        >>> preload((("json:dumps",), ("no_such_module",))).missing
        ['no_such_module']
    """
    global _DONE
    if wanted is None and _DONE is not None:
        return _DONE
    done = Preloaded()
    if os.environ.get(PRELOAD_VAR, "1") == "0":
        done.skipped = True
    else:
        rss = _rss_mb()
        t0 = time.perf_counter()
        # A module that warns as it is imported would warn in the cell that
        # launched, about something its code never asked for: the notebook's
        # outputs stay as they were.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for choices in WANTED if wanted is None else wanted:
                found = _import_first(choices)
                if found is None:
                    done.missing.append(choices[0])
                else:
                    done.imported.append(found)
        done.seconds = time.perf_counter() - t0
        done.rss_mb = max(0.0, _rss_mb() - rss)
    if wanted is None:
        _DONE = done
    return done
