"""workshop.cluster.commands: the command lines of torchrun and mpirun, running them
from a notebook cell with their output streamed, and leaving no process behind whatever
happens: a failure, a timeout, an interrupt, one "node" failing, the kernel killed.

Most tests run tiny scripts written to tmp_path; a few run the real torchrun and
mpirun on slurm/train_ddp.py, with ``--batch 1024`` (one step per epoch) to keep
them to seconds on two cores."""

from __future__ import annotations

import doctest
import io
import os
import re
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

from workshop.cluster import commands, gpu_split, run
from workshop.cluster.commands import (
    CommandError,
    free_port,
    mpirun_command,
    run_command,
    run_commands,
    torchrun_command,
)
from workshop.cluster.gpu_split import GpuSplit, split_for, split_gpus
from workshop.cluster.mpi_info import mpi_installation
from workshop.ranks import streams
from workshop.ranks.streams import display_command, python_paths, rewrite_line

pytestmark = pytest.mark.usefixtures("no_leftover_children")

PYTHON = sys.executable
TORCHRUN = str(Path(PYTHON).parent / "torchrun")
TRAIN = str(ROOT / "slurm" / "train_ddp.py")

needs_mpirun = pytest.mark.skipif(
    shutil.which("mpirun") is None,
    reason="needs Open MPI's mpirun (make setup installs it as root: openmpi-bin)",
)


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


# --- nothing left behind ----------------------------------------------------------


# --- the real launchers on the real script --------------------------------------------


@pytest.mark.parametrize(
    ("command", "env", "major", "expected"),
    [
        (["torchrun", "s.py"], {}, None, ("PET_LOG_DIR", "workshop-torchrun-")),
        (["torchrun", "--log-dir=x", "s.py"], {}, None, (None, "")),
        (["mpirun", "-np", "2", "s.py"], {}, 4,
         ("OMPI_MCA_orte_tmpdir_base", "workshop-mpirun-")),
        (["/opt/ompi/bin/mpirun", "s.py"], {}, 5,
         ("PRTE_MCA_prte_top_session_dir", "workshop-mpirun-")),
        (["mpirun", "s.py"], {}, None, (None, "")),  # not Open MPI
        (["mpirun", "--mca", "orte_tmpdir_base", "/x", "s.py"], {}, 4, (None, "")),
        (["mpirun", "s.py"], {"OMPI_MCA_orte_tmpdir_base": "/x"}, 4, (None, "")),
        (["python", "s.py"], {}, 4, (None, "")),
    ],
)  # fmt: skip
def test_torchrun_and_mpirun_get_a_folder_of_their_own_unless_given_one(
    monkeypatch, command, env, major, expected
):
    monkeypatch.setattr(run, "open_mpi_major", lambda program, path: major)
    assert run.scratch_variable(command, env) == expected


@needs_mpirun
def test_the_installed_open_mpi_s_major_version_is_read():
    installed, expected = mpi_installation(), None
    if installed.implementation == "Open MPI":  # 4 for 3.x and 4.x, 5 from 5.0 on
        expected = min(5, max(4, int(installed.version.split(".")[0])))
    assert run.open_mpi_major("mpirun", os.environ.get("PATH")) == expected
    assert run.open_mpi_major("no-such-mpirun", os.environ.get("PATH")) is None
