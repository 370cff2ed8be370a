"""workshop.cluster.commands: the command lines of torchrun and mpirun, running them
from a notebook cell with their output streamed, and leaving no process behind whatever
happens: a failure, a timeout, an interrupt, one "node" failing, the kernel killed.

Most tests run tiny scripts written to tmp_path; a few run the real torchrun and
mpirun on slurm/train_ddp.py, with ``--batch 1024`` (one step per epoch) to keep
them to seconds on two cores."""

from __future__ import annotations

import _thread
import doctest
import io
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import ROOT

from workshop.cluster import commands, gpu_split
from workshop.cluster.commands import (
    CommandError,
    free_port,
    mpirun_command,
    run_command,
    run_commands,
    torchrun_command,
)
from workshop.cluster.gpu_split import GpuSplit, split_for, split_gpus
from workshop.env import choose_backend, visible_gpu_count
from workshop.ranks import streams
from workshop.ranks.streams import display_command, python_paths, rewrite_line

pytestmark = pytest.mark.usefixtures("no_leftover_children")

PYTHON = sys.executable
TORCHRUN = str(Path(PYTHON).parent / "torchrun")
TRAIN = str(ROOT / "slurm" / "train_ddp.py")
FAST = ("--batch", "1024")  # one optimizer step per epoch: seconds, not tens
MARK = "WORKSHOP_TEST_MARK"
GLOG = re.compile(r"^[IWEF]\d{4} ", re.M)

needs_mpirun = pytest.mark.skipif(
    shutil.which("mpirun") is None,
    reason="needs Open MPI's mpirun (make setup installs it as root: openmpi-bin)",
)
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


def _script(folder: Path, source: str, name: str = "s.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


# --- command lines --------------------------------------------------------------------


def test_one_node_torchrun_is_standalone_and_uses_the_torchrun_beside_python():
    assert torchrun_command(
        TRAIN, "--epochs", 1, nproc_per_node=2, max_restarts=1, python=PYTHON
    ) == [
        TORCHRUN, "--standalone", "--nproc_per_node=2", "--max_restarts=1",
        TRAIN, "--epochs", "1",
    ]  # fmt: skip


def test_many_nodes_meet_at_a_c10d_rendezvous():
    assert torchrun_command(
        TRAIN, nproc_per_node=4, nnodes=2, rdzv_endpoint="node001:29400", rdzv_id="j7"
    ) == [
        TORCHRUN, "--nnodes=2", "--nproc_per_node=4", "--rdzv_backend=c10d",
        "--rdzv_endpoint=node001:29400", "--rdzv_id=j7", TRAIN,
    ]  # fmt: skip


def test_without_torchrun_beside_python_it_runs_the_module(tmp_path):
    python = str(tmp_path / "python")  # a folder without torchrun
    assert torchrun_command(TRAIN, nproc_per_node=1, python=python) == [
        python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
        TRAIN,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nproc_per_node": 0},
         "nproc_per_node must be a whole number, 1 or more; got 0"),
        ({"nproc_per_node": True}, "nproc_per_node must be .* got True"),
        ({"nproc_per_node": 1, "nnodes": 0}, "nnodes must be .* got 0. Pass nnodes=2"),
        ({"nproc_per_node": 1, "max_restarts": -1}, "max_restarts must be a whole "
         "number, 0 or more; got -1"),
        ({"nproc_per_node": 1, "nnodes": 2}, r"nnodes=2 needs rdzv_endpoint='host:port'"
         r".*first node's host name.*127\.0\.0\.1:\{free_port\(\)\}"),
        ({"nproc_per_node": 1, "rdzv_endpoint": "node001"},
         "rdzv_endpoint='node001' is not 'host:port'"),
        ({"nproc_per_node": 1, "rdzv_endpoint": "node001:http"}, "is not 'host:port'"),
    ],
)  # fmt: skip
def test_torchrun_command_says_what_to_pass(kwargs, message):
    with pytest.raises(ValueError, match=message):
        torchrun_command(TRAIN, **kwargs)


def test_a_missing_script_is_named_with_the_folder_it_was_looked_for_in():
    message = f"script 'nope.py' not found; .* current folder, {re.escape(os.getcwd())}"
    with pytest.raises(FileNotFoundError, match=message):
        torchrun_command("nope.py", nproc_per_node=1)
    if shutil.which("mpirun"):
        with pytest.raises(FileNotFoundError, match=message):
            mpirun_command("nope.py", np=1)


@needs_mpirun
def test_mpirun_command_exports_the_rendezvous(monkeypatch):
    monkeypatch.setattr(commands, "usable_cores", lambda: 2)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)  # not inside a Slurm job
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    # What this machine should give: without ssh or rsh (a slim container, a GPU
    # node), Open MPI's remote-shell launcher is turned off (the next test pins that).
    remote_shell = shutil.which("ssh") or shutil.which("rsh")
    here = [] if remote_shell else ["--mca", "plm", "^rsh"]
    assert mpirun_command(TRAIN, "--epochs", 1, np=2, master_port=29400) == [
        "mpirun", "-np", "2", *here,
        "-x", "MASTER_ADDR=127.0.0.1", "-x", "MASTER_PORT=29400",
        PYTHON, TRAIN, "--epochs", "1",
    ]  # fmt: skip
    # More ranks than cores, as root, with a PYTHONPATH to pass on; a free port.
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    words = mpirun_command(TRAIN, np=3, master_addr="node001", python="py")
    assert words[:5] == ["mpirun", "-np", "3", "--oversubscribe", "--allow-run-as-root"]
    assert words[5 : 5 + len(here)] == here
    rest = words[5 + len(here) :]
    assert rest[:3] == ["-x", "MASTER_ADDR=node001", "-x"]
    assert 0 < int(rest[3].removeprefix("MASTER_PORT=")) < 65536
    assert rest[4:] == ["-x", "PYTHONPATH", "py", TRAIN]


@needs_mpirun
def test_mpirun_command_without_ssh_starts_ranks_here(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(commands, "usable_cores", lambda: 2)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    found = shutil.which
    hidden = ("ssh", "rsh")
    monkeypatch.setattr(
        shutil, "which", lambda name, **k: None if name in hidden else found(name, **k)
    )
    words = mpirun_command(TRAIN, np=1, master_port=29400)
    assert words[:6] == ["mpirun", "-np", "1", "--mca", "plm", "^rsh"]


def test_mpirun_command_says_how_to_install_open_mpi(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(
        FileNotFoundError,
        match=r"'mpirun' not found.*apt install openmpi-bin.*module load openmpi",
    ):
        mpirun_command(TRAIN, np=2)


@needs_mpirun
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"np": 0}, "np must be a whole number, 1 or more; got 0. Pass np=2"),
     ({"np": 2, "master_port": 70000}, "master_port must be a port number 1-65535, "
      "got 70000; pass master_port=None")],
)  # fmt: skip
def test_mpirun_command_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        mpirun_command(TRAIN, **kwargs)


def test_free_port_can_be_bound_and_lies_below_the_systems_own_range():
    import socket

    from workshop.cluster.ports import LOWEST, ephemeral_start

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    if ephemeral_start() - LOWEST >= 1000:  # else quiet_ports goes above the range
        assert LOWEST <= port < ephemeral_start()


def test_docstring_examples_run(monkeypatch):
    monkeypatch.chdir(ROOT)  # the examples name slurm/train_ddp.py
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner()
    tests = finder.find(commands) + finder.find(streams) + finder.find(gpu_split)
    if shutil.which("mpirun") is None:
        tests = [t for t in tests if not t.name.endswith("mpirun_command")]
    assert sum(len(t.examples) for t in tests) >= 10
    for test in tests:
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


# --- agents on one machine share its GPUs --------------------------------------------

CPU_NOTE = (
    'the agents run on the CPU with gloo (CUDA_VISIBLE_DEVICES=""); NCCL needs a GPU '
    "of its own for every rank, and agents on one machine would all start at cuda:0"
)


def _seen(split: GpuSplit) -> list[str | None]:
    return [env.get("CUDA_VISIBLE_DEVICES") for env in split.envs]


def test_without_a_gpu_agents_are_left_alone():
    assert split_gpus([2, 2], 0, {}) == GpuSplit([{}, {}])
    # CUDA_VISIBLE_DEVICES="" already hides every GPU.
    assert split_gpus([1, 1], 4, {"CUDA_VISIBLE_DEVICES": ""}) == GpuSplit([{}, {}])


def test_one_gpu_for_two_agents_sends_them_to_the_cpu_with_one_note():
    split = split_gpus([1, 1], 1, {})
    assert _seen(split) == ["", ""]
    assert split.note == f"note: 2 agents x 1 rank need 2 GPUs, 1 visible: {CPU_NOTE}"
    assert split_gpus([2, 2], 1, {}).note == (
        f"note: 2 agents x 2 ranks need 4 GPUs, 1 visible: {CPU_NOTE}"
    )


def test_two_gpus_give_each_agent_its_own_or_none_when_too_few():
    split = split_gpus([1, 1], 2, {})
    assert _seen(split) == ["0", "1"]
    assert split.note == (
        "note: 2 agents x 1 rank, 2 GPUs visible: each agent gets GPUs of its own, "
        "as on separate nodes (CUDA_VISIBLE_DEVICES 0 / 1)"
    )
    split = split_gpus([2, 2], 2, {})
    assert _seen(split) == ["", ""]
    assert split.note == f"note: 2 agents x 2 ranks need 4 GPUs, 2 visible: {CPU_NOTE}"


def test_four_gpus_are_split_in_order_as_many_as_each_agent_has_ranks():
    assert _seen(split_gpus([2, 2], 4, {})) == ["0,1", "2,3"]
    assert _seen(split_gpus([1, 1], 4, {})) == ["0", "1"]  # GPUs 2 and 3 stay idle
    split = split_gpus([1, 3], 4, {})
    assert _seen(split) == ["0", "1,2,3"]
    assert split.note.startswith("note: 2 agents with 1 + 3 ranks, 4 GPUs visible: ")
    assert _seen(split_gpus([1, 1, 1], 4, {})) == ["0", "1", "2"]
    split = split_gpus([4, 4], 4, {})
    assert _seen(split) == ["", ""]
    assert split.note == f"note: 2 agents x 4 ranks need 8 GPUs, 4 visible: {CPU_NOTE}"


def test_an_existing_cuda_visible_devices_list_is_what_is_shared():
    assert _seen(split_gpus([1, 1], 2, {"CUDA_VISIBLE_DEVICES": "2, 3"})) == ["2", "3"]
    uuids = {"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb,GPU-cc,GPU-dd"}
    assert _seen(split_gpus([2, 2], 4, uuids)) == ["GPU-aa,GPU-bb", "GPU-cc,GPU-dd"]
    # CUDA stops reading the list at a negative entry: one GPU, too few for two.
    assert _seen(split_gpus([1, 1], 1, {"CUDA_VISIBLE_DEVICES": "5,-1,6"})) == ["", ""]


def test_only_two_or_more_launchers_are_split():
    assert split_gpus([2], 1, {}) == GpuSplit([{}])  # one agent: its ranks agree
    split = split_gpus([None, 1, None, 1], 2, {})  # commands that are no launcher
    assert split.envs == [
        {},
        {"CUDA_VISIBLE_DEVICES": "0"},
        {},
        {"CUDA_VISIBLE_DEVICES": "1"},
    ]
    assert split_gpus([None, 1], 1, {}) == GpuSplit([{}, {}])


def test_the_ranks_of_a_torchrun_command_are_read_from_it(monkeypatch):
    seen: list = []
    monkeypatch.setattr(gpu_split, "split_gpus", lambda *a: seen.append(a))
    monkeypatch.setattr(gpu_split, "visible_gpu_count", lambda: 3)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2,3")
    node = torchrun_command(TRAIN, nproc_per_node=3, nnodes=2, rdzv_endpoint="h:1")
    module = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", TRAIN]
    split_for(
        [node, module, [TORCHRUN, TRAIN], [TORCHRUN, "--nproc_per_node=gpu", TRAIN],
         [PYTHON, TRAIN]],
        {"CUDA_VISIBLE_DEVICES": "2,3", "GONE": None},
    )  # fmt: skip
    [(ranks, gpu_count, environ)] = seen
    assert ranks == [3, 2, 1, None, None] and gpu_count == 3
    assert environ["CUDA_VISIBLE_DEVICES"] == "2,3" and "GONE" not in environ
    # Fewer than two agents: the GPUs are not even counted.
    assert split_for([node, [PYTHON, TRAIN]], None) == GpuSplit([{}, {}])
    assert len(seen) == 1


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


# --- what is shown ----------------------------------------------------------------


def test_torchrun_log_lines_lose_their_prefix_and_the_interpreter_path():
    pythons = python_paths("/work/main/.venv/bin/python")
    line = (
        "E1122 17:21:59.420000 10371 torch/distributed/elastic/multiprocessing/api.py"
        ":1002] failed (exitcode: 1) local_rank: 1 (pid: 10378) of binary: "
        "/work/main/.venv/bin/python3"
    )
    assert rewrite_line(line, pythons) == (
        "[torchrun] failed (exitcode: 1) local_rank: 1 (pid: 10378) of binary: python"
    )
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    assert rewrite_line(line.replace("python3", version), pythons).endswith(
        "of binary: python"
    )
    real = os.path.realpath(PYTHON)
    assert rewrite_line(f"W1122 01:02:03.400 9 a.py:1] ran {real} -u", [real]) == (
        "[torchrun] ran python -u"
    )


def test_the_omp_num_threads_banner_is_left_out_and_other_lines_kept():
    prefix = "W1122 17:29:13.563000 11637 torch/distributed/run.py:982]"
    banner = [
        f"{prefix} ",
        f"{prefix} *****************************************",
        f"{prefix} Setting OMP_NUM_THREADS environment variable for each process to "
        "be 1 in default, to avoid your system being overloaded, please further tune "
        "the variable for optimal performance in your application as needed. ",
    ]
    assert [rewrite_line(line) for line in banner] == [None, None, None]
    kept = ["[rank0]: Traceback (most recent call last):", "epoch 0: eval", "", "***"]
    assert [rewrite_line(line) for line in kept] == kept
    assert rewrite_line(f"{prefix} Sending process 11731 closing signal SIGTERM") == (
        "[torchrun] Sending process 11731 closing signal SIGTERM"
    )


def test_the_shown_command_is_short_and_quoted(tmp_path):
    script = str(tmp_path / "a b.py")
    line = display_command([TORCHRUN, PYTHON, script, "--x=1"], {"A": "x y"}, tmp_path)
    assert line == "A='x y' torchrun python 'a b.py' --x=1"


def test_output_is_streamed_live_stdout_and_stderr_apart(tmp_path, monkeypatch):
    # The script cannot end until its first line has reached this sys.stdout.
    go = tmp_path / "go"
    script = _script(tmp_path, f"""
        import sys, time
        from pathlib import Path
        print("first")
        print("to stderr", file=sys.stderr)
        deadline = time.monotonic() + 20
        while not Path({str(go)!r}).exists():
            if time.monotonic() > deadline:
                sys.exit("first line never shown")
            time.sleep(0.02)
        print("second")
    """)  # fmt: skip

    class Screen(io.StringIO):
        def write(self, text: str) -> int:
            if "first" in text:
                go.touch()
            return super().write(text)

    out, err = Screen(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    result = run_command([PYTHON, script.name], cwd=tmp_path, timeout=30)
    assert out.getvalue() == "$ python s.py\nfirst\nsecond\n"
    assert err.getvalue() == "to stderr\n"
    assert (result.returncode, result.stdout, result.stderr) == (
        0, "first\nsecond\n", "to stderr\n",
    )  # fmt: skip
    assert result.command == [PYTHON, "s.py"] and 0 < result.seconds < 30


def test_the_environment_is_this_one_plus_env(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TO_REMOVE", "x")
    monkeypatch.setenv("KEPT", "k")
    show = "import os; print([os.environ.get(k) for k in ('ADDED', 'TO_REMOVE', "
    show += "'KEPT', 'PYTHONUNBUFFERED', 'TORCH_DISABLE_SHARE_RDZV_TCP_STORE')])"
    result = run_command(
        [PYTHON, "-c", show], env={"ADDED": "a", "TO_REMOVE": None}, timeout=30
    )
    assert result.stdout == "['a', None, 'k', '1', None]\n"
    assert capsys.readouterr().out.startswith("$ ADDED=a python -c ")


def test_torchrun_gets_a_fresh_store_per_round_and_its_lines_are_tidied(
    tmp_path, capsys
):
    # A stand-in named torchrun: it prints what torchrun would, and the variable.
    fake = _script(tmp_path, f"""\
        #!{PYTHON}
        import os, sys
        print(os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"])
        p = "W1122 17:29:13.563000 11637 torch/distributed/run.py:982]"
        print(p, "*****", file=sys.stderr)
        print(p, "failed (exitcode: 1) of binary:", {PYTHON!r}, file=sys.stderr)
    """, name="torchrun")  # fmt: skip
    fake.chmod(0o755)
    result = run_command([str(fake), "--standalone"], cwd=tmp_path, timeout=30)
    assert result.stdout == "1\n"
    assert result.stderr == "[torchrun] failed (exitcode: 1) of binary: python\n"
    shown = capsys.readouterr()
    assert shown.out == (
        "$ TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone\n1\n"
    )
    assert shown.err == result.stderr


# --- errors ---------------------------------------------------------------------------


def test_a_failure_names_the_command_the_code_and_the_last_stderr_lines(tmp_path):
    script = _script(tmp_path, """
        import sys
        for i in range(12):
            print(f"problem {i}", file=sys.stderr)
        sys.exit(3)
    """)  # fmt: skip
    message = (
        r"`python s\.py` exited with code 3\. The end of its stderr:\n    problem 2\n"
    )
    with pytest.raises(CommandError, match=message) as caught:
        run_command([PYTHON, "s.py"], cwd=tmp_path, show=False, timeout=30)
    assert "problem 1\n" not in str(caught.value)
    assert str(caught.value).endswith("problem 11")
    assert isinstance(caught.value, RuntimeError)
    assert caught.value.results[0].returncode == 3
    result = run_command([PYTHON, script], check=False, show=False, timeout=30)
    assert result.returncode == 3 and result.stderr.count("problem") == 12


def test_an_unknown_program_says_what_to_install(monkeypatch, tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"'no-such-program' not found.*install"
    ):
        run_command(["no-such-program"], show=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"'torchrun' not found.*pip install"):
        run_command(["torchrun", "x.py"], show=False)
    with pytest.raises(ValueError, match="timeout must be a number of seconds above 0"):
        run_command([PYTHON], timeout=0)


def test_a_command_given_as_a_string_is_refused_with_its_list_form(capsys):
    # A string would be iterated letter by letter: "program 'e' not found".
    with pytest.raises(
        TypeError,
        match=r"^run_command\(command\) must be a list of words, not a string: got "
        r"'echo hi'\. Pass \['echo', 'hi'\] \(shlex\.split\('echo hi'\) gives it\); "
        r"no shell runs the command, so pipes, \$VARIABLES and && would not work",
    ):
        run_command("echo hi", show=False)
    with pytest.raises(TypeError, match=r"must be a list of words, like \[sys\."):
        run_command(Path("s.py"), show=False)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError,
        match=r"^run_commands takes a list of commands, each a list of words; got "
        r"the string 'echo hi'\. For one command call run_command\(\['echo', 'hi'\]\)"
        r", or run_commands\(\[\['echo', 'hi'\]\]\)$",
    ):
        run_commands("echo hi", show=False)
    with pytest.raises(
        TypeError,
        match=r"got a list of strings, \['echo hi', 'ls -l'\]\. If that is one "
        r"command, call run_command\(\['echo hi', 'ls -l'\]\); if each string is a "
        r"command, split each: run_commands\(\[\['echo', 'hi'\], \['ls', '-l'\]\]\)$",
    ):
        run_commands(["echo hi", "ls -l"], show=False)
    with pytest.raises(
        TypeError,
        match=r"^run_commands: command 1 must be a list of words, not a string: got "
        r"'ls -l'\. Pass \['ls', '-l'\]",
    ):
        run_commands([[PYTHON, "-V"], "ls -l"], show=False)
    assert capsys.readouterr().out == ""  # refused before anything was shown or run


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


# --- nothing left behind ----------------------------------------------------------


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

    def interrupt_when_both_ranks_are_up() -> None:
        deadline = time.monotonic() + 60
        while len(list(ranks.glob("*.log"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        _thread.interrupt_main()  # the kernel's stop button

    if end == "interrupt":
        threading.Thread(target=interrupt_when_both_ranks_are_up, daemon=True).start()
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


# --- the real launchers on the real script --------------------------------------------


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
