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
from dataclasses import dataclass
from typing import Any, Callable

from PySide6.QtCore import QObject, Qt, Signal

import engine

YIELD_POLL_S = 0.002


@dataclass
class _Request:
    key: str
    generation: int
    fn: Callable
    args: tuple


class LatestRequestWorker(QObject):
    """`fn(*args, cancel=...)` for each request, in one daemon thread.

    fn should poll cancel() where it can and raise engine.Cancelled when it is
    true; a cancelled request is dropped silently.
    """

    resultReady = Signal(str, object)  # key, the newest request's result
    failed = Signal(str, str)          # key, message (the newest request raised)
    _finished = Signal(str, int, object, str)  # from the thread: key, generation, result, error

    def __init__(self, parent=None, name: str = "inspect", yield_to: "LatestRequestWorker | None" = None):
        super().__init__(parent)
        self._yield_to = yield_to
        self._cond = threading.Condition()
        self._pending: dict[str, _Request] = {}  # not started yet, oldest first
        self._floor: dict[str, int] = {}  # a key's results below this generation are dropped
        self._running: _Request | None = None
        self._generation = 0
        self._closing = False
        self._finished.connect(self._deliver, Qt.QueuedConnection)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # GUI thread -------------------------------------------------------------
    def submit(self, key: str, fn: Callable, *args: Any) -> int:
        """Run fn(*args) for key, superseding every earlier request of key."""
        return self._put(key, fn, args, supersede=True)

    def refresh(self, key: str, fn: Callable, *args: Any) -> int:
        """Run fn(*args) for key after a running request of key (if any) ends."""
        return self._put(key, fn, args, supersede=False)

    def cancel(self, key: str) -> None:
        """Drop every request of key (pending, running, or result not yet delivered)."""
        with self._cond:
            self._generation += 1
            self._floor[key] = self._generation
            self._pending.pop(key, None)

    def is_busy(self) -> bool:
        with self._cond:
            return bool(self._pending) or self._running is not None

    def close(self, timeout_s: float = 2.0) -> bool:
        """Stop the thread (a running request is asked to cancel); True when it ended."""
        with self._cond:
            self._closing = True
            self._pending.clear()
            self._cond.notify_all()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _put(self, key: str, fn: Callable, args: tuple, supersede: bool) -> int:
        with self._cond:
            if self._closing:
                return 0
            self._generation += 1
            if supersede:
                self._floor[key] = self._generation
            self._pending.pop(key, None)  # re-inserted last: requests run in the order made
            self._pending[key] = _Request(key, self._generation, fn, args)
            self._cond.notify_all()
            return self._generation

    def _deliver(self, key: str, generation: int, result: object, error: str) -> None:
        with self._cond:
            stale = generation < self._floor.get(key, 0)
        if stale:
            return
        if error:
            self.failed.emit(key, error)
        else:
            self.resultReady.emit(key, result)

    # worker thread ------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                key = next(iter(self._pending))
                request = self._running = self._pending.pop(key)
            result, error = None, ""
            try:
                result = request.fn(*request.args, cancel=lambda r=request: self._poll(r))
            except engine.Cancelled:
                error = None
            except Exception as exc:  # reported to the panel that asked, never raised here
                error = str(exc) or type(exc).__name__
            with self._cond:
                self._running = None
            if error is not None and not self._stale(request):
                try:
                    self._finished.emit(request.key, request.generation, result, error)
                except RuntimeError:  # the Qt object went away meanwhile
                    return

    def _poll(self, request: _Request) -> bool:
        """The cancel callable of a running request: True when it is superseded."""
        while self._yield_to is not None and self._yield_to.is_busy() and not self._stale(request):
            time.sleep(YIELD_POLL_S)
        return self._stale(request)

    def _stale(self, request: _Request) -> bool:
        return self._closing or request.generation < self._floor.get(request.key, 0)
