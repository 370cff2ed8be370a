"""_exports.offer: a topic (workshop.draw, workshop.planner, ...) offers its names
without importing its modules until a name is used, and says what it has when asked
for a name it does not."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types

import pytest

from workshop._exports import offer


def _topic(monkeypatch, names):
    module = types.ModuleType("topic_for_test")
    module.__getattr__, module.__dir__ = offer(module.__name__, names)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def test_a_name_is_imported_from_its_module_when_first_used_then_kept(monkeypatch):
    imported = []
    real = importlib.import_module
    monkeypatch.setattr(
        "workshop._exports.importlib.import_module",
        lambda name: imported.append(name) or real(name),
    )
    # The topic's "sqrt" lives in its module "maths", here the standard math.
    monkeypatch.setitem(sys.modules, "topic_for_test.maths", sys.modules["math"])
    topic = _topic(monkeypatch, {"sqrt": "maths"})
    assert "sqrt" in dir(topic) and imported == []
    assert topic.sqrt(9.0) == 3.0
    assert topic.sqrt(16.0) == 4.0
    assert imported == ["topic_for_test.maths"]  # once, then kept on the topic


def test_an_unknown_name_is_an_attribute_error_naming_the_topic(monkeypatch):
    topic = _topic(monkeypatch, {"sqrt": "maths"})
    with pytest.raises(
        AttributeError, match="'topic_for_test' has no attribute 'nope'"
    ):
        _ = topic.nope


def test_importing_the_package_imports_no_topic_s_modules_until_used():
    # A fresh interpreter: import workshop, then see what a topic's first name costs.
    code = (
        "import sys, workshop\n"
        "before = {m for m in sys.modules if m.startswith('workshop.draw.')}\n"
        "from workshop.draw import draw_collective\n"
        "after = {m for m in sys.modules if m.startswith('workshop.draw.')}\n"
        "print(sorted(before), 'workshop.draw.collective_diagram' in after,\n"
        "      draw_collective.__module__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "[]",
        "True",
        "workshop.draw.collective_diagram",
    ]
