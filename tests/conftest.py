"""Shared test helpers: process checks, a way to run a small script as a 'kernel', and
the environments launchers give the tasks they start; what the run starts once for
all its tests (a private Slurm cluster, `make lab`), and how pytest-xdist's workers
share the tests (`-n 3 --dist loadfile`).

Also the run order and a guard that keep the test process forkable on a GPU node.
Two things in the pytest process make forked ranks unusable there (see
workshop/ranks/forkable.py): starting CUDA, and a backward pass with a GPU visible.
So tests run in three groups: the rest first, then those marked
``backward_in_process`` (they run a backward pass here), then those marked ``gpu``.
A test that starts CUDA without the gpu mark, or runs a backward pass without either
mark, fails: on any machine, since a backward pass is counted, not only seen by its
GPU threads. Once a backward pass ran here, later launches take the fork server on
every machine, as they must on a GPU node (the node's signal is stood in for)."""

from __future__ import annotations

import _thread
import contextlib
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import leftovers
import pytest

# The suite never writes to the developer's own record of the lessons (the exercises
# it checks, the cells its kernels run): recording is off for this process and all
# it starts (nbval's kernels, ranks, scripts). A test of the record sets its own
# file (monkeypatch.setenv("WORKSHOP_PROGRESS", str(tmp_path / ...))).
os.environ["WORKSHOP_PROGRESS"] = "off"

from workshop.cluster.commands import free_port  # (the tests import it from here)

ROOT = Path(__file__).resolve().parents[1]
# PMI_ and PMIX_ too: a test run started by srun (--mpi=pmix) or mpirun has them, and
# an mpirun started by a test would take them for its own job's.
_LAUNCHER_PREFIXES = (
    "SLURM_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "RANK",
    "LOCAL_",
    "WORLD_",
    "MASTER_",
)


def repo_pythonpath(environ: dict[str, str] | None = None) -> str:
    """PYTHONPATH for a child process: this checkout first, then what was there.

    Replacing PYTHONPATH would drop folders a site puts on it (a node's kernel
    packages, nbval, a module's torch), and the child could not import them.
    """
    environ = os.environ if environ is None else environ
    # Absolute, so that "." still names this folder in a child started elsewhere.
    before = [
        os.path.abspath(p) for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p
    ]
    return os.pathsep.join([str(ROOT), *(p for p in before if p != str(ROOT))])


def repo_env(**extra: str) -> dict[str, str]:
    """This environment with the checkout importable first, and ``extra`` added."""
    return {**os.environ, "PYTHONPATH": repo_pythonpath(), **extra}


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables, the package importable
    (ahead of what PYTHONPATH already held), and ``extra`` added."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES)}
    env.update(PYTHONPATH=repo_pythonpath(), **extra)
    return env


# --- run order and the CUDA guard ------------------------------------------------


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected
def pytest_configure(config) -> None:
    # A test run started in the background of a shell without job control (`cmd &`
    # in a script) inherits SIGINT ignored, and so would every "kernel" it starts:
    # the interrupt tests need Ctrl-C to raise KeyboardInterrupt, as in a notebook.
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _count_backward_passes()
    config.pluginmanager.register(_NotebookStderr(), "workshop-notebook-stderr")
    # Fails the run on what it left in /tmp, /var/tmp and /dev/shm (issue 47).
    if not config.pluginmanager.is_registered(leftovers):
        config.pluginmanager.register(leftovers, "workshop-leftovers")


class _NotebookStderr:
    """A notebook cell that fails its comparison shows what it printed on stderr.

    nbval's report says only "Unexpected output fields: {'stderr'}" when a cell
    printed a line its stored outputs lack: the line itself, the one thing that says
    why (a warning, a launcher's notice), would be lost with the run. Registered as a
    plugin: a hook of this file would reach only the items under tests/."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if report.when == "call" and report.failed:
            stderr = notebook_stderr(getattr(item, "test_outputs", None))
            if stderr:
                report.sections.append(("what the cell printed on stderr", stderr))


def notebook_stderr(outputs) -> str:
    """The text a notebook cell's outputs hold on stderr ('' for none)."""
    return "".join(
        "".join(out.get("text", ""))
        for out in outputs or ()
        if out.get("output_type") == "stream" and out.get("name") == "stderr"
    )


def pytest_terminal_summary(terminalreporter, config) -> None:
    """Say where the process stopped being forkable, as the doctor would say it."""
    if _BACKWARD["first"] is not None:
        from workshop.ranks.forkable import AUTOGRAD, HAZARDS

        terminalreporter.write_line(
            f"workshop: {HAZARDS[AUTOGRAD]} (the first backward pass in the pytest "
            f"process ran in {_BACKWARD['first']}; on a machine without a GPU this "
            "is stood in for)"
        )


def _run_group(item) -> int:
    """0: the rest, 1: marked backward_in_process, 2: marked gpu."""
    if item.get_closest_marker("gpu") is not None:
        return 2
    return int(item.get_closest_marker("backward_in_process") is not None)


def pytest_collection_modifyitems(config, items) -> None:
    """Run the tests marked ``backward_in_process`` after the others, and those
    marked ``gpu`` last, each group in its collected order.

    After a backward pass here (on a GPU machine) or a CUDA call, this process can
    no longer fork ranks that work: every later ``launch`` takes the fork server and
    ``start_method="fork"`` is refused. Run late, no other test sees that. The last
    test of each file before another group or file is flagged for the fork check
    below.
    """

    items.sort(key=_run_group)  # stable: each group keeps its collected order
    gpu = {id(item) for item in items if _run_group(item) == 2}
    for item, following in zip(items, [*items[1:], None], strict=True):
        item.stash[_CHECK_FORKS_AFTER] = id(item) not in gpu and (
            following is None
            or id(following) in gpu
            or following.nodeid.split("::")[0] != item.nodeid.split("::")[0]
        )


# --- pytest-xdist: which tests a worker runs together ------------------------------
#
# With `-n N --dist loadfile`, pytest-xdist hands each worker whole files in the
# collected order (the order above), and a worker runs what it is given in that
# order. Two things need more than files: the backward_in_process and gpu tests of a
# file must stay behind every other test of the worker (not travel with their
# file's first tests), and the files that use what the run starts once (its private
# Slurm cluster, its `make lab`) must share one worker, or each worker would start
# its own. (xdist's own `--dist loadgroup` would do the second with marks, but with
# pytest 9.2 it ignores them: pytest-dev/pytest-xdist#1386.)

# What a test file's source names when it uses the run's cluster or `make lab`.
_SHARED_NAMES = ("private_slurm", "needs_private_slurm", "make_lab")
_SHARED_SCOPE = "the run's cluster and make lab"


def _xdist_scopes(nodeids: list[str], rootpath: Path) -> dict[str, str]:
    """The work unit of each test: its file's tests in one stretch of the collected
    order (a file whose late tests come back after other files' tests gets a unit
    for each stretch), and the first stretch of every file that names one of
    _SHARED_NAMES in one unit together."""
    shared: dict[str, bool] = {}
    stretches: dict[str, int] = {}
    scopes, previous = {}, None
    for nodeid in nodeids:
        path = nodeid.split("::", 1)[0]
        if path != previous:
            stretches[path] = stretches.get(path, -1) + 1
            previous = path
        if path not in shared:
            try:
                text = (rootpath / path).read_text(errors="replace")
            except OSError:
                text = ""
            named = any(name in text for name in _SHARED_NAMES)
            shared[path] = path.endswith(".py") and named
        stretch = stretches[path]
        if stretch == 0 and shared[path]:
            scopes[nodeid] = _SHARED_SCOPE
        else:
            scopes[nodeid] = f"{path}#{stretch}" if stretch else path
    return scopes


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with the two additions above; other modes as xdist has
    them."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    # xdist would hand out the largest units first: the collected order is kept.
    config.option.loadscopereorder = False

    class Scheduling(LoadFileScheduling):
        def __init__(self, config, log) -> None:
            super().__init__(config, log)
            self._scopes: dict[str, str] = {}

        def schedule(self) -> None:
            if self.collection is None and self.registered_collections:
                collected = next(iter(self.registered_collections.values()))
                self._scopes = _xdist_scopes(list(collected), config.rootpath)
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return self._scopes.get(nodeid) or super()._split_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            # The longest units first, so that no worker is left with one at the
            # end: the run-wide unit, then the notebooks. Both hold tests of the
            # first group only (none of the shared files has backward_in_process
            # or gpu tests; keep it so), so they may go before any other of that
            # group; the later groups' units keep their place at the end.
            for scope in self.workqueue:
                if scope == _SHARED_SCOPE or scope.endswith(".ipynb"):
                    self.workqueue.move_to_end(scope, last=False)
                    break
            super()._assign_work_unit(node)

    return Scheduling(config, log)


_CHECK_FORKS_AFTER = pytest.StashKey[bool]()
# What the guard knows about this process: whether CUDA was started here (then
# there is nothing left to guard), and whether a gpu test has run (it may).
_CUDA_STATE = {"started": False, "gpu_test_ran": False}
_GUARD_HINT = (
    "later launches can no longer fork: mark it gpu (such tests run last) or "
    "run the CUDA part in a rank (launch) or a subprocess"
)
# Backward passes run in this process (torch.autograd.backward and .grad, counted),
# and the first test that ran one.
_BACKWARD: dict = {"count": 0, "seen": 0, "first": None}


def _count_backward_passes() -> None:
    """Count every backward pass of this process. ``Tensor.backward`` calls
    ``torch.autograd.backward`` through the module, so wrapping the module's two
    entry points sees them all (a forked rank counts its own, in its copy)."""
    import functools

    import torch.autograd

    for name in ("backward", "grad"):
        original = getattr(torch.autograd, name)
        if getattr(original, "_counted_by_conftest", False):
            continue

        @functools.wraps(original)
        def counted(*args, _original=original, **kwargs):
            _BACKWARD["count"] += 1
            return _original(*args, **kwargs)

        counted._counted_by_conftest = True
        setattr(torch.autograd, name, counted)


def _stand_in_for_autograd_threads(tmp_root: Path) -> None:
    """Make the launcher see what a GPU node shows after a backward pass: a thread
    named ``pt_autograd_0`` (forkable.TASK_DIR pointed at a folder that lists one).
    On a CPU machine the engine starts none, so without this the CPU suite would
    never take the path the node takes."""
    from workshop.ranks import forkable

    task = tmp_root / "autograd-stand-in" / "1"
    task.mkdir(parents=True, exist_ok=True)
    (task / "comm").write_text("pt_autograd_0\n")
    forkable.TASK_DIR = str(task.parent)


def _cuda_context_started() -> bool:
    """torch's own CUDA context exists in this process (never True without a GPU;
    torch is not imported for the question)."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def _forks_are_poisoned() -> bool:
    """Whether torch marks children forked from here as unable to use CUDA; False
    where the CUDA driver library is not even loaded (any machine without a GPU
    driver), without forking. Else one child is forked and asked, as ``launch``
    does; only its real answer counts (``_POISONED``), not a child that did not
    answer in time."""
    from workshop.ranks import forkable

    if not (hasattr(os, "fork") and forkable._driver_loaded()):
        return False
    return forkable._fork_is_poisoned() and forkable._POISONED


@pytest.fixture(scope="session", autouse=True)
def _forks_usable_at_the_start():
    """Note a process that is unusable for forking before any test ran (collection
    asked the CUDA runtime, say where NVML cannot count the GPUs): the guard then
    has nothing to protect, and blames no test."""
    if _forks_are_poisoned():
        _CUDA_STATE["started"] = True
        warnings.warn(
            "the test process could fork no CUDA-using rank before the first test "
            "(the CUDA runtime was asked during collection); launches take the fork "
            "server and start_method='fork' tests fail",
            stacklevel=1,
        )
    yield


@pytest.fixture(autouse=True)
def _cuda_stays_off_in_the_test_process(
    request, tmp_path_factory, _forks_usable_at_the_start
):
    """Fail a test not marked gpu that starts CUDA in this process.

    After every such test: has torch's CUDA context appeared (cheap)? After the
    last one of each file: may forked children still use CUDA? That also catches
    ``torch.cuda.is_available()``, which starts the driver but no context; it
    costs a fork, and only where the CUDA driver is loaded.
    """
    if request.node.get_closest_marker("gpu") is not None:
        _CUDA_STATE["gpu_test_ran"] = True
        yield
        return
    yield
    # Counted since the previous test ended: a module's fixture that trains, set up
    # before this one, is this test's too.
    if _BACKWARD["count"] != _BACKWARD["seen"]:
        _BACKWARD["seen"] = _BACKWARD["count"]
        if _BACKWARD["first"] is None:
            _BACKWARD["first"] = request.node.nodeid
            _stand_in_for_autograd_threads(tmp_path_factory.getbasetemp())
        if request.node.get_closest_marker("backward_in_process") is None:
            pytest.fail(
                f"{request.node.nodeid}: this test (or a fixture it uses) ran a "
                "backward pass in the pytest process; on a GPU machine later "
                "launches could then no longer fork: mark it backward_in_process "
                "(such tests run after the others) or train in a rank (launch) or "
                "a subprocess",
                pytrace=False,
            )
    # Runs after the test's own fixtures are undone (a monkeypatch included), so
    # only a real context counts.
    if _CUDA_STATE["started"] or _CUDA_STATE["gpu_test_ran"]:
        return
    if _cuda_context_started():
        _CUDA_STATE["started"] = True
        pytest.fail(
            f"{request.node.nodeid}: this test (or a fixture it uses) initialised CUDA "
            f"in the pytest process; {_GUARD_HINT}",
            pytrace=False,
        )
    if request.node.stash.get(_CHECK_FORKS_AFTER, False) and _forks_are_poisoned():
        _CUDA_STATE["started"] = True
        pytest.fail(
            f"{request.node.nodeid}: this test or one before it in its file started "
            "CUDA in the pytest process (torch.cuda.is_available(), "
            f"get_device_name() or a CUDA call); {_GUARD_HINT}",
            pytrace=False,
        )


def task_env(launcher: str, rank: int, world_size: int, port: int) -> dict[str, str]:
    """The environment of task ``rank`` of a one-node job, as ``srun`` or ``mpirun``
    sets it, with the rendezvous port exported (srun's address comes from the node
    list, as in a batch script)."""
    if launcher == "srun":
        return clean_env(
            SLURM_JOB_ID="4242",
            SLURM_STEP_ID="0",
            SLURM_PROCID=str(rank),
            SLURM_NTASKS=str(world_size),
            SLURM_LOCALID=str(rank),
            SLURM_NODEID="0",
            SLURM_TASKS_PER_NODE=str(world_size),
            SLURM_JOB_NODELIST="127.0.0.1",
            MASTER_PORT=str(port),
        )
    return clean_env(
        OMPI_COMM_WORLD_RANK=str(rank),
        OMPI_COMM_WORLD_SIZE=str(world_size),
        OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
        OMPI_COMM_WORLD_LOCAL_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


def gone(pids, within: float = 10.0) -> list[int]:
    """Wait for all of ``pids`` to end; return those alive after ``within``."""
    from workshop._procs import is_alive

    deadline = time.monotonic() + within
    while True:
        alive = [p for p in pids if p and is_alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def interrupt_when_written(folder: Path, count: int, within: float = 60) -> None:
    """Press the kernel's stop button (SIGINT, a KeyboardInterrupt in the main
    thread) once ``count`` ranks have written their ``*.log`` in ``folder``, or
    after ``within`` seconds: a test of an interrupt then stops a run whose ranks
    are all up, not one still starting."""

    def wait_then_interrupt() -> None:
        deadline = time.monotonic() + within
        while len(list(folder.glob("*.log"))) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        _thread.interrupt_main()

    threading.Thread(target=wait_then_interrupt, daemon=True).start()


def run_module(module: str, *args: str, timeout: float = 300, **extra_env: str):
    """Run ``python -m module args`` with this checkout importable and ``extra_env``
    set; never raises on a non-zero exit (the tests read the code and the output)."""
    env = repo_env(**extra_env)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def children_of(pid: int) -> list[int]:
    """Live (non-zombie) child processes of ``pid``, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] not in (b"Z", b"X"):
            found.append(int(entry.name))
    return found


def _host_address() -> str:
    """The IPv4 address this machine's host name resolves to, the one Slurm's daemons
    bind to; "" when it does not resolve."""
    import socket

    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return ""


_SLURM_MISSING = shutil.which("slurmctld") is None or os.geteuid() != 0
needs_slurm = pytest.mark.skipif(
    _SLURM_MISSING,
    reason="needs Slurm's daemons and munge, and root to run slurmd "
    "(make setup installs them as root: slurm-wlm munge)",
)
# The private cluster listens on the address the host name resolves to, and
# local_slurm.sh refuses to start where that is not loopback.
needs_private_slurm = pytest.mark.skipif(
    _SLURM_MISSING or not _host_address().startswith("127."),
    reason="needs Slurm's daemons, root, and a host name that resolves to loopback "
    f"(here: {_host_address() or 'none'}), where local_slurm.sh starts a cluster",
)


def wait_exec(pids: list[int], text: str, within: float = 30.0) -> None:
    """Wait until each of ``pids`` runs a command line holding ``text``: until it has
    exec'd, a child just started shows its parent's command line, and a scan of the
    process table for it (portal_status's) misses it (a CI run did)."""
    deadline = time.monotonic() + within
    for pid in pids:
        while text.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, f"pid {pid} never ran {text!r}"
            time.sleep(0.05)


def proxy_missing() -> str | None:
    """Why the portal's proxy cannot run here (portal.proxy_command's own words:
    configurable-http-proxy and node are not installed), or None where it can.
    Imported here, not at the top: the portal's modules are the portal tests'."""
    from workshop.instructor import portal

    try:
        portal.proxy_command()
    except portal.PortalError as error:
        return str(error)
    return None


# --- one private Slurm cluster for the whole run ---------------------------------
#
# Starting and stopping a private cluster costs seconds each time, so one serves
# every cluster test of a run: started when a module first asks for it
# (``private_slurm``), stopped when the run ends. Between modules it is hidden, as
# a module's own cluster was once stopped: SLURM_CONF is unset again and
# slurm_cluster() no longer returns it. A module that left jobs behind does not
# hand them to the next one: they are cancelled, and their processes waited for,
# when it ends. Tests that need a cluster in another state (stopped, killed, never
# started) start their own, and say so.


# Children of this process that the run keeps for all its tests (the watchdog of its
# private cluster, its `make lab`): not left behind by the test that sees them.
_RUN_WIDE_CHILDREN: set[int] = set()


def _hand_over(cluster, previous: str | None) -> None:
    """Hide ``cluster`` from what runs next: SLURM_CONF as it was before (or unset),
    and slurm_cluster() no longer answering with it."""
    from workshop.cluster import slurm_here as module

    if module._PRIVATE is cluster:
        module._PRIVATE = None
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous


def _slurm_quiet(cluster, *command: str) -> str:
    from workshop.cluster.slurm_watchdog import _quiet

    env = dict(os.environ, SLURM_CONF=str(cluster.folder / "slurm.conf"))
    return _quiet(list(command), env, 30)


def _cluster_at_rest(cluster, within: float = 60.0) -> str | None:
    """Cancel every job of ``cluster`` and wait for the queue to empty, the jobs'
    processes to end and every node to be idle; None when it is so, else what is
    not (after ``within`` seconds; what is left of the jobs is killed then)."""
    from workshop.cluster.slurm_watchdog import job_processes

    jobs = _slurm_quiet(cluster, "squeue", "-h", "-o", "%A").split()
    if jobs:
        _slurm_quiet(cluster, "scancel", *jobs)
    deadline = time.monotonic() + within
    while True:
        queued = _slurm_quiet(cluster, "squeue", "-h", "-o", "%A").split()
        processes = job_processes(cluster.folder)
        states = _slurm_quiet(cluster, "sinfo", "-h", "-N", "-o", "%T").split()
        busy = [s for s in states if s != "idle"] or ([] if states else ["none"])
        if not (queued or processes or busy):
            return None
        if time.monotonic() > deadline:
            for pid in processes:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
            return (
                f"after {within:.0f} s: jobs {queued}, their processes {processes}, "
                f"node states {states}"
            )
        time.sleep(0.2)


@pytest.fixture(scope="session")
def _slurm_for_the_run():
    """The private two-node cluster of this run (slurm_cluster() starts it in this
    process), hidden until a module asks for it; stopped at the end of the run,
    which must leave none of its processes."""
    from workshop.cluster import slurm_here as module
    from workshop.cluster.slurm_here import slurm_cluster

    if shutil.which("slurmctld") is None or os.geteuid() != 0:
        pytest.skip("needs Slurm's daemons and root (make setup installs slurm-wlm)")
    before = os.environ.pop("SLURM_CONF", None)
    try:
        started = slurm_cluster()
        if started.available and started.kind != "private":
            # A Slurm answers here already (this machine's own): the tests submit
            # to a private cluster of their own all the same, started beside it.
            try:
                started = module._start_private()
            except RuntimeError as error:
                pytest.skip(f"a Slurm answers here ({started}), and no private "
                            f"cluster could start beside it: {error}")  # fmt: skip
            module._PRIVATE = started
    finally:
        if before is not None:
            os.environ["SLURM_CONF"] = before
    if not started.available:
        pytest.skip(f"no private cluster could start here: {started.reason}")
    _hand_over(started, before)
    folder = started.folder
    watchdog = {started._watchdog.pid} if started._watchdog is not None else set()
    _RUN_WIDE_CHILDREN.update(watchdog)
    yield started
    _RUN_WIDE_CHILDREN.difference_update(watchdog)
    # Stopped as a notebook's kernel stops it: in use (SLURM_CONF set, returned by
    # slurm_cluster()); stop() must put SLURM_CONF back and forget it.
    module._PRIVATE = started
    os.environ["SLURM_CONF"] = str(folder / "slurm.conf")
    started.stop()
    after = os.environ.pop("SLURM_CONF", None)
    if before is not None:
        os.environ["SLURM_CONF"] = before
    assert after is None, f"stop() left SLURM_CONF={after}"
    assert module._PRIVATE is None and not started.available
    assert not folder.exists(), f"the run's private cluster left {folder}"
    left = subprocess.run(["pgrep", "-af", str(folder)], capture_output=True,
                          text=True).stdout.splitlines()  # fmt: skip
    assert not [line for line in left if "pgrep" not in line], left


@pytest.fixture(scope="module")
def private_slurm(_slurm_for_the_run):
    """The run's private cluster, lent to this module: as slurm_cluster() left it
    when it started it here (SLURM_CONF set, slurm_cluster() answering with it), its
    nodes idle and its queue empty. When the module ends its jobs are cancelled and
    it is hidden again."""
    from workshop.cluster import slurm_here as module

    cluster = _slurm_for_the_run
    assert cluster.available, f"the run's private cluster is gone: {cluster.reason}"
    previous = os.environ.get("SLURM_CONF")
    not_at_rest = _cluster_at_rest(cluster)
    assert not_at_rest is None, f"the run's private cluster is busy: {not_at_rest}"
    module._PRIVATE = cluster
    os.environ["SLURM_CONF"] = str(cluster.folder / "slurm.conf")
    try:
        yield cluster
    finally:
        _hand_over(cluster, previous)
        not_at_rest = _cluster_at_rest(cluster)
    assert not_at_rest is None, f"this module's jobs would not end: {not_at_rest}"


@pytest.fixture
def no_leftover_children():
    """Fail a test that leaves a child process of the test process behind (the fork
    server and the launcher's watchdog are the children meant to outlive a launch)."""
    from workshop.ranks import start, sweep

    yield
    kept = {p.pid for p in (start.SERVER.popen, sweep._WATCHDOG) if p is not None}
    kept |= _RUN_WIDE_CHILDREN
    deadline = time.monotonic() + 10
    while True:
        left = [p for p in children_of(os.getpid()) if p not in kept]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"processes left behind: {left}"


class Script:
    """A Python script that plays a notebook kernel, with its output collected by a
    thread so a test can wait for a line without blocking on a pipe."""

    def __init__(self, path: Path):
        import threading

        env = repo_env(PYTHONUNBUFFERED="1")
        self.popen = subprocess.Popen(
            [sys.executable, str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            self.lines.append(line)

    def wait_for(self, marker: str, timeout: float = 60.0) -> str:
        """Wait for a line containing ``marker`` and return it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if marker in line:
                    return line
            if self.popen.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(
            f"{marker!r} did not appear within {timeout} s; output:\n"
            + "".join(self.lines)
        )

    def finish(self, timeout: float = 60.0) -> str:
        """Wait for the script to end; return all it printed."""
        self.popen.wait(timeout)
        self._reader.join(5)
        return "".join(self.lines)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)


@pytest.fixture
def script(tmp_path):
    """Start a script (source text) as a separate 'kernel' process; killed after."""
    started: list[Script] = []

    def start(source: str) -> Script:
        path = tmp_path / f"kernel{len(started)}.py"
        path.write_text(textwrap.dedent(source))
        started.append(Script(path))
        return started[-1]

    yield start
    for s in started:
        s.kill()


@contextlib.contextmanager
def open_to_all(cluster):
    """``cluster`` (private_slurm's) with its folder readable by every user while
    the block runs, then private to root again; yields its slurm.conf. slurm_cluster()
    makes the folder private to root, and a user's sbatch reads slurm.conf there
    (munge's socket is open to all; its key stays root's)."""
    mode = cluster.folder.stat().st_mode & 0o777
    cluster.folder.chmod(0o755)
    try:
        yield cluster.folder / "slurm.conf"
    finally:
        cluster.folder.chmod(mode)


# --- one `make lab` for the run ---------------------------------------------------


class MadeLab:
    """``make lab`` serving the real notebooks/ on a free loopback port (the README's
    first command), as the tests of it started it: ``popen`` leads its process
    group; ``url`` answers with ``?token=TOKEN``."""

    def __init__(self, folder: Path):
        self.port, self.token = free_port(), os.urandom(16).hex()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = folder / "lab.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            ["make", "lab", f"LAB_ARGS=--no-browser --port={self.port} "
             f"--ServerApp.token={self.token} --ServerApp.port_retries=0"],
            cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
            env=repo_env(JUPYTER_RUNTIME_DIR=str(folder / "runtime")),
        )  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def get(self, path: str, timeout: float = 5):
        """The JSON that ``GET path`` answers (OSError while it does not)."""
        import json
        import urllib.request

        url = f"{self.url}{path}?token={self.token}"
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.load(response)

    def wait_ready(self, within: float = 120) -> None:
        """Until /api/status says the server started; fail with its log if make
        ends first or it does not answer in time."""
        deadline = time.monotonic() + within
        while True:
            try:
                if "started" in self.get("/api/status"):
                    return
            except OSError:
                pass
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"JupyterLab did not answer:\n{self.log()}")
            time.sleep(0.2)

    def stop(self) -> None:
        """TERM the process group, 20 s of grace, then KILL; a group already gone
        (make ended early, its JupyterLab never started) is no error."""
        import signal

        for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:  # no process of the group is left
                break
            try:
                self.popen.wait(grace)
                break
            except subprocess.TimeoutExpired:
                continue
        self.popen.wait(10)
        self._log.close()


@pytest.fixture(scope="session")
def make_lab(tmp_path_factory):
    """One ``make lab`` for the tests of it (tests/test_lab_integration.py, and
    test_listening_integration.py on its sockets): started on first use, stopped at
    the end of the run, when none of its processes may be left."""
    from workshop.cluster.reaper import descendants

    if shutil.which("make") is None:
        pytest.skip("needs make")
    lab = MadeLab(tmp_path_factory.mktemp("make-lab"))
    try:
        lab.wait_ready()
    except BaseException:
        lab.stop()
        raise
    _RUN_WIDE_CHILDREN.add(lab.popen.pid)
    yield lab
    _RUN_WIDE_CHILDREN.discard(lab.popen.pid)
    pids = {lab.popen.pid, *descendants(lab.popen.pid)}
    lab.stop()
    assert gone(pids, within=20) == [], f"make lab left {pids}"
