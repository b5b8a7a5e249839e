"""gui.background.Background, the one way to run work off the GUI thread.

Calls of their own threads (Open dataset, Load checkpoint): of calls of one kind
with newest_wins only the newest reports, whichever finishes first; a superseded
or cancelled call's report (result or failure) is dropped. One-thread calls
(the inspect panels, re-smoothing): a newer call cancels the running one, a
refresh lets it finish, keys are independent, one Background can yield to
another, and deleting it ends its thread."""
from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import QCoreApplication, QObject

import engine
from gui.background import Background, run_in_background

WAIT_S = 10  # a gate never opened fails the test, it does not hang it
WAIT_MS = WAIT_S * 1000


def gated(gate: threading.Event, value, finished: threading.Event | None = None):
    """value once the gate opens (an exception is raised, not returned)."""
    try:
        assert gate.wait(WAIT_S)
        if isinstance(value, Exception):
            raise value
        return value
    finally:
        if finished is not None:
            finished.set()


def reported(qtbot, name: str) -> None:
    """Wait until every thread called `name` has ended (each posts its report before
    it ends), then deliver the posted reports: a dropped one has been dropped."""
    qtbot.waitUntil(lambda: not any(t.name == name and t.is_alive() for t in threading.enumerate()),
                    timeout=WAIT_MS)
    QCoreApplication.processEvents()


@pytest.fixture
def owner(qtbot):
    owner = QObject()
    yield owner
    owner.deleteLater()


@pytest.fixture
def calls(owner, request):
    """A newest-wins Background whose threads are named after the test (reported() waits for them)."""
    done, failed = [], []
    newest = Background(owner, request.node.name, newest_wins=True)
    start = lambda gate, value: newest.start(gated, gate, value, on_done=done.append,  # noqa: E731
                                             on_failed=failed.append)
    return newest, start, done, failed


# calls of their own threads ------------------------------------------------------------

def test_a_superseded_call_that_finishes_first_is_dropped(qtbot, calls):
    newest, start, done, failed = calls
    first_gate, second_gate = threading.Event(), threading.Event()
    start(first_gate, "first")
    start(second_gate, "second")
    first_gate.set()
    qtbot.waitUntil(lambda: sum(t.name == newest.name for t in threading.enumerate()) == 1, timeout=WAIT_MS)
    QCoreApplication.processEvents()
    assert done == [] and failed == [] and newest.busy  # the newest is still going
    second_gate.set()
    qtbot.waitUntil(lambda: done == ["second"], timeout=WAIT_MS)
    assert failed == [] and not newest.busy


def test_a_superseded_call_that_finishes_last_is_dropped(qtbot, calls):
    newest, start, done, failed = calls
    first_gate, second_gate = threading.Event(), threading.Event()
    start(first_gate, OSError("the first call's failure"))
    start(second_gate, "second")
    second_gate.set()
    qtbot.waitUntil(lambda: done == ["second"], timeout=WAIT_MS)
    assert not newest.busy
    first_gate.set()
    reported(qtbot, newest.name)
    assert done == ["second"] and failed == []


def test_the_newest_calls_failure_is_reported(qtbot, calls):
    newest, start, done, failed = calls
    gate = threading.Event()
    error = ValueError("bad file")
    start(gate, error)
    assert newest.busy
    with qtbot.waitSignal(newest.failed, timeout=WAIT_MS) as signal:
        gate.set()
    assert failed == [error] and signal.args == ["", error]
    assert done == [] and not newest.busy


def test_a_cancelled_call_reports_nothing(qtbot, calls):
    newest, start, done, failed = calls
    gate = threading.Event()
    start(gate, "cancelled")
    newest.cancel()
    assert not newest.busy
    gate.set()
    reported(qtbot, newest.name)
    assert done == [] and failed == []


def test_a_call_that_never_returns_holds_up_no_other(qtbot, calls):
    """A FIFO nobody writes to: the next Open dataset still reads."""
    newest, start, done, failed = calls
    stuck, also_stuck, free = threading.Event(), threading.Event(), threading.Event()
    start(stuck, "never")
    start(also_stuck, "superseded")
    free.set()
    start(free, "read")
    qtbot.waitUntil(lambda: done == ["read"], timeout=WAIT_MS)
    stuck.set()
    also_stuck.set()
    reported(qtbot, newest.name)
    assert done == ["read"] and failed == []


def test_without_newest_wins_every_call_reports(qtbot, owner):
    background = Background(owner, "every-call")
    results = []
    background.done.connect(lambda key, value: results.append((key, value)))
    gate = threading.Event()
    background.start(gated, gate, 1, key="a")
    background.start(gated, gate, 2, key="a")
    gate.set()
    qtbot.waitUntil(lambda: sorted(results) == [("a", 1), ("a", 2)], timeout=WAIT_MS)
    assert not background.busy


def test_run_in_background_reports_once_and_deletes_its_call(qtbot, owner):
    results = []
    call = run_in_background(lambda x: x * 2, 21, parent=owner, name="one-off", on_done=results.append)
    with qtbot.waitSignal(call.destroyed, timeout=WAIT_MS):
        pass
    assert results == [42]


def test_a_call_whose_owner_went_reports_nothing(qtbot):
    import shiboken6

    owner = QObject()
    results, gate = [], threading.Event()
    run_in_background(gated, gate, "late", parent=owner, name="orphan", on_done=results.append)
    shiboken6.delete(owner)
    gate.set()
    reported(qtbot, "orphan")
    assert results == []


def test_a_generator_reports_each_value_it_yields_then_its_return_value(qtbot, owner):
    background = Background(owner, "generator")
    yielded, done = [], []
    signalled = []
    background.yielded.connect(lambda key, value: signalled.append((key, value)))

    def rows(n):
        for i in range(n):
            yield ("row", i)
        return "finished"

    background.start(rows, 3, key="study", on_yielded=yielded.append, on_done=done.append)
    qtbot.waitUntil(lambda: done == ["finished"], timeout=WAIT_MS)
    assert yielded == [("row", 0), ("row", 1), ("row", 2)]
    assert signalled == [("study", v) for v in yielded]


def test_a_superseded_generator_stops_at_its_next_value(qtbot, owner):
    background = Background(owner, "superseded-generator", newest_wins=True)
    gate, left = threading.Event(), []
    yielded = []

    def rows():
        yield "first"
        assert gate.wait(WAIT_S)
        try:
            yield "second"  # superseded by now: never reported, and the generator is closed here
        finally:
            left.append("closed")
        yield "third"

    background.start(rows, on_yielded=yielded.append)
    qtbot.waitUntil(lambda: yielded == ["first"], timeout=WAIT_MS)
    background.start(lambda: "newer", on_done=yielded.append)
    gate.set()
    reported(qtbot, background.name)
    assert yielded == ["first", "newer"] and left == ["closed"]


# one thread ------------------------------------------------------------------------------

@pytest.fixture
def worker(owner):
    worker = Background(owner, "test-worker", newest_wins=True, one_thread=True, cancellable=True)
    yield worker
    assert worker.close()


def blocking(started: threading.Event, release: threading.Event, seen_cancel: list):
    """A call that runs until released, polling cancel as engine.model.introspect does."""
    def fn(value, cancel):
        started.set()
        while not release.wait(0.005):
            if cancel():
                seen_cancel.append(value)
                raise engine.Cancelled("superseded")
        return value
    return fn


def test_a_newer_call_cancels_the_running_one_and_only_it_is_delivered(qtbot, worker):
    started, release, cancelled = threading.Event(), threading.Event(), []
    delivered = []
    worker.done.connect(lambda key, value: delivered.append((key, value)))
    worker.start(blocking(started, release, cancelled), "k", key="bars")
    assert started.wait(5)
    worker.start(lambda value, cancel: value, "ka", key="bars")  # never started: replaced next
    worker.start(lambda value, cancel: value, "kar", key="bars")
    qtbot.waitUntil(lambda: delivered == [("bars", "kar")], timeout=WAIT_MS)
    assert cancelled == ["k"] and not worker.busy


def test_a_refresh_lets_the_running_call_finish_and_then_runs(qtbot, worker):
    started, release, cancelled = threading.Event(), threading.Event(), []
    delivered = []
    worker.done.connect(lambda key, value: delivered.append(value))
    worker.start(blocking(started, release, cancelled), "old parameters", key="beams")
    assert started.wait(5)
    worker.start(lambda value, cancel: value, "stale refresh", key="beams", refresh=True)
    worker.start(lambda value, cancel: value, "new parameters", key="beams", refresh=True)
    release.set()
    qtbot.waitUntil(lambda: delivered == ["old parameters", "new parameters"], timeout=WAIT_MS)
    assert cancelled == [] and not worker.busy


def test_refresh_needs_one_thread_and_newest_wins(owner):
    with pytest.raises(ValueError, match="refresh"):
        Background(owner, "x", newest_wins=True).start(lambda: 1, refresh=True)


def test_keys_are_independent_and_errors_reach_the_asker(qtbot, worker):
    results, failures = {}, []
    worker.done.connect(results.__setitem__)
    worker.failed.connect(lambda key, exc: failures.append((key, str(exc))))

    def broken(cancel):
        raise ValueError("character 'Z' is not in the vocabulary")

    worker.start(lambda cancel: 1, key="a")
    worker.start(broken, key="b")
    worker.start(lambda cancel: 3, key="c")
    qtbot.waitUntil(lambda: results == {"a": 1, "c": 3} and bool(failures), timeout=WAIT_MS)
    assert failures == [("b", "character 'Z' is not in the vocabulary")]


def test_cancel_drops_a_result_already_on_its_way(qtbot, worker):
    delivered = []
    worker.done.connect(lambda key, value: delivered.append(value))
    ran, marker = threading.Event(), threading.Event()
    worker.start(lambda cancel: ran.set() or "late", key="map")
    worker.start(lambda cancel: marker.set() or "marker", key="other")  # runs after it, in the one thread
    assert ran.wait(5) and marker.wait(5)
    worker.cancel("map")  # the report of "map" is queued to this thread: dropped on arrival
    qtbot.waitUntil(lambda: delivered == ["marker"], timeout=WAIT_MS)  # reports arrive in order
    assert delivered == ["marker"]


def test_close_stops_a_running_call(worker):
    started, release, cancelled = threading.Event(), threading.Event(), []
    worker.start(blocking(started, release, cancelled), 1, key="x")
    assert started.wait(5)
    assert worker.close(timeout_s=WAIT_S)
    assert cancelled == [1]
    assert worker.start(lambda cancel: 2, key="x") == 0  # closed: nothing more runs


def test_a_slow_worker_steps_aside_while_the_quick_one_is_busy(qtbot, worker, owner):
    slow = Background(owner, "test-slow", newest_wins=True, one_thread=True, cancellable=True, yield_to=worker)
    quick_started, quick_release = threading.Event(), threading.Event()
    polls_while_quick_ran = []

    def quick(cancel):
        quick_started.set()
        quick_release.wait(5)
        return "bars"

    def search(cancel):
        assert quick_started.wait(5)
        cancel()  # a poll: returns only once the quick worker is idle
        polls_while_quick_ran.append(quick_release.is_set())
        return "beams"

    delivered = []
    slow.done.connect(lambda key, value: delivered.append(value))
    worker.start(quick, key="bars")
    slow.start(search, key="beams")
    qtbot.wait(50)
    assert delivered == []  # waiting for the quick one
    quick_release.set()
    qtbot.waitUntil(lambda: delivered == ["beams"], timeout=WAIT_MS)
    assert polls_while_quick_ran == [True]
    assert slow.close()


def test_deleting_the_qt_object_ends_the_thread():
    """The thread holds no strong reference to the Background: when its owner deletes
    it, the thread ends instead of outliving it (and Qt never deletes the object
    from the thread)."""
    import shiboken6

    owner = QObject()
    worker = Background(owner, "deleted", one_thread=True)
    worker.start(lambda: 1)
    thread = worker._thread
    del worker
    shiboken6.delete(owner)
    thread.join(2)
    assert not thread.is_alive()
