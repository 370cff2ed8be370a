"""``python -m workshop kernel-spec``: a Jupyter kernel for the workshop, for an
instructor who offers it on a site's JupyterHub or Open OnDemand, whose Jupyter is
not the Python that has torch and the workshop (docs/portal.md)::

    python -m workshop kernel-spec --dry-run         # what it would write, and where
    python -m workshop kernel-spec --check           # this Python, for you (--user)
    python -m workshop kernel-spec --module pytorch/2.4 --python python3 \\
        --env OMP_NUM_THREADS=4 --prefix /shared/course/jupyter --check

What the spec holds is decided in :mod:`.kernelspec_plan` (``kernel.json``, the
wrapper that loads modules, the workshop on ``PYTHONPATH`` when that Python lacks
it); ``--check`` starts a kernel from it (:mod:`.kernelspec_check`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .kernelspec_check import check_kernel, describe_check
from .kernelspec_plan import (
    DEFAULT_NAME,
    TIMEOUT_S,
    WRAPPER,
    KernelSpecPlan,
    kernels_dir,
    parse_env,
    plan_kernel_spec,
    write_kernel_spec,
)
from .kernelspec_probe import KernelSpecError

__all__ = ["add_arguments", "run_from_args"]


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
        type=float,
        default=TIMEOUT_S,
        metavar="S",
        help=f"seconds for the Python, the kernel's start and its imports, each "
        f"(default {TIMEOUT_S:.0f})",
    )


def _where(args: argparse.Namespace) -> Path:
    return kernels_dir(user=args.user, prefix=args.prefix, sys_prefix=args.sys_prefix)


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
            where=_where(args),
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
