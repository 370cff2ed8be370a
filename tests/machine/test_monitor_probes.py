"""workshop.machine.monitor_probes: Linux's counters read from a /proc laid out in a
folder, one sample from two readings (never a division by zero), and the GPU readers.
"""

from __future__ import annotations

import math
import os
import shutil
import stat
import sys

import pytest

from workshop.machine.monitor_probes import (
    ADMIN_COMMANDS,
    Gpus,
    admin_commands,
    difference,
    read_counters,
)

STAT = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\n"
MEMINFO = "MemTotal:       8388608 kB\nMemFree:  1 kB\nMemAvailable:   6291456 kB\n"
DISKSTATS = (
    "   8       0 sda 10 0 2000 0 0 0 0 0 0 0 0\n"
    "   8       1 sda1 10 0 1000 0 0 0 0 0 0 0 0\n"
    "   7       0 loop0 5 0 4000 0 0 0 0 0 0 0 0\n"
    " 253       0 dm-0 5 0 8000 0 0 0 0 0 0 0 0\n"
)
NET = (
    "Inter-|   Receive |  Transmit\n"
    " face |bytes packets errs drop fifo frame compressed multicast|bytes packets\n"
    "    lo: 9999 1 0 0 0 0 0 0 9999 1 0 0 0 0 0 0\n"
    "  eth0: 3000 1 0 0 0 0 0 0 1000 1 0 0 0 0 0 0\n"
)


def _proc_stat(utime: int, stime: int, reaped: int = 0) -> str:
    # pid (comm) state ppid ... utime, stime, cutime, cstime are fields 14 to 17.
    return f"42 (a name) R 1 2 3 4 5 6 7 8 9 10 {utime} {stime} {reaped} 0 20 0 1\n"


def fake_proc(tmp_path):
    """A /proc with two processes: 42 and its child 43; /sys/block beside it."""
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    (proc / "stat").write_text(STAT)
    (proc / "meminfo").write_text(MEMINFO)
    (proc / "diskstats").write_text(DISKSTATS)
    (proc / "net" / "dev").write_text(NET)
    for pid, ticks, children in ((42, (7, 3, 100), "43 "), (43, (20, 5), "")):
        task = proc / str(pid) / "task" / str(pid)
        task.mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(_proc_stat(*ticks))
        (task / "children").write_text(children)
    for disk in ("sda", "loop0", "dm-0"):
        (tmp_path / "sys" / "block" / disk).mkdir(parents=True)
    return proc


def test_counters_read_from_a_proc_folder(tmp_path):
    counters = read_counters(fake_proc(tmp_path), pid=42)
    assert counters["cpu_total"] == 1000  # the first 8 fields of the "cpu" line
    assert counters["cpu_busy"] == 150  # less idle (800) and iowait (50)
    # 42's 7+3, 100 of its children that exited, and its live child 43's 20+5.
    assert counters["process_ticks"] == 135
    assert counters["memory_total_gib"] == 8
    assert counters["memory_gib"] == 2  # total less available
    # sda only: its partition, the loop device and the mapper volume count twice.
    assert counters["disk_read_bytes"] == 2000 * 512
    assert counters["network_bytes"] == 4000  # eth0 in + out; lo left out


def test_counters_of_this_machine_are_sane():
    counters = read_counters()
    assert 0 < counters["memory_gib"] < counters["memory_total_gib"]
    assert 0 <= counters["cpu_busy"] <= counters["cpu_total"]
    assert counters["process_ticks"] >= 0
    assert counters["disk_read_bytes"] >= 0 and counters["network_bytes"] >= 0


def test_counters_without_proc_say_it_needs_linux(tmp_path):
    with pytest.raises(RuntimeError, match=r"cannot read .*stat.*Linux's /proc"):
        read_counters(tmp_path)


def _counters(**values):
    base = {
        "cpu_busy": 0.0,
        "cpu_total": 0.0,
        "process_ticks": 0.0,
        "memory_gib": 1.0,
        "memory_total_gib": 8.0,
        "disk_read_bytes": 0.0,
        "network_bytes": 0.0,
    }
    return base | values


def test_a_sample_is_the_difference_of_two_readings():
    before = _counters(cpu_busy=100, cpu_total=1000, process_ticks=10)
    after = _counters(
        cpu_busy=150,
        cpu_total=1200,
        process_ticks=30,
        memory_gib=2.5,
        disk_read_bytes=4e6,
        network_bytes=1e6,
    )
    sample = difference(before, after, seconds=2.0, at=3.0)
    assert sample.time == 3.0
    assert sample.cpu_percent == pytest.approx(25.0)  # 50 of 200 ticks
    assert sample.process_cpu_percent == pytest.approx(10.0)  # 20 of 200
    assert sample.memory_gib == 2.5
    assert sample.disk_read_mb_s == pytest.approx(2.0)
    assert sample.network_mb_s == pytest.approx(0.5)
    assert sample.gpu_percent == () and sample.gpu_memory_gib == ()


def test_a_sample_never_divides_by_a_zero_delta():
    same = _counters(cpu_busy=5, cpu_total=10, disk_read_bytes=9)
    sample = difference(same, same, seconds=0.0, at=0.0)
    assert (sample.cpu_percent, sample.process_cpu_percent) == (0.0, 0.0)
    assert (sample.disk_read_mb_s, sample.network_mb_s) == (0.0, 0.0)
    # A counter that went down (a child exited with its ticks, a reset): 0, not < 0.
    lower = _counters(cpu_busy=5, cpu_total=20, process_ticks=-50, disk_read_bytes=0)
    sample = difference(_counters(cpu_busy=5, cpu_total=10), lower, 1.0, 1.0)
    assert sample.process_cpu_percent == 0.0 and sample.disk_read_mb_s == 0.0


def test_no_gpus_when_not_wanted():
    gpus = Gpus(False)
    assert (gpus.source, gpus.count) == ("none", 0)
    assert gpus.read() == ((), ())


def test_nvidia_smi_rows_become_per_gpu_values(tmp_path, monkeypatch):
    # A stand-in nvidia-smi that answers the query as the real one does (MiB), with
    # one GPU that does not say its utilisation.
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '35, 1024'\necho '[N/A], 2048'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # NVML would come first
    gpus = Gpus(True)
    assert (gpus.source, gpus.count) == ("nvidia-smi", 2)
    util, memory = gpus.read()
    assert util[0] == 35.0 and math.isnan(util[1])
    assert memory == (1.0, 2.0)
    fake.write_text("#!/bin/sh\nexit 9\n")  # a query that fails: a gap, no crash
    util, memory = gpus.read()
    assert len(util) == 2 and all(math.isnan(v) for v in util + memory)


def test_admin_commands_run_what_this_machine_has(capsys, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    results = admin_commands(lines=2, timeout_s=10)
    out = capsys.readouterr().out
    assert [c.split()[0] for c, _ in results] == [
        t.split()[0] for t, _ in ADMIN_COMMANDS
    ]
    for command, ran in results:
        here = shutil.which(command.split()[0]) is not None
        assert here or not ran, command  # a missing command never "ran"
        if not here:
            assert f"$ {command}\n  not on this machine" in out
    assert results[-1][1] is False  # sstat needs a job to look at
    assert all(len(line) <= 88 for line in out.splitlines())
