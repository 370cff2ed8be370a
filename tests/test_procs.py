"""workshop/_procs.py: the interrupt that says what was stopped. It must stay a
KeyboardInterrupt everywhere (caught as one, and ending a script as Ctrl-C does) and
show in IPython as its message alone."""

from __future__ import annotations

import pickle

import pytest

from workshop._procs import interrupted

MESSAGE = "workshop.launch: interrupted; stopped rank(s) 0, 1"


def test_interrupted_is_a_keyboard_interrupt_with_the_message():
    with pytest.raises(KeyboardInterrupt, match=r"^workshop\.launch: interrupted; "):
        raise interrupted(MESSAGE)
    exc = interrupted(MESSAGE)
    # The class itself, not a subclass: Python ends a script with status 130 only
    # for a KeyboardInterrupt proper.
    assert type(exc) is KeyboardInterrupt
    assert str(exc) == MESSAGE


def test_ipython_shows_the_message_alone():
    assert interrupted(MESSAGE)._render_traceback_() == [
        f"KeyboardInterrupt: {MESSAGE}"
    ]
    two = interrupted("interrupted; cancelled job 12\njob 12: CANCELLED")
    assert two._render_traceback_() == [
        "KeyboardInterrupt: interrupted; cancelled job 12",
        "job 12: CANCELLED",
    ]


def test_an_ipython_shell_prints_one_line_and_no_frame(capsys):
    shell = pytest.importorskip("IPython.core.interactiveshell")
    ip = shell.InteractiveShell.instance()
    try:
        ip.user_ns["interrupted"] = interrupted
        ip.run_cell(
            "def inner():\n"
            "    raise interrupted('workshop.launch: interrupted; stopped rank(s) 0')\n"
            "inner()\n"
        )
    finally:
        shell.InteractiveShell.clear_instance()
    shown = capsys.readouterr()
    text = (shown.out + shown.err).strip()
    assert text == "KeyboardInterrupt: workshop.launch: interrupted; stopped rank(s) 0"


def test_it_survives_pickling():
    # Exceptions cross processes (a rank's error, a pool's result) by pickle.
    copy = pickle.loads(pickle.dumps(interrupted(MESSAGE)))
    assert type(copy) is KeyboardInterrupt and str(copy) == MESSAGE
    assert copy._render_traceback_() == [f"KeyboardInterrupt: {MESSAGE}"]
