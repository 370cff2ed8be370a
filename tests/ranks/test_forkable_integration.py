"""The start decision (workshop/ranks/forkable.py): may the kernel fork its ranks?

On a CPU machine neither hazard can really occur: CUDA cannot start, and autograd's
engine starts no device threads. So the signals are stood in for: a library named like
the CUDA driver, a thread named as autograd names its GPU threads (a real thread of a
real process, named through prctl), a task folder that lists one. The real triggers on
a GPU are in test_gpu.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import workshop
from workshop.ranks import forkable, launcher, start
from workshop.ranks.forkable import AUTOGRAD, CUDA, HAZARDS, choose_start_method

pytestmark = pytest.mark.usefixtures("no_leftover_children")


def _rank_sum():
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return t.item()


def test_start_method_choice_and_reasons():
    assert choose_start_method("auto", None, "linux") == (
        "fork",
        "fastest: ranks are forked from this kernel",
    )
    assert choose_start_method("auto", CUDA, "linux") == (
        "server",
        "CUDA is initialised in this kernel, so it must not fork",
    )
    assert choose_start_method("auto", AUTOGRAD, "linux") == (
        "server",
        "this kernel ran a backward pass on a GPU machine: "
        "ranks start from the fork server",
    )
    assert choose_start_method("auto", None, "darwin")[0] == "server"
    assert choose_start_method("spawn", CUDA, "linux") == ("spawn", "asked for")
    assert choose_start_method("server", AUTOGRAD, "linux") == ("server", "asked for")
    with pytest.raises(
        ValueError,
        match=r"start_method='fork' but CUDA is already "
        r"initialised in this process.*pass start_method='server'",
    ):
        choose_start_method("fork", CUDA, "linux")
    with pytest.raises(
        ValueError,
        match=r"start_method='fork' but this kernel ran a backward pass on a GPU "
        r"machine.*Unable to handle autograd's threading.*pass "
        r"start_method='server' \(or 'auto'\), or restart the kernel",
    ):
        choose_start_method("fork", AUTOGRAD, "linux")
    with pytest.raises(ValueError, match=r"unknown hazard=True; pass None or one of"):
        choose_start_method("auto", True, "linux")


def test_autograd_threads_are_read_from_the_task_folder(tmp_path):
    for task, name in [
        ("10", "python3"),
        ("11", "pt_autograd_1"),
        ("12", "pt_autograd_0"),
    ]:
        (tmp_path / task).mkdir()
        (tmp_path / task / "comm").write_text(name + "\n")
    (tmp_path / "13").mkdir()  # a thread that ended while the folder was read
    assert forkable.autograd_threads(str(tmp_path)) == [
        "pt_autograd_0",
        "pt_autograd_1",
    ]
    assert forkable.autograd_threads(str(tmp_path / "missing")) == []  # no /proc


def test_a_cpu_backward_pass_starts_no_autograd_thread(script):
    # Where torch sees no GPU, the engine runs a backward on the calling thread: the
    # signal stays off, and this process may fork (the reason the CPU suite needs a
    # stand-in to take the GPU node's path).
    s = script("""
        import torch
        from workshop.ranks import forkable
        from workshop.env import visible_gpu_count
        w = torch.ones(3, requires_grad=True)
        (w * w).sum().backward()
        print("gpus", visible_gpu_count(), "threads", forkable.autograd_threads(),
              "hazard", forkable.fork_hazard(), flush=True)
    """)
    out = s.finish(120)
    assert s.popen.returncode == 0, out
    if torch.cuda.device_count() == 0:
        assert "gpus 0 threads [] hazard None" in out


def test_without_the_driver_library_nothing_has_started(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert forkable._driver_loaded(str(maps)) is False
    # The runtime (libcudart) is not the driver: torch's CUDA build loads it at import.
    maps.write_text(maps.read_text() + "7f02-7f03 r-xp 0 08:01 2 /x/libcudart.so.13\n")
    assert forkable._driver_loaded(str(maps)) is False
    driver = "7f04-7f05 r-xp 0 08:01 3 /usr/lib/x86_64-linux-gnu/libcuda.so.1\n"
    maps.write_text(maps.read_text() + driver)
    assert forkable._driver_loaded(str(maps)) is True
    assert forkable._driver_loaded(str(tmp_path / "missing")) is True  # cannot tell


def test_the_fork_decision_follows_torchs_fork_poisoning(script, tmp_path):
    # A fresh "kernel" loads a library named like the CUDA driver, as `import torch`
    # does on some GPU nodes: that alone must not stop forking. Then it asks the CUDA
    # runtime (torch.cuda.is_available(), as a learner might), after which torch
    # marks forked children as unable to use CUDA: ranks must come from the server,
    # and the kernel is told once. The same holds on a GPU node with the real driver.
    s = script(f"""
        import ctypes, shutil, _ctypes, sys
        import torch, workshop
        import workshop.ranks.launcher
        from workshop.ranks.forkable import _cuda_initialized
        shutil.copy(_ctypes.__file__, {str(tmp_path / "libcuda.so.1")!r})
        ctypes.CDLL({str(tmp_path / "libcuda.so.1")!r})
        # A GPU node counts its GPUs with NVML, which marks no fork. Without NVML
        # (this machine, maybe) torch would ask the runtime instead: count as NVML.
        workshop.ranks.launcher.visible_gpu_count = lambda: max(
            torch.cuda._device_count_nvml(), 0)
        def rank():
            import torch.distributed as dist
            return dist.get_rank()
        print("driver mapped:", "libcuda.so" in open("/proc/self/maps").read())
        print("before:", _cuda_initialized(), flush=True)
        r = workshop.launch(rank, world_size=2, backend="gloo", show="none")
        print("first launch:", r.start_method, r.returns, flush=True)
        torch.cuda.is_available()  # asks the CUDA runtime: later forks are marked
        print("after:", _cuda_initialized(), flush=True)
        for _ in range(2):
            r = workshop.launch(rank, world_size=2, backend="gloo", show="none")
            print("next launch:", r.start_method, r.returns, flush=True)
        try:
            workshop.launch(rank, world_size=2, backend="gloo", start_method="fork")
        except ValueError as exc:
            print("fork refused:", str(exc)[:60], flush=True)
    """)
    out = s.finish(180)
    assert s.popen.returncode == 0, out
    assert "driver mapped: True\nbefore: False\nfirst launch: fork [0, 1]\n" in out
    assert "after: True\n" in out
    assert out.count("next launch: server [0, 1]\n") == 2, out
    assert out.count("CUDA is already initialised in this kernel") == 1, out  # once
    assert "fork refused: start_method='fork' but CUDA is already initialised" in out


def test_a_kernel_with_autograd_gpu_threads_starts_ranks_from_the_server(script):
    # What a GPU node shows after the kernel's first backward pass, stood in for by a
    # real thread that names itself as autograd's GPU thread does. Before it the
    # kernel forks; after it: the server, the reason in the header, the explanation
    # once, ranks that run their own backward pass, "fork" refused, and the doctor
    # saying the same.
    s = script("""
        import ctypes, threading, time
        import torch, workshop
        import torch.distributed as dist
        from workshop.machine import doctor

        def rank_backward():
            w = torch.ones(2, requires_grad=True)
            (w * (dist.get_rank() + 1)).sum().backward()
            return w.grad.tolist()

        def start_method_row():
            rows = doctor.collect_rows()
            return next(r for r in rows if r[1] == "start method")[2]

        r = workshop.launch(rank_backward, world_size=2, backend="gloo", show="none")
        print("before:", r.start_method, r.returns, flush=True)
        print("doctor before:", start_method_row(), flush=True)
        w = torch.ones(2, requires_grad=True)
        (w * w).sum().backward()  # the kernel trains (no thread on a CPU machine)
        named = threading.Event()
        def autograd_gpu_thread():
            libc = ctypes.CDLL(None)
            libc.prctl(15, b"pt_autograd_0", 0, 0, 0)  # PR_SET_NAME
            named.set()
            threading.Event().wait()
        threading.Thread(target=autograd_gpu_thread, daemon=True).start()
        named.wait(10)
        for _ in range(2):
            r = workshop.launch(rank_backward, world_size=2, backend="gloo",
                                show="lines")
            print("after:", r.start_method, r.returns, flush=True)
        print("doctor after:", start_method_row(), flush=True)
        try:
            workshop.launch(rank_backward, world_size=2, start_method="fork")
        except ValueError as exc:
            print("fork refused:", exc, flush=True)
    """)
    out = s.finish(240)
    assert s.popen.returncode == 0, out
    assert "before: fork [[1.0, 1.0], [2.0, 2.0]]\n" in out
    assert "doctor before: fork (fastest: ranks are forked from this kernel)" in out
    reason = HAZARDS[AUTOGRAD]
    assert out.count(f"start_method=server ({reason})") == 2, out
    assert out.count("after: server [[1.0, 1.0], [2.0, 2.0]]\n") == 2, out
    assert out.count("this kernel ran a backward pass on a GPU machine, which") == 1
    assert f"doctor after: server ({reason})" in out
    assert "fork refused: start_method='fork' but this kernel ran a backward" in out


def test_the_answer_is_kept_once_poisoned(monkeypatch):
    monkeypatch.setattr(forkable, "_POISONED", True)
    monkeypatch.setattr(forkable, "_driver_loaded", lambda maps_file: True)
    assert forkable._cuda_initialized() is True
    monkeypatch.setattr(forkable, "_driver_loaded", lambda maps_file: False)
    assert forkable._cuda_initialized() is False  # no driver: nothing has started


@pytest.mark.parametrize("hazard", [CUDA, AUTOGRAD])
def test_a_kernel_that_cannot_fork_uses_the_server_and_is_told(
    monkeypatch, capsys, hazard
):
    monkeypatch.setattr(forkable, "fork_hazard", lambda: hazard)
    monkeypatch.setattr(launcher, "_told", set())
    result = workshop.launch(_rank_sum, world_size=2, backend="gloo", show="lines")
    assert result.start_method == "server"
    assert result.returns == [3.0, 3.0]
    out, err = capsys.readouterr()
    assert out.startswith(
        f"launch: world_size=2, backend=gloo, start_method=server ({HAZARDS[hazard]})"
    )
    assert err.count(forkable.EXPLANATIONS[hazard]) == 1
    workshop.launch(_rank_sum, world_size=2, backend="gloo", show="none")
    assert forkable.EXPLANATIONS[hazard] not in capsys.readouterr().err  # told once
    with pytest.raises(ValueError, match="start_method='fork' but"):
        workshop.launch(_rank_sum, world_size=2, start_method="fork")


@pytest.mark.parametrize("gpus", [0, 1])
def test_a_forked_launch_on_a_gpu_machine_warms_up_the_fork_server(monkeypatch, gpus):
    # On a GPU machine the kernel may soon stop being forkable, so a forked launch
    # starts the server in the background; the first launch that needs it finds the
    # same server. A machine without a GPU never needs it after a fork.
    monkeypatch.setattr(launcher, "visible_gpu_count", lambda: gpus)
    start.SERVER.close()
    result = workshop.launch(_rank_sum, world_size=2, backend="gloo", show="none")
    assert result.start_method == "fork"
    if not gpus:
        assert start.SERVER.popen is None
        return
    warm = start.SERVER.popen
    assert warm is not None and warm.poll() is None
    monkeypatch.setattr(forkable, "fork_hazard", lambda: AUTOGRAD)
    result = workshop.launch(_rank_sum, world_size=2, backend="gloo", show="none")
    assert result.start_method == "server" and result.returns == [3.0, 3.0]
    assert start.SERVER.popen is warm  # the one started in the background
