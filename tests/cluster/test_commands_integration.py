"""The slow tests of test_commands.py (they start process trees, torchrun and mpirun):
make test runs them, make test-fast leaves them out: agents, timeouts and interrupts of
real process trees, and real torchrun and mpirun."""

from __future__ import annotations

import _thread
import io
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import ROOT, interrupt_when_written
from test_commands import CPU_NOTE, PYTHON, TORCHRUN, TRAIN, _script, needs_mpirun

from workshop.cluster import gpu_split
from workshop.cluster.commands import (
    CommandError,
    free_port,
    mpirun_command,
    run_command,
    run_commands,
    torchrun_command,
)
from workshop.env import choose_backend, visible_gpu_count

pytestmark = pytest.mark.usefixtures("no_leftover_children")


FAST = ("--batch", "1024")  # one optimizer step per epoch: seconds, not tens


MARK = "WORKSHOP_TEST_MARK"


GLOG = re.compile(r"^[IWEF]\d{4} ", re.M)


needs_torchrun = pytest.mark.skipif(
    not Path(TORCHRUN).exists(), reason=f"needs torchrun beside {PYTHON}"
)


# Stands in for a training script: says it is up, leaves its pid in a folder, waits.
# One write per line: torchrun runs workers unbuffered (python -u), where print()
# writes the text and the newline apart, and the ranks share one pipe.
SLEEPER = """
import os, sys, time
from pathlib import Path
sys.stdout.write(f"worker {os.getpid()} up" + chr(10))
Path(sys.argv[1], f"{os.getpid()}.pid").touch()
time.sleep(120)
"""


def _marked(mark: str) -> list[int]:
    """Live processes whose environment carries ``mark``: everything a command
    started, whatever session or process group it put itself in."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if needle in environ.split(b"\0"):
                found.append(int(entry.name))
    return found


def _none_marked(mark: str, within: float = 10.0) -> list[int]:
    """Wait until no process carries ``mark``; return those still there."""
    deadline = time.monotonic() + within
    while (left := _marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.fixture
def mark():
    """A unique mark to put in a command's environment; the test fails if any
    process carrying it is left afterwards."""
    value = uuid.uuid4().hex
    yield value
    left = _none_marked(value)
    for pid in left:  # so that one failure does not slow down the tests after it
        os.kill(pid, signal.SIGKILL)
    assert left == [], "processes of the command were left behind"


TWO_GPUS_NOTE = (
    "note: 2 agents x 1 rank, 2 GPUs visible: each agent gets GPUs of its own, as on "
    "separate nodes (CUDA_VISIBLE_DEVICES 0 / 1)"
)


@pytest.mark.parametrize(
    ("gpus", "given", "shown_first"),
    [
        (0, [None, None], "[node 0] $ TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun "),
        (1, ["", ""], f"note: 2 agents x 1 rank need 2 GPUs, 1 visible: {CPU_NOTE}"),
        (2, ["0", "1"], TWO_GPUS_NOTE),
    ],
)
def test_two_agents_started_together_get_their_share(
    tmp_path, monkeypatch, capsys, gpus, given, shown_first
):
    # A stand-in named torchrun says which GPUs it was given.
    fake = _script(tmp_path, f"""\
        #!{PYTHON}
        import os
        print(repr(os.environ.get("CUDA_VISIBLE_DEVICES")))
    """, name="torchrun")  # fmt: skip
    fake.chmod(0o755)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpu_split, "visible_gpu_count", lambda: gpus)
    agent = [str(fake), "--nproc_per_node=1", "train.py"]
    results = run_commands(
        [agent, agent], labels=["node 0", "node 1"], cwd=tmp_path, timeout=30
    )
    assert [r.stdout for r in results] == [f"{value!r}\n" for value in given]
    shown = capsys.readouterr().out
    assert shown.startswith(shown_first)
    assert shown.count("note: ") == (gpus > 0)
    if given[1] is not None:  # each agent's $ line shows what it was given
        variable = f"CUDA_VISIBLE_DEVICES={shlex.quote(given[1])}"
        assert f"\n[node 1] $ TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 {variable} " in shown


def test_a_timeout_stops_a_tree_that_ignores_sigterm(tmp_path, mark):
    # Like torchrun: children in sessions of their own; unlike it, all of them
    # ignore SIGTERM, so only SIGKILL after the grace period ends them.
    _script(tmp_path, """
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        # One write per line: unbuffered (PYTHONUNBUFFERED=1), print() writes the
        # text and the newline apart, and two processes share this pipe.
        child = ("import signal, sys, time; "
                 "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                 "sys.stdout.write('child up' + chr(10)); time.sleep(120)")
        for _ in range(2):
            subprocess.Popen([sys.executable, "-c", child], start_new_session=True)
        time.sleep(120)
    """)  # fmt: skip
    started = time.monotonic()
    with pytest.raises(
        CommandError,
        match=r"`python s\.py` ran past timeout=2 s, so every process was stopped "
        r"\(SIGTERM, then SIGKILL after 0\.5 s\)\. If it needs longer, pass a longer "
        r"timeout, e.g\. timeout=4$",
    ) as caught:
        run_command(
            [PYTHON, "s.py"], cwd=tmp_path, env={MARK: mark}, timeout=2, grace=0.5,
            show=False,
        )  # fmt: skip
    assert time.monotonic() - started < 8
    assert caught.value.results[0].stdout == "child up\nchild up\n"
    assert caught.value.results[0].returncode == -signal.SIGKILL


def test_when_one_node_fails_the_others_are_stopped(tmp_path, mark, capsys):
    up = [
        "-c",
        "import pathlib, time; print('up', flush=True); "
        "pathlib.Path('up').touch(); time.sleep(60)",
    ]
    fail = ["-c", "import pathlib, sys, time\nwhile not pathlib.Path('up').exists(): "
            "time.sleep(0.02)\nsys.exit('node lost')"]  # fmt: skip
    started = time.monotonic()
    with pytest.raises(
        CommandError,
        match=r"exited with code 1 \(the others were stopped, as a job ends when a "
        r"node fails\)\. The end of its stderr:\n    node lost$",
    ) as caught:
        run_commands(
            [[PYTHON, *up], [PYTHON, *fail]], labels=["node 0", "node 1"],
            env={MARK: mark}, cwd=tmp_path, timeout=30,
        )  # fmt: skip
    assert time.monotonic() - started < 10
    first, second = caught.value.results
    assert (first.label, first.returncode, first.stdout) == ("node 0", -15, "up\n")
    assert (second.label, second.returncode) == ("node 1", 1)
    shown = capsys.readouterr()
    assert shown.out.startswith(f"[node 0] $ {MARK}={mark} python -c ")
    assert f"\n[node 1] $ {MARK}={mark} python -c " in shown.out
    assert shown.out.endswith("\n[node 0] up\n")
    assert shown.err == "[node 1] node lost\n"


def test_what_a_command_leaves_running_when_it_ends_is_stopped(tmp_path, mark):
    # As when torchrun is killed (the OOM killer) and its workers live on.
    _script(tmp_path, """
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         start_new_session=True, stdout=subprocess.DEVNULL)
        print("leaving")
    """)  # fmt: skip
    result = run_command([PYTHON, "s.py"], cwd=tmp_path, env={MARK: mark}, timeout=30)
    assert (result.returncode, result.stdout) == (0, "leaving\n")


# A rank that leaves, in a file named by its pid, where torchrun told it to write its
# error file (in torchrun's log folder), then ends as told or waits to be stopped.
RANK_LOGS = """
import os, sys, time
from pathlib import Path
error_file = os.environ["TORCHELASTIC_ERROR_FILE"]
Path(sys.argv[1], f"{os.getpid()}.log").write_text(error_file)
if sys.argv[2] == "wait":
    time.sleep(120)
sys.exit(int(sys.argv[2] == "fail"))
"""


@needs_torchrun
@pytest.mark.parametrize("end", ["done", "fail", "interrupt"])
def test_torchrun_leaves_nothing_in_the_temporary_folder(
    tmp_path, mark, monkeypatch, end
):
    # Left alone, torchrun makes a torchelastic_* folder per run in the temporary
    # folder and leaves it. Here that folder (this process's and, through TMPDIR,
    # torchrun's) is one of this test's own, so that only this run's entries count.
    temp, ranks = tmp_path / "tmp", tmp_path / "ranks"
    temp.mkdir()
    ranks.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    _script(tmp_path, RANK_LOGS)
    command = torchrun_command(tmp_path / "s.py", ranks, end, nproc_per_node=2)

    if end == "interrupt":
        interrupt_when_written(ranks, count=2)
        with pytest.raises(KeyboardInterrupt, match=r"^interrupted; stopped"):
            run_command(command, env={MARK: mark}, timeout=60, show=False)
    else:
        result = run_command(
            command, env={MARK: mark}, timeout=60, show=False, check=False
        )
        assert result.returncode == (1 if end == "fail" else 0), result.stderr
    # torchrun wrote in a folder of the workshop's own, in the temporary folder...
    written = [Path(p.read_text()) for p in ranks.glob("*.log")]
    assert len(written) == 2
    for path in written:
        assert path.relative_to(temp).parts[0].startswith("workshop-torchrun-")
    # ... which is gone, with nothing else left there.
    assert sorted(temp.iterdir()) == []


def test_an_error_while_showing_output_stops_everything(tmp_path, mark, monkeypatch):
    class BrokenScreen(io.StringIO):
        def write(self, text: str) -> int:
            if "working" in text:
                raise OSError("the cell's output is gone")
            return super().write(text)

    monkeypatch.setattr(sys, "stdout", BrokenScreen())
    busy = "import time; print('working', flush=True); time.sleep(60)"
    started = time.monotonic()
    with pytest.raises(OSError, match="the cell's output is gone"):
        run_command([PYTHON, "-c", busy], env={MARK: mark}, timeout=30)
    assert time.monotonic() - started < 10


@needs_torchrun
def test_an_interrupt_stops_torchrun_and_its_workers(tmp_path, mark, capsys):
    _script(tmp_path, SLEEPER)

    def interrupt_when_both_workers_are_up() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if len(list(tmp_path.glob("*.pid"))) == 2:
                _thread.interrupt_main()  # what the kernel's stop button does: SIGINT
                return
            time.sleep(0.05)

    command = torchrun_command(tmp_path / "s.py", tmp_path, nproc_per_node=2)
    threading.Thread(target=interrupt_when_both_workers_are_up, daemon=True).start()
    with pytest.raises(
        KeyboardInterrupt,
        match=r"^interrupted; stopped `\S*torchrun --standalone .*` and every "
        r"process it started$",
    ) as caught:
        run_command(command, cwd=tmp_path, env={MARK: mark}, timeout=60)
    workers = [int(p.stem) for p in tmp_path.glob("*.pid")]
    assert len(workers) == 2
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]
    shown = capsys.readouterr()
    assert shown.out.count(" up\n") == 2
    # A notebook shows the message alone, not the frames of the keeper's pipes.
    assert caught.value._render_traceback_() == [f"KeyboardInterrupt: {caught.value}"]
    assert type(caught.value) is KeyboardInterrupt  # a script still ends with 130


# A stand-in for a notebook kernel. It needs workshop.cluster.commands only, so it skips
# the package's __init__ (which imports torch: seconds of start-up on two cores).
KERNEL = """
import sys, types
sys.modules["workshop"] = package = types.ModuleType("workshop")
package.__path__ = [{folder!r}]
from workshop.cluster.commands import run_command
run_command({command!r}, env={{"{MARK}": {mark!r}}}, cwd={cwd!r}, timeout=120)
"""


@pytest.mark.parametrize("launcher", ["torchrun", "mpirun"])
def test_a_killed_kernel_leaves_no_process_behind(
    launcher, tmp_path, mark, script, monkeypatch
):
    if (
        shutil.which(launcher, path=f"{Path(PYTHON).parent}:{os.environ['PATH']}")
        is None
    ):
        pytest.skip(f"needs {launcher}")
    _script(tmp_path, SLEEPER)
    temp = tmp_path / "tmp"  # the kernel's temporary folder, and torchrun's
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    if launcher == "torchrun":
        command = torchrun_command(tmp_path / "s.py", tmp_path, nproc_per_node=2)
    else:
        command = mpirun_command(tmp_path / "s.py", tmp_path, np=2)
    kernel = script(
        KERNEL.format(command=command, MARK=MARK, mark=mark, cwd=str(tmp_path),
                      folder=str(ROOT / "workshop"))
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    tree = _marked(mark)  # the keeper, the launcher and its two ranks
    assert len(tree) >= 4, kernel.lines
    # Neither launcher keeps its ranks in its own process group, and torchrun not
    # even in its session: signalling the launcher's group would miss them.
    workers = [int(p.stem) for p in tmp_path.glob("*.pid")]
    launcher_pid = int(Path(f"/proc/{workers[0]}/stat").read_text().split()[3])
    assert os.getpgid(workers[0]) != os.getpgid(launcher_pid)
    if launcher == "torchrun":
        assert os.getsid(workers[0]) != os.getsid(launcher_pid)
    if launcher == "torchrun":  # its log folder, made by the kernel
        assert [p.name[:18] for p in temp.iterdir()] == ["workshop-torchrun-"]
    os.kill(kernel.popen.pid, signal.SIGKILL)  # the kernel dies; nothing may survive
    kernel.popen.wait(10)
    assert _none_marked(mark) == []
    if launcher == "torchrun":  # removed by the keeper, the last of the tree to end
        assert sorted(temp.iterdir()) == []


def _backend(ranks: int, gpus: int | None = None) -> str:
    """What the script's ranks use: process_group's backend "auto" for ``ranks``
    ranks on this machine (NCCL with a GPU each, else gloo)."""
    return choose_backend("auto", ranks, gpus)


@needs_torchrun
def test_real_torchrun_on_one_node(tmp_path, mark):
    command = torchrun_command(TRAIN, "--epochs", 1, *FAST, nproc_per_node=2)
    result = run_command(command, cwd=tmp_path, env={MARK: mark}, timeout=120)
    assert result.stdout.startswith(
        f"2 ranks on 1 node(s), started by torchrun, backend {_backend(2)}, attempt 0\n"
    )
    assert "  rank 1: local rank 1 on node 0 " in result.stdout
    assert re.search(
        r"epoch 0: eval accuracy 0\.\d+, checkpoint saved\n", result.stdout
    )
    assert "done: weight checksum" in result.stdout
    assert (tmp_path / "train_ddp.pt").exists()
    assert "OMP_NUM_THREADS" not in result.stderr and not GLOG.search(result.stderr)


@needs_torchrun
def test_real_torchrun_restarts_after_a_rank_dies(tmp_path, mark):
    command = torchrun_command(
        TRAIN, "--crash-in-epoch", 1, "--epochs", 2, *FAST, nproc_per_node=2,
        max_restarts=1,
    )  # fmt: skip
    result = run_command(command, cwd=tmp_path, env={MARK: mark}, timeout=180)
    story = [
        f"started by torchrun, backend {_backend(2)}, attempt 0\n",
        "epoch 0: eval accuracy",
        f"started by torchrun, backend {_backend(2)}, attempt 1\n",
        "resuming from train_ddp.pt at epoch 1\n",
        "epoch 1: eval accuracy",
        "done: weight checksum",
    ]
    where = [result.stdout.find(part) for part in story]
    assert -1 not in where and where == sorted(where), result.stdout
    # Rank 1 dies in the first attempt; its line may come before or after rank 0's
    # line about epoch 0, since the two ranks print at the same time.
    died = result.stdout.find("rank 1 dies in epoch 1\n")
    assert where[0] < died < where[2], result.stdout
    assert re.search(
        # The first failure torchrun saw: rank 1, or rank 0 if its peer's death
        # broke it within the same check. The binary is "python" where torchrun
        # names this interpreter; elsewhere it may name another path to it
        # (/usr/bin/python3.12 seen on a GPU node).
        r"^\[torchrun\] failed \(exitcode: 1\) local_rank: [01] \(pid: \d+\) "
        r"of binary: \S*python\S*$",
        result.stderr,
        re.M,
    ), result.stderr


@needs_torchrun
def test_real_two_node_rendezvous_on_this_machine(tmp_path, mark, capsys):
    endpoint = f"127.0.0.1:{free_port()}"
    node = torchrun_command(
        TRAIN, "--epochs", 1, *FAST, nproc_per_node=1, nnodes=2, rdzv_endpoint=endpoint
    )
    results = run_commands(
        [node, node], labels=["node 0", "node 1"], cwd=tmp_path, env={MARK: mark},
        timeout=120,
    )  # fmt: skip
    assert [r.returncode for r in results] == [0, 0]
    text = "".join(r.stdout for r in results)
    # Each agent gets a GPU of its own where there are two; with one, both run on
    # the CPU (and a note says so); with none, on the CPU anyway.
    gpus = visible_gpu_count()
    backend = _backend(1, gpus=1 if gpus >= 2 else 0)
    assert f"2 ranks on 2 node(s), started by torchrun, backend {backend}" in text
    assert "rank 0: local rank 0 on node 0 " in text
    assert "rank 1: local rank 0 on node 1 " in text
    shown = capsys.readouterr().out
    assert re.search(r"^\[node [01]\] 2 ranks on 2 node\(s\)", shown, re.M), shown
    assert ("need 2 GPUs, 1 visible: the agents run on the CPU" in shown) == (
        gpus == 1
    ), shown


@needs_mpirun
def test_real_mpirun(tmp_path, mark):
    command = mpirun_command(TRAIN, "--epochs", 1, *FAST, np=2)
    result = run_command(command, cwd=tmp_path, env={MARK: mark}, timeout=120)
    assert result.stdout.startswith(
        f"2 ranks on 1 node(s), started by mpirun, backend {_backend(2)}, attempt 0\n"
    )
    assert "done: weight checksum" in result.stdout
