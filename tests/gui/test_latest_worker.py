"""LatestRequestWorker: only the newest request of a key is delivered; a
superseded one that is running is asked to stop; a refresh lets it finish."""
from __future__ import annotations

import threading

import pytest

import engine
from gui.latest_worker import LatestRequestWorker


@pytest.fixture
def worker(qtbot):
    worker = LatestRequestWorker()
    yield worker
    assert worker.close()


def blocking(started: threading.Event, release: threading.Event, seen_cancel: list):
    """A request that runs until released, polling cancel as engine.model.introspect does."""
    def fn(value, cancel):
        started.set()
        while not release.wait(0.005):
            if cancel():
                seen_cancel.append(value)
                raise engine.Cancelled("superseded")
        return value
    return fn


def test_a_newer_request_cancels_the_running_one_and_only_it_is_delivered(qtbot, worker):
    started, release, cancelled = threading.Event(), threading.Event(), []
    delivered = []
    worker.resultReady.connect(lambda key, value: delivered.append((key, value)))
    worker.submit("bars", blocking(started, release, cancelled), "k")
    assert started.wait(5)
    worker.submit("bars", lambda value, cancel: value, "ka")  # never started: replaced next
    worker.submit("bars", lambda value, cancel: value, "kar")
    qtbot.waitUntil(lambda: delivered == [("bars", "kar")], timeout=5000)
    assert cancelled == ["k"]
    qtbot.wait(50)
    assert delivered == [("bars", "kar")]


def test_a_refresh_lets_the_running_request_finish_and_then_runs(qtbot, worker):
    started, release, cancelled = threading.Event(), threading.Event(), []
    delivered = []
    worker.resultReady.connect(lambda key, value: delivered.append(value))
    worker.submit("beams", blocking(started, release, cancelled), "old parameters")
    assert started.wait(5)
    worker.refresh("beams", lambda value, cancel: value, "stale refresh")
    worker.refresh("beams", lambda value, cancel: value, "new parameters")
    release.set()
    qtbot.waitUntil(lambda: delivered == ["old parameters", "new parameters"], timeout=5000)
    assert cancelled == []


def test_keys_are_independent_and_errors_reach_the_asker(qtbot, worker):
    results, failures = {}, []
    worker.resultReady.connect(results.__setitem__)
    worker.failed.connect(lambda key, message: failures.append((key, message)))

    def broken(cancel):
        raise ValueError("character 'Z' is not in the vocabulary")

    worker.submit("a", lambda cancel: 1)
    worker.submit("b", broken)
    worker.submit("c", lambda cancel: 3)
    qtbot.waitUntil(lambda: results == {"a": 1, "c": 3} and bool(failures), timeout=5000)
    assert failures == [("b", "character 'Z' is not in the vocabulary")]


def test_cancel_drops_a_result_already_on_its_way(qtbot, worker):
    delivered = []
    worker.resultReady.connect(lambda key, value: delivered.append(value))
    done = threading.Event()

    def fn(cancel):
        done.set()
        return "late"

    worker.submit("map", fn)
    assert done.wait(5)
    qtbot.waitUntil(lambda: not worker.is_busy(), timeout=5000)
    worker.cancel("map")  # the queued signal arrives after this: dropped
    qtbot.wait(50)
    assert delivered == []


def test_close_stops_a_running_request(worker):
    started, release, cancelled = threading.Event(), threading.Event(), []
    worker.submit("x", blocking(started, release, cancelled), 1)
    assert started.wait(5)
    assert worker.close(timeout_s=1.0)
    assert worker.submit("x", lambda cancel: 2) == 0  # closed: nothing more runs


def test_a_slow_worker_steps_aside_while_the_quick_one_is_busy(qtbot, worker):
    slow = LatestRequestWorker(yield_to=worker)
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
    slow.resultReady.connect(lambda key, value: delivered.append(value))
    worker.submit("bars", quick)
    slow.submit("beams", search)
    qtbot.wait(50)
    assert delivered == []  # waiting for the quick one
    quick_release.set()
    qtbot.waitUntil(lambda: delivered == ["beams"], timeout=5000)
    assert polls_while_quick_ran == [True]
    assert slow.close()


def test_deleting_the_qt_object_ends_the_thread():
    """The thread holds no strong reference to the worker: when its owner deletes
    it, the thread ends instead of outliving it (and Qt never deletes the object
    from the worker's thread)."""
    import shiboken6
    from PySide6.QtCore import QObject

    owner = QObject()
    worker = LatestRequestWorker(owner)
    thread = worker._thread
    del worker
    shiboken6.delete(owner)
    thread.join(2)
    assert not thread.is_alive()
