"""Start a kernel from a written kernel spec, as a Jupyter server would, and ask it
what it has: ``python -m workshop kernel-spec --check``. The kernel runs in an empty
folder (so the current one cannot make the workshop importable), its connection file
lies in a temporary folder, and it is shut down before the answer is returned, also
after a failure or an interrupt.

Imports only :mod:`.kernelspec_plan` of the package; ``jupyter_client`` when called.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .kernelspec_plan import WRAPPER
from .kernelspec_probe import KernelSpecError

__all__ = ["KernelCheck", "check_kernel", "describe_check"]

TIMEOUT_S = 120.0  # for the start and for the import each

# What the kernel runs: the two imports, then one line of JSON.
_CODE = """\
import json as _json, os as _os, sys as _sys
import workshop as _workshop, torch as _torch
_gpus = [_torch.cuda.get_device_name(i) for i in range(_torch.cuda.device_count())]
print(_json.dumps({"python": _sys.executable, "version": _sys.version.split()[0],
    "torch": _torch.__version__, "workshop": _workshop.__file__,
    "cuda": _torch.cuda.is_available(), "gpus": _gpus,
    "visible": _os.environ.get("CUDA_VISIBLE_DEVICES"),
    "modules": _os.environ.get("LOADEDMODULES"),
    "job": _os.environ.get("SLURM_JOB_ID"), "step": _os.environ.get("SLURM_STEP_ID"),
    "slurm_cpus": _os.environ.get("SLURM_CPUS_ON_NODE"),
    "cpus": len(_os.sched_getaffinity(0)) if hasattr(_os, "sched_getaffinity")
        else _os.cpu_count(), "node_cpus": _os.cpu_count(),
    "env": {k: _os.environ.get(k) for k in KEYS}}))
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


def check_kernel(folder: str | Path, timeout: float = TIMEOUT_S) -> KernelCheck:
    """Start the kernel whose spec is in ``folder`` through ``jupyter_client``, run
    ``import workshop, torch`` in it and return what it reported; shut it down.

    Args:
        folder: a kernel spec's folder (``kernels/NAME``, holding ``kernel.json``).
        timeout: seconds for the kernel to start, and again for the imports.

    Returns:
        What the kernel saw: its Python, torch, the workshop's file, GPUs, modules,
        the Slurm job and the spec's variables.

    Raises:
        KernelSpecError: jupyter_client is missing here, the kernel did not start
            (with the end of its output), or the imports failed in it.

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
        client = None
        pid = None
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
    report = json.loads(lines[-1])
    return KernelCheck(
        seconds=elapsed,
        python=report["python"],
        python_version=report["version"],
        torch_version=report["torch"],
        workshop_file=report["workshop"],
        cuda_available=report["cuda"],
        gpus=tuple(report["gpus"]),
        cuda_visible_devices=report["visible"],
        loaded_modules=report["modules"],
        slurm_job_id=report["job"],
        slurm_step_id=report["step"],
        cpus=report["cpus"],
        node_cpus=report["node_cpus"],
        env=report["env"],
        pid=pid,
    )


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
    rows = [
        ("python", f"{check.python} ({check.python_version})"),
        ("torch", check.torch_version),
        ("workshop", check.workshop_file),
        ("CUDA", cuda),
        ("modules", check.loaded_modules or "none loaded (LOADEDMODULES unset)"),
        (
            "CPUs",
            f"{check.cpus} usable by the kernel, of {check.node_cpus} on the node",
        ),
        ("Slurm", _slurm(check)),
    ]
    rows += [("env", f"{k}={v}") for k, v in check.env.items()]
    return "\n".join(f"  {key:<9}  {value}" for key, value in rows)
