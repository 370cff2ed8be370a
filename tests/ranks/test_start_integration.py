"""What ranks commonly import is imported once, before the first fork: by the kernel
on the fork path, by the fork server at its start; never touching CUDA. Each check
that needs a fresh kernel runs a small script (the test process may have imported
torch._dynamo already, and must stay forkable on a GPU node)."""

from __future__ import annotations

import json

import pytest

from workshop.ranks import start as preload_module
from workshop.ranks.start import PRELOAD_VAR, WANTED, preload

# What a rank finds already imported when it starts (checked before fn does anything).
RANK_SEES = """
    import json, os, sys, workshop
    import torch

    WANTED = ("torch._dynamo", "torch.distributed.fsdp", "torch.distributed.tensor")

    def seen():
        return [name for name in WANTED if name in sys.modules]
"""


def test_every_entry_names_modules_and_optional_attributes():
    assert ("torch._dynamo",) in WANTED
    for choices in WANTED:
        assert choices and all(c.startswith("torch.") for c in choices)
        assert all(c.count(":") <= 1 for c in choices)


def test_a_missing_module_is_skipped_and_the_next_choice_is_taken():
    done = preload(
        (
            ("no_such_module_of_the_workshop",),
            ("no_such_module_either:thing", "json:dumps"),
            ("json:no_such_name", "os.path:join"),
            ("json:no_such_name",),
        )
    )
    assert done.imported == ["json:dumps", "os.path:join"]
    assert done.missing == ["no_such_module_of_the_workshop", "json:no_such_name"]
    assert done.seconds >= 0 and not done.skipped


def test_the_variable_turns_it_off(monkeypatch):
    monkeypatch.setenv(PRELOAD_VAR, "0")
    monkeypatch.setattr(preload_module, "_DONE", None)
    done = preload()
    assert done.skipped and done.imported == [] and done.missing == []
    assert preload() is done  # once per process, whatever it did


def test_preload_imports_the_modules_and_never_starts_cuda(script):
    # Every torch.cuda call that may start the driver is recorded while preloading.
    s = script(
        """
    import json, sys, threading, workshop
    import torch
    from workshop.ranks import forkable
    from workshop.ranks.start import preload

    calls = []

    def recorder(owner, name):
        real = getattr(owner, name)

        def record(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)

        setattr(owner, name, record)

    for name in ("is_available", "device_count", "init", "_lazy_init",
                 "current_device", "get_device_properties", "get_device_capability",
                 "set_device", "synchronize"):
        recorder(torch.cuda, name)
    for name in ("_cuda_init", "_cuda_getDeviceCount"):
        if hasattr(torch._C, name):
            recorder(torch._C, name)
    threads = threading.active_count()
    done = preload()
    print(json.dumps({
        "imported": done.imported,
        "missing": done.missing,
        "again": preload() is done,
        "in_sys_modules": [m for m in ("torch._dynamo", "torch.distributed.fsdp",
                                       "torch.distributed.tensor",
                                       "torch.nn.parallel") if m in sys.modules],
        "cuda_calls": calls,
        "cuda_initialized": torch.cuda.is_initialized(),
        "new_threads": threading.active_count() - threads,
        "autograd_threads": forkable.autograd_threads(),
        "hazard": forkable.fork_hazard(),
        "seconds": done.seconds,
        "rss_mb": done.rss_mb,
    }), flush=True)
    """
    )
    out = s.finish(180)
    assert s.popen.returncode == 0, out
    done = json.loads(out.strip().splitlines()[-1])
    assert "torch._dynamo" in done["imported"]
    assert "torch.nn.parallel:DistributedDataParallel" in done["imported"]
    assert any(i.endswith(":fully_shard") for i in done["imported"])
    assert any(i.endswith(":DTensor") for i in done["imported"])
    assert done["again"] is True
    assert done["in_sys_modules"] == [
        "torch._dynamo",
        "torch.distributed.fsdp",
        "torch.distributed.tensor",
        "torch.nn.parallel",
    ]
    # Nothing asked CUDA anything: the kernel can still fork on a GPU node.
    assert done["cuda_calls"] == [] and done["cuda_initialized"] is False
    assert done["new_threads"] == 0 and done["autograd_threads"] == []
    assert done["hazard"] is None
    assert done["seconds"] > 0 and done["rss_mb"] >= 0


@pytest.mark.parametrize(
    "method, preloaded", [("fork", True), ("server", True), ("fork", False)]
)
def test_ranks_start_with_the_modules_already_imported(script, method, preloaded):
    off = "" if preloaded else f"os.environ[{PRELOAD_VAR!r}] = '0'\n    "
    s = script(
        RANK_SEES
        + f"""
    {off}kernel_before = seen()
    r = workshop.launch(seen, world_size=2, backend="gloo", start_method={method!r},
                        show="none")
    print(json.dumps({{"kernel_before": kernel_before, "ranks": r.returns,
                       "kernel_after": seen(),
                       "cuda": torch.cuda.is_initialized()}}), flush=True)
    """
    )
    out = s.finish(240)
    assert s.popen.returncode == 0, out
    seen = json.loads(out.strip().splitlines()[-1])
    assert "torch._dynamo" not in seen["kernel_before"]  # a fresh kernel
    everything = ["torch._dynamo", "torch.distributed.fsdp", "torch.distributed.tensor"]
    if preloaded:
        assert seen["ranks"] == [everything, everything]
    else:
        assert all("torch._dynamo" not in rank for rank in seen["ranks"])
    # The kernel imports them only for ranks it forks itself (the server has its own).
    kernel_imports = method == "fork" and preloaded
    assert ("torch._dynamo" in seen["kernel_after"]) is kernel_imports
    assert seen["cuda"] is False
