"""``python -m workshop kernel-spec``: a Jupyter kernel for the workshop, for an
instructor who offers it on a site's JupyterHub or Open OnDemand, whose Jupyter is
not the Python that has torch and the workshop (docs/portal.md)::

    python -m workshop kernel-spec --dry-run         # what it would write, and where
    python -m workshop kernel-spec --check           # this Python, for you (--user)
    python -m workshop kernel-spec --module pytorch/2.4 --python python3 \\
        --env OMP_NUM_THREADS=4 --prefix /shared/course/jupyter --check

What the spec holds is decided in :mod:`.kernelspec_plan`; ``--check`` starts a
kernel from it as a Jupyter server would (:func:`check_kernel`), then shuts it down.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .._cli import above_zero
from .kernelspec_plan import (
    DEFAULT_NAME,
    KERNEL_TIMEOUT_S,
    WRAPPER,
    KernelSpecError,
    KernelSpecPlan,
    kernels_dir,
    parse_env,
    plan_kernel_spec,
    write_kernel_spec,
)

__all__ = [
    "KernelCheck",
    "add_arguments",
    "check_kernel",
    "describe_check",
    "run_from_args",
]

# What the kernel runs: the two imports, then one line of JSON, keyed by the fields
# of KernelCheck.
_CODE = """\
import json as _json, os as _os, sys as _sys
import workshop as _workshop, torch as _torch
_gpus = [_torch.cuda.get_device_name(i) for i in range(_torch.cuda.device_count())]
_get = _os.environ.get
print(_json.dumps({"python": _sys.executable,
    "python_version": _sys.version.split()[0], "torch_version": _torch.__version__,
    "workshop_file": _workshop.__file__, "cuda_available": _torch.cuda.is_available(),
    "gpus": _gpus, "cuda_visible_devices": _get("CUDA_VISIBLE_DEVICES"),
    "loaded_modules": _get("LOADEDMODULES"), "slurm_job_id": _get("SLURM_JOB_ID"),
    "slurm_step_id": _get("SLURM_STEP_ID"),
    "cpus": len(_os.sched_getaffinity(0)) if hasattr(_os, "sched_getaffinity")
        else _os.cpu_count(), "node_cpus": _os.cpu_count(),
    "env": {k: _get(k) for k in KEYS}}))
"""


@dataclass(frozen=True)
class KernelCheck:
    """What a kernel started from a spec reported (:func:`check_kernel`)."""

    seconds: float  # from the start to the answer
    python: str
    python_version: str
    torch_version: str
    workshop_file: str
    cuda_available: bool
    gpus: tuple[str, ...]
    cuda_visible_devices: str | None
    loaded_modules: str | None  # LOADEDMODULES, which Lmod and Environment Modules set
    slurm_job_id: str | None
    slurm_step_id: str | None  # the server's step, where the portal ran it in one
    cpus: int  # the CPUs the kernel may run on (its affinity: the allocation's)
    node_cpus: int  # all of the node's
    env: dict[str, str | None] = field(default_factory=dict)  # the spec's env, seen
    pid: int | None = None  # the kernel's process, ended before this was returned


def _tail(log: Path, lines: int = 15) -> str:
    text = log.read_text(errors="replace").strip() if log.exists() else ""
    return "\n".join(text.splitlines()[-lines:]) or "(it printed nothing)"


def _by_hand(folder: Path, spec: dict) -> str:
    """The kernel's command without Jupyter's arguments, to run by hand."""
    head = spec["argv"][0]
    shown = f"bash {head}" if head.endswith(WRAPPER) else head
    return f"{shown} -c 'import workshop, torch'"


def check_kernel(folder: str | Path, timeout: float = KERNEL_TIMEOUT_S) -> KernelCheck:
    """Start the kernel whose spec is in ``folder`` (in an empty folder), run
    ``import workshop, torch`` in it, shut it down, and return what it reported.

    Args:
        folder: a kernel spec's folder (``kernels/NAME``, holding ``kernel.json``).
        timeout: seconds for the kernel to start, and again for the imports.

    Returns:
        What the kernel saw.

    Raises:
        KernelSpecError: no jupyter_client here, the kernel did not start, or the
            imports failed in it.

    Example:
        >>> check_kernel(kernels_dir() / "scaling-pytorch-hpc").torch_version
        ... # doctest: +SKIP
        '2.4.1'
    """
    try:
        from jupyter_client.kernelspec import KernelSpecManager
        from jupyter_client.manager import KernelManager
    except ImportError as e:
        raise KernelSpecError(
            f"--check needs jupyter_client in {sys.executable}. HINT: pip install "
            "jupyter_client, or run the command with the workshop's Python"
        ) from e
    folder = Path(folder)
    spec = json.loads((folder / "kernel.json").read_text())
    name = folder.name
    code = _CODE.replace("KEYS", repr(sorted(spec.get("env", {}))))
    specs = KernelSpecManager(kernel_dirs=[str(folder.parent)])
    with tempfile.TemporaryDirectory(prefix="kernel-check-") as tmp:
        log = Path(tmp) / "kernel.log"
        manager = KernelManager(
            kernel_name=name,
            kernel_spec_manager=specs,
            connection_file=str(Path(tmp) / "connection.json"),
        )
        client = pid = None
        start = time.monotonic()
        with log.open("wb") as out:
            try:
                try:
                    manager.start_kernel(cwd=tmp, stdout=out, stderr=subprocess.STDOUT)
                except OSError as e:  # argv[0] missing or not executable
                    raise KernelSpecError(
                        f"kernel {name} could not be started: {spec['argv'][0]}: "
                        f"{e.strerror}. HINT: write the spec again with "
                        "python -m workshop kernel-spec"
                    ) from e
                pid = getattr(manager.provisioner, "pid", None)
                client = manager.client()
                client.start_channels()
                try:
                    client.wait_for_ready(timeout=timeout)
                except RuntimeError as e:  # it died, or did not answer in time
                    out.flush()
                    raise KernelSpecError(
                        f"kernel {name} did not start ({e}). Its output:\n"
                        f"{_tail(log)}\nHINT: run its command by hand, "
                        f"{_by_hand(folder, spec)}, and fix what it says"
                    ) from None
                said: list[str] = []
                failed: dict = {}

                def _hook(msg: dict) -> None:
                    kind, content = msg["msg_type"], msg["content"]
                    if kind == "stream" and content.get("name") == "stdout":
                        said.append(content["text"])
                    elif kind == "error":
                        failed.update(content)

                try:
                    client.execute_interactive(
                        code, timeout=timeout, output_hook=_hook, store_history=False
                    )
                except TimeoutError as e:
                    raise KernelSpecError(
                        f"kernel {name} started, but 'import workshop, torch' did not "
                        f"finish within {timeout:.0f} s. HINT: a slow file system: "
                        "try a longer --timeout"
                    ) from e
                elapsed = time.monotonic() - start
                if failed:
                    raise KernelSpecError(
                        f"kernel {name} started, but 'import workshop, torch' failed: "
                        f"{failed.get('ename')}: {failed.get('evalue')}. HINT: install "
                        "the workshop's requirements into that Python "
                        "(docs/cluster.md, 'On a cluster'), then run --check again"
                    )
            finally:
                if client is not None:
                    client.stop_channels()
                _shut_down(manager)
    lines = "".join(said).strip().splitlines()
    if not lines:
        raise KernelSpecError(
            f"kernel {name} ran the imports but printed nothing. HINT: run its "
            f"command by hand, {_by_hand(folder, spec)}"
        )
    report = json.loads(lines[-1])  # keyed by KernelCheck's fields
    report["gpus"] = tuple(report["gpus"])
    return KernelCheck(seconds=elapsed, pid=pid, **report)


def _shut_down(manager) -> None:
    """Ask the kernel to stop (it gets Jupyter's grace period), else kill it."""
    if not manager.has_kernel:
        return
    try:
        manager.shutdown_kernel(now=False)
    except Exception:
        manager.shutdown_kernel(now=True)


def _slurm(check: KernelCheck) -> str:
    if check.slurm_job_id is None:
        return "no job (SLURM_JOB_ID unset)"
    step = f", step {check.slurm_step_id}" if check.slurm_step_id is not None else ""
    return f"job {check.slurm_job_id}{step}: the kernel runs inside it"


def describe_check(check: KernelCheck) -> str:
    """The check's report, a few aligned lines.

    Example:
        >>> print(describe_check(check))  # doctest: +SKIP
        python     /work/main/.venv/bin/python (3.11.7)
        ...
    """
    if check.gpus:
        cuda = f"{len(check.gpus)} GPU(s): {', '.join(check.gpus)}"
    else:
        cuda = "not visible: torch sees no GPU"
    visible = check.cuda_visible_devices
    cuda += f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    cpus = f"{check.cpus} usable by the kernel, of {check.node_cpus} on the node"
    rows = [
        ("python", f"{check.python} ({check.python_version})"),
        ("torch", check.torch_version),
        ("workshop", check.workshop_file),
        ("CUDA", cuda),
        ("modules", check.loaded_modules or "none loaded (LOADEDMODULES unset)"),
        ("CPUs", cpus),
        ("Slurm", _slurm(check)),
    ]
    rows += [("env", f"{k}={v}") for k, v in check.env.items()]
    return "\n".join(f"  {key:<9}  {value}" for key, value in rows)


# ------------------------------------------------------------------ the command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``kernel-spec``'s options to ``parser``."""
    parser.add_argument(
        "--name",
        default=DEFAULT_NAME,
        help="the kernel's name: letters, digits, '.', '_' and '-' "
        f"(default {DEFAULT_NAME})",
    )
    parser.add_argument(
        "--display-name",
        metavar="TEXT",
        help="its name in Jupyter's menus (default: the workshop's title, then the "
        "modules)",
    )
    parser.add_argument(
        "--module",
        action="append",
        default=[],
        dest="modules",
        metavar="NAME",
        help="an environment module to 'module load' before the kernel starts, e.g. "
        "pytorch/2.4; repeat it for several, loaded in order",
    )
    parser.add_argument(
        "--modules-init",
        metavar="PATH",
        help="the script that defines 'module' (default: $MODULESHOME/init/bash, "
        "then the usual places of Lmod and Environment Modules)",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--python",
        metavar="PATH",
        help="the Python that has torch (and ipykernel); with --module also a name "
        "found on PATH after loading, e.g. python3 (default: this Python)",
    )
    which.add_argument(
        "--venv", metavar="PATH", help="a virtual environment, instead of --python"
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a variable for the kernel, e.g. OMP_NUM_THREADS=4; repeatable; "
        "${VAR} takes the Jupyter server's value",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--user",
        action="store_true",
        help="install for you alone, in ~/.local/share/jupyter/kernels (the default)",
    )
    where.add_argument(
        "--prefix",
        metavar="PATH",
        help="install into PATH/share/jupyter/kernels (a server sees it with "
        "JUPYTER_PATH=PATH/share/jupyter)",
    )
    where.add_argument(
        "--sys-prefix",
        action="store_true",
        help=f"install into this Python's prefix ({sys.prefix})",
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--dry-run",
        action="store_true",
        help="print kernel.json and the wrapper, write nothing",
    )
    what.add_argument(
        "--check",
        action="store_true",
        help="then start the kernel from the spec, import workshop and torch in it, "
        "report what it sees and shut it down",
    )
    parser.add_argument(
        "--timeout",
        type=above_zero("--timeout 120"),
        default=KERNEL_TIMEOUT_S,
        metavar="S",
        help=f"seconds for the Python, the kernel's start and its imports, each "
        f"(default {KERNEL_TIMEOUT_S:.0f})",
    )


def _summary(plan: KernelSpecPlan, args: argparse.Namespace) -> list[str]:
    lines = [
        f"kernel {plan.name!r}, shown as {plan.kernel_json['display_name']!r}",
        f"  python    {plan.python}"
        + (f" (after module load {' '.join(args.modules)})" if args.modules else ""),
        f"  torch     {plan.torch_version}",
        f"  workshop  {plan.workshop_file}",
    ]
    return lines + [f"note: {note}" for note in plan.notes]


def _how_to_find(plan: KernelSpecPlan, args: argparse.Namespace) -> str:
    if args.prefix is None:
        return (
            "'jupyter kernelspec list' lists it; choose it in Kernel > Change Kernel."
        )
    data = plan.folder.parent.parent
    return (
        f"A Jupyter server sees it when {data} is on its JUPYTER_PATH "
        f"(export JUPYTER_PATH={data}), or when the site adds it there."
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Write (or with ``--dry-run`` print) the kernel spec, then ``--check`` it.

    Returns:
        0, or 1 after printing what is wrong and what to do.

    Example:
        >>> from workshop.__main__ import main
        >>> main(["kernel-spec", "--dry-run"])  # doctest: +SKIP
        0
    """
    try:
        plan = plan_kernel_spec(
            name=args.name,
            display_name=args.display_name,
            python=args.python,
            venv=args.venv,
            modules=args.modules,
            env=parse_env(args.env),
            where=kernels_dir(
                user=args.user, prefix=args.prefix, sys_prefix=args.sys_prefix
            ),
            modules_init=args.modules_init,
            timeout=args.timeout,
        )
        if args.dry_run:
            print(f"Would write into {plan.folder}:")
            print(f"--- kernel.json\n{json.dumps(plan.kernel_json, indent=1)}")
            if plan.wrapper is not None:
                print(f"--- {WRAPPER} (executable)\n{plan.wrapper}", end="")
            print("\n".join(_summary(plan, args)))
            return 0
        folder = write_kernel_spec(plan)
        files = "kernel.json" + (f" and {WRAPPER}" if plan.wrapper else "")
        print(f"Wrote {files} into {folder}")
        print("\n".join(_summary(plan, args)))
        print(_how_to_find(plan, args))
        if args.check:
            print(f"Checking: starting kernel {plan.name} from {folder} ...")
            check = check_kernel(folder, timeout=args.timeout)
            print(describe_check(check))
            print(
                f"OK: the kernel started and imported workshop and torch in "
                f"{check.seconds:.1f} s, and was shut down."
            )
    except KernelSpecError as e:
        print(f"kernel-spec: ERROR: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "\nkernel-spec: interrupted; the kernel it started was stopped",
            file=sys.stderr,
        )
        return 130
    return 0
