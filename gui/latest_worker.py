"""Computing off the GUI thread where only the newest request counts.

A LatestRequestWorker runs functions in one background thread, one request
per key at a time. `submit` supersedes every earlier request of the same key:
one not yet started is dropped, one running is asked to stop (its `cancel`
callable turns true) and its result is never delivered, so a newer keystroke
wins. `refresh` (new parameters after a training chunk) only replaces a
request that has not started yet and lets a running one finish, so steady
refreshes never starve a slow computation. Results come back as signals in
the GUI thread.

A worker made with yield_to=another waits at each of its requests' cancel
polls while the other one is busy: a long computation steps aside for a
quick one (they would otherwise share the GIL and the BLAS threads).
"""
from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from PySide6.QtCore import QObject, Signal

import engine

from .background import make_relay, report_from_thread

YIELD_POLL_S = 0.002


@dataclass
class _Request:
    key: str
    generation: int
    fn: Callable
    args: tuple


class _Queue:
    """The requests and their generations, shared by the GUI thread and the
    worker thread (Python only: the thread never holds the Qt object)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.pending: dict[str, _Request] = {}  # not started yet, oldest first
        self.floor: dict[str, int] = {}  # a key's results below this generation are dropped
        self.running: _Request | None = None
        self.generation = 0
        self.closing = False

    def put(self, key: str, fn: Callable, args: tuple, supersede: bool) -> int:
        with self.cond:
            if self.closing:
                return 0
            self.generation += 1
            if supersede:
                self.floor[key] = self.generation
            self.pending.pop(key, None)  # re-inserted last: requests run in the order made
            self.pending[key] = _Request(key, self.generation, fn, args)
            self.cond.notify_all()
            return self.generation

    def cancel(self, key: str) -> None:
        with self.cond:
            self.generation += 1
            self.floor[key] = self.generation
            self.pending.pop(key, None)

    def close(self, *_) -> None:
        with self.cond:
            self.closing = True
            self.pending.clear()
            self.cond.notify_all()

    def is_busy(self) -> bool:
        with self.cond:
            return bool(self.pending) or self.running is not None

    def stale(self, key: str, generation: int) -> bool:
        return self.closing or generation < self.floor.get(key, 0)

    def take(self) -> _Request | None:
        """The oldest pending request (waiting for one); None once closing."""
        with self.cond:
            while not self.pending and not self.closing:
                self.cond.wait()
            if self.closing:
                return None
            self.running = self.pending.pop(next(iter(self.pending)))
            return self.running

    def done(self) -> None:
        with self.cond:
            self.running = None


def _serve(queue: _Queue, worker_ref: Callable, yield_to: _Queue | None) -> None:
    """The worker thread: run requests until the queue closes."""
    def poll(request: _Request) -> bool:
        while yield_to is not None and yield_to.is_busy() and not queue.stale(request.key, request.generation):
            time.sleep(YIELD_POLL_S)
        return queue.stale(request.key, request.generation)

    while (request := queue.take()) is not None:
        result, error = None, ""
        try:
            result = request.fn(*request.args, cancel=lambda r=request: poll(r))
        except engine.Cancelled:
            error = None
        except Exception as exc:  # reported to the panel that asked, never raised here
            error = str(exc) or type(exc).__name__
        queue.done()
        worker = worker_ref()
        if worker is None:
            return
        if error is not None and not queue.stale(request.key, request.generation):
            report_from_thread(worker, "_finished", request.key, request.generation, result, error)
        del worker


class LatestRequestWorker(QObject):
    """`fn(*args, cancel=...)` for each request, in one daemon thread.

    fn should poll cancel() where it can and raise engine.Cancelled when it is
    true; a cancelled request is dropped silently. The thread ends on close()
    or when the Qt object is deleted (it holds only a weak reference to it, so
    the object is never deleted from the wrong thread).
    """

    resultReady = Signal(str, object)  # key, the newest request's result
    failed = Signal(str, str)          # key, message (the newest request raised)
    _finished = Signal(str, int, object, str)  # from the thread: key, generation, result, error

    def __init__(self, parent=None, name: str = "inspect", yield_to: "LatestRequestWorker | None" = None):
        super().__init__(parent)
        make_relay()
        self._queue = _Queue()
        self._finished.connect(self._deliver)  # emitted on the GUI thread (report_from_thread)
        self.destroyed.connect(self._queue.close)  # a plain object's method: callable during deletion
        self._thread = threading.Thread(
            target=_serve, args=(self._queue, weakref.ref(self), yield_to._queue if yield_to else None),
            name=name, daemon=True)
        self._thread.start()

    def submit(self, key: str, fn: Callable, *args: Any) -> int:
        """Run fn(*args) for key, superseding every earlier request of key."""
        return self._queue.put(key, fn, args, supersede=True)

    def refresh(self, key: str, fn: Callable, *args: Any) -> int:
        """Run fn(*args) for key after a running request of key (if any) ends."""
        return self._queue.put(key, fn, args, supersede=False)

    def cancel(self, key: str) -> None:
        """Drop every request of key (pending, running, or result not yet delivered)."""
        self._queue.cancel(key)

    def is_busy(self) -> bool:
        return self._queue.is_busy()

    def close(self, timeout_s: float = 2.0) -> bool:
        """Stop the thread (a running request is asked to cancel); True when it ended."""
        self._queue.close()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _deliver(self, key: str, generation: int, result: object, error: str) -> None:
        if self._queue.stale(key, generation):
            return
        if error:
            self.failed.emit(key, error)
        else:
            self.resultReady.emit(key, result)
