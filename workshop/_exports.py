"""The names a topic offers (``workshop.draw``, ``workshop.planner``, ...), each
imported from the module that defines it the first time it is used.

A topic's ``__init__`` imports none of its modules itself: ``from ..comm import
tracing`` inside a rank stays cheap, and no wing's ``__init__`` can close a circle of
imports. The name is looked up once, then kept on the topic like any attribute.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["offer"]


def offer(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the package ``package`` that offer each of
    ``names`` (name -> the module of the package that defines it)."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
