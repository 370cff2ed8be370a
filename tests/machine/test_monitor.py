"""workshop.machine.monitor: the Monitor samples this machine in a thread that always
stops, sees a busy loop's CPU, records steps and phases in order, reads the GPUs where
nvidia-smi lists some, and ``python -m workshop monitor`` writes a CSV and stops on
SIGTERM.

Every comparison of measured CPU has a wide margin: the 2-core machine the tests run
on is shared with other work.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time

import pytest
import torch

import workshop
from workshop.__main__ import main
from workshop.machine import monitor as monitor_module
from workshop.machine.monitor import Monitor


def _busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))


def _monitor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "workshop-monitor"]


def test_samples_have_sane_ranges():
    with Monitor(interval=0.05) as mon:
        time.sleep(0.6)
    assert len(mon.samples) >= 3
    times = [s.time for s in mon.samples]
    assert times == sorted(times) and times[0] > 0
    for s in mon.samples:
        assert 0 <= s.cpu_percent <= 100
        assert 0 <= s.process_cpu_percent <= 100
        assert s.memory_gib > 0
        assert s.disk_read_mb_s >= 0 and s.network_mb_s >= 0


def test_the_thread_stops_on_exit_and_when_the_body_raises():
    with Monitor(interval=0.05) as mon:
        assert mon.running and len(_monitor_threads()) >= 1
    assert not mon.running
    with pytest.raises(ZeroDivisionError), Monitor(interval=0.05) as failing:
        assert failing.running
        1 / 0  # noqa: B018
    assert not failing.running
    assert _monitor_threads() == []


def test_steps_and_phases_are_recorded_in_order():
    with Monitor(interval=0.05) as mon:
        with mon.phase("first"):
            for _ in range(5):
                _busy(0.02)
                mon.step()
        with mon.phase("second"):
            for _ in range(3):
                mon.step()
    assert len(mon.steps) == 8
    assert mon.steps == sorted(mon.steps)
    (first, a0, a1), (second, b0, b1) = mon.phases
    assert (first, second) == ("first", "second")
    assert a0 <= mon.steps[0] and mon.steps[4] <= a1 <= b0 <= mon.steps[5]
    assert mon.steps[-1] <= b1
    rows = mon.table().splitlines()
    assert rows[0].split()[:4] == ["phase", "seconds", "steps", "ms/step"]
    assert rows[1].split()[0] == "first" and rows[1].split()[2] == "5"
    assert rows[2].split()[0] == "second" and rows[2].split()[2] == "3"


def test_the_table_fits_88_columns_with_long_phase_names_and_gpus():
    from workshop.machine.monitor_plot import Sample

    mon = Monitor(interval=0.05)  # filled by hand: what a long recording holds
    long = "decode the JPEG files in the training loop, eight workers, pinned memory"
    mon.phases = [(long, 0.0, 5000.0), ("decoded ahead", 5000.0, 9000.0)]
    mon.steps = [float(t) for t in range(10, 9000, 10)]
    mon.samples = [
        Sample(float(t), 99.0, 50.0, 300.0, 0.0, 0.0, (97.0,) * 8, (70.0,) * 8)
        for t in range(1, 9000)
    ]
    mon._end = 9000.0
    rows = mon.table().splitlines()
    assert max(map(len, rows)) <= 88
    assert rows[0].endswith("GPU %")
    assert rows[1].startswith("decode the JPEG files") and "..." in rows[1]
    assert rows[1].split()[-6:] == ["5000.0", "500", "10000.0", "99", "50", "97"]
    assert rows[2].startswith("decoded ahead ")


@pytest.mark.backward_in_process  # trains in this process: see conftest.py
def test_train_marks_every_step_through_progress():
    data = torch.utils.data.TensorDataset(
        torch.randn(64, 1, 16, 16), torch.randint(10, (64,))
    )
    loader = workshop.make_loader(data, 16, shuffle=True)
    with Monitor(interval=0.05) as mon:
        history = workshop.train(
            workshop.SmallCNN(),
            loader,
            epochs=2,
            device="cpu",  # the step marks, not the device, are tested here
            progress=mon.progress(enabled=False),
        )
    assert history.steps == 8
    assert len(mon.steps) == 8 and mon.steps == sorted(mon.steps)


def test_gpu_fields_follow_what_nvidia_smi_lists():
    listed = 0
    smi = shutil.which("nvidia-smi")
    if smi:
        query = [smi, "--query-gpu=index", "--format=csv,noheader"]
        out = subprocess.run(query, capture_output=True, text=True, timeout=30)
        listed = sum(line.strip().isdigit() for line in out.stdout.splitlines())
    with Monitor(interval=0.1) as mon:
        time.sleep(0.5)
    assert mon.samples
    if listed:
        assert mon.gpu_source in ("NVML", "nvidia-smi")
        for s in mon.samples:
            assert len(s.gpu_percent) == len(s.gpu_memory_gib) >= 1
            assert all(0 <= v <= 100 for v in s.gpu_percent if v == v)  # not NaN
    else:
        assert mon.gpu_source == "none"
        assert all(s.gpu_percent == () for s in mon.samples)
    with Monitor(interval=0.1, gpu=False) as without:
        time.sleep(0.2)
    assert without.gpu_source == "none"


@pytest.mark.parametrize("interval", [0, -1, 0.01, float("inf"), "fast", True])
def test_a_bad_interval_is_refused(interval):
    with pytest.raises(ValueError, match=r"interval=.* must be seconds between"):
        Monitor(interval=interval)


def test_a_monitor_starts_once():
    started = r"started already; make a new"
    with Monitor(interval=0.05) as mon, pytest.raises(RuntimeError, match=started):
        mon.start()


def test_a_failing_sampler_is_reported_when_it_stops(monkeypatch):
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:  # the first reading, in start(), works
            raise OSError("no such file: /proc/diskstats")
        return real(*args, **kwargs)

    real = monitor_module.read_counters
    monkeypatch.setattr(monitor_module, "read_counters", failing)
    failed = r"stopped sampling: no such file"
    with pytest.raises(RuntimeError, match=failed), Monitor(interval=0.05):
        time.sleep(0.3)
    assert _monitor_threads() == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["--interval", "0"], "argument --interval: 0 is not a number above 0"),
        (["--seconds", "-3"], "argument --seconds: -3 is not a number above 0"),
    ],
)
def test_the_command_refuses_bad_arguments(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["monitor", *args, "--output", str(tmp_path / "m.csv")])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "m.csv").exists()
