"""gui.background.NewestCall: of calls of one kind only the newest reports, whichever
finishes first; a superseded or forgotten call's report (result or failure) is dropped."""
import threading

import pytest
from PySide6.QtCore import QObject

from gui.background import NewestCall

WAIT_S = 10  # a gate never opened fails the test, it does not hang it


def gated(gate: threading.Event, value):
    """value once the gate opens (an exception is raised, not returned)."""
    assert gate.wait(WAIT_S)
    if isinstance(value, Exception):
        raise value
    return value


@pytest.fixture
def calls(qtbot):
    owner = QObject()
    done, failed = [], []
    newest = NewestCall(owner, "test-call")
    start = lambda gate, value: newest.start(gated, gate, value, on_done=done.append,  # noqa: E731
                                             on_failed=failed.append)
    yield newest, start, done, failed
    owner.deleteLater()


def test_a_superseded_call_that_finishes_first_is_dropped(qtbot, calls):
    newest, start, done, failed = calls
    first_gate, second_gate = threading.Event(), threading.Event()
    first = start(first_gate, "first")
    start(second_gate, "second")
    with qtbot.waitSignal(first.done, timeout=WAIT_S * 1000):
        first_gate.set()
    assert done == [] and failed == [] and newest.busy  # the newest is still going
    second_gate.set()
    qtbot.waitUntil(lambda: done == ["second"], timeout=WAIT_S * 1000)
    assert failed == [] and not newest.busy


def test_a_superseded_call_that_finishes_last_is_dropped(qtbot, calls):
    newest, start, done, failed = calls
    first_gate, second_gate = threading.Event(), threading.Event()
    first = start(first_gate, OSError("the first call's failure"))
    second = start(second_gate, "second")
    with qtbot.waitSignal(second.done, timeout=WAIT_S * 1000):
        second_gate.set()
    assert done == ["second"] and not newest.busy
    with qtbot.waitSignal(first.failed, timeout=WAIT_S * 1000):
        first_gate.set()
    assert done == ["second"] and failed == []


def test_the_newest_calls_failure_is_reported(qtbot, calls):
    newest, start, done, failed = calls
    gate = threading.Event()
    error = ValueError("bad file")
    start(gate, error)
    assert newest.busy
    gate.set()
    qtbot.waitUntil(lambda: failed == [error], timeout=WAIT_S * 1000)
    assert done == [] and not newest.busy


def test_a_forgotten_call_reports_nothing(qtbot, calls):
    newest, start, done, failed = calls
    gate = threading.Event()
    call = start(gate, "forgotten")
    newest.forget()
    assert not newest.busy
    with qtbot.waitSignal(call.done, timeout=WAIT_S * 1000):
        gate.set()
    assert done == [] and failed == []
