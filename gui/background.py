"""Work off the GUI thread, one way for every job (in the spirit of napari's
create_worker): reading a dataset or a checkpoint, writing a CSV, pruning
autosaves, the scaling study's availability check, the inspect panels'
computations, re-smoothing the loss curves. (A training run is the one other
thread: a session's TrainingWorker, gui/worker.py, which lives as long as
the run and owns its backend.)

A `Background` runs calls, `start(fn, *args, on_done=..., on_failed=...)`,
and reports each on the GUI thread: on_done(result) or on_failed(exception),
then its `done(key, result)` or `failed(key, exception)` signal; the window
never waits for a disk, a network share, a FIFO or a computation. Options:
- newest_wins: only the newest call of a key counts: starting one supersedes
  the earlier calls of that key (one not started yet is dropped, a running
  one's report is dropped, and with `cancellable` its cancel() turns true),
  and `cancel(key)` drops them all (Open dataset, Load checkpoint, a
  keystroke in an inspect panel, a smoothing slider's drag);
- one_thread: the calls run one at a time, in the order made, in one daemon
  thread (computations that would only fight over the GIL and the BLAS
  threads); else each call has a daemon thread of its own, so a call that
  never returns (a FIFO nobody writes to) holds up no other and only leaves a
  sleeping thread, which does not keep the process from exiting;
- cancellable: fn is called with cancel=, a callable to poll; raising
  engine.Cancelled when it is true ends the call silently;
- yield_to=another one-thread Background: this one's cancel polls wait while
  the other is busy (a slow search steps aside for a quick computation).
A generator function reports as it goes (as superqt's GeneratorWorker):
each value it yields reaches on_yielded(value) and the `yielded(key, value)`
signal, and what it returns is its result (the scaling study's rows).
`run_in_background(fn, *args, parent=window, on_done=..., on_failed=...)` is
one call of its own, the Background deleting itself once it has reported.

A thread never emits on a Qt object that the window may be deleting at that
moment (a crash): `report_from_thread` hands the report to the GUI thread
through a relay that lives as long as the app, and there the report is
dropped if its object has gone (the window closed meanwhile); no thread holds
a Background itself (a weak reference), and deleting one ends its thread.
"""
from __future__ import annotations

import inspect
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable

from PySide6.QtCore import QCoreApplication, QObject, Qt, Signal, Slot
from shiboken6 import isValid

from engine.errors import Cancelled

YIELD_POLL_S = 0.002  # how often a call that yields to another Background looks again


def emit_while_alive(signal, *args) -> bool:
    """signal.emit(*args) on the GUI thread; False (and nothing raised) when the
    object behind it has been deleted. (From another thread: report_from_thread.)"""
    try:
        signal.emit(*args)
        return True
    except RuntimeError:  # "Internal C++ object already deleted"
        return False


class _Relay(QObject):
    """Runs callables that other threads post, on the GUI thread (where it lives)."""

    posted = Signal(object)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.posted.connect(self._run, Qt.QueuedConnection)

    @Slot(object)
    def _run(self, fn: Callable[[], None]) -> None:
        fn()


_relay: _Relay | None = None


def make_relay() -> None:
    """The relay report_from_thread uses: made once, on the GUI thread (by each
    object whose threads report), and kept as long as the app."""
    global _relay
    if _relay is None:
        _relay = _Relay(QCoreApplication.instance())


def report_from_thread(obj: QObject, signal: str, *args, then: Callable[[], None] | None = None) -> None:
    """From a thread: obj's signal emitted with args on the GUI thread, then then(),
    if obj still exists there (make_relay must have been called)."""
    def emit() -> None:
        if isValid(obj):
            getattr(obj, signal).emit(*args)
            if then is not None:
                then()

    _relay.posted.emit(emit)


@dataclass
class _Request:
    key: str
    generation: int
    fn: Callable
    args: tuple


class _Calls:
    """The calls and their generations, shared by the GUI thread and the calls'
    threads (Python only: no thread holds the Qt object)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.pending: dict[int, _Request] = {}  # one_thread: not started yet, oldest first
        self.running: set[int] = set()
        self.floor: dict[str, int] = {}  # a key's calls below this generation report nothing
        self.generation = 0
        self.closing = False

    def put(self, key: str, fn: Callable, args: tuple, supersede: bool, queued: bool,
            replace_pending: bool) -> tuple[_Request | None, list[int]]:
        """The new call (None once closing) and the generations of the pending calls it replaced."""
        with self.cond:
            if self.closing:
                return None, []
            self.generation += 1
            if supersede:
                self.floor[key] = self.generation
            dropped = self._drop_pending(key) if replace_pending else []
            request = _Request(key, self.generation, fn, args)
            if queued:
                self.pending[request.generation] = request
                self.cond.notify_all()
            else:
                self.running.add(request.generation)
            return request, dropped

    def _drop_pending(self, key: str) -> list[int]:
        dropped = [g for g, r in self.pending.items() if r.key == key]
        for generation in dropped:
            del self.pending[generation]
        return dropped

    def cancel(self, key: str) -> None:
        with self.cond:
            self.generation += 1
            self.floor[key] = self.generation
            self._drop_pending(key)

    def close(self, *_) -> None:
        with self.cond:
            self.closing = True
            self.pending.clear()
            self.cond.notify_all()

    def is_busy(self) -> bool:
        """A call is waiting or running (one whose report will be dropped too)."""
        with self.cond:
            return bool(self.pending or self.running)

    def stale(self, key: str, generation: int) -> bool:
        return self.closing or generation < self.floor.get(key, 0)

    def take(self) -> _Request | None:
        """The oldest pending call (waiting for one); None once closing."""
        with self.cond:
            while not self.pending and not self.closing:
                self.cond.wait()
            if self.closing:
                return None
            request = self.pending.pop(next(iter(self.pending)))
            self.running.add(request.generation)
            return request

    def done(self, generation: int) -> None:
        with self.cond:
            self.running.discard(generation)


def _call(calls: _Calls, request: _Request, owner: weakref.ref, cancellable: bool,
          yield_to: _Calls | None) -> None:
    """In a call's thread: run it and report it to its Background on the GUI thread."""
    def cancel() -> bool:
        while yield_to is not None and yield_to.is_busy() and not calls.stale(request.key, request.generation):
            time.sleep(YIELD_POLL_S)
        return calls.stale(request.key, request.generation)

    def report(signal: str, *args) -> None:
        background = owner()
        if background is not None:
            report_from_thread(background, signal, request.generation, *args)
        del background  # the GUI thread's relay holds it until it has reported

    result, error = None, None
    try:
        result = request.fn(*request.args, **({"cancel": cancel} if cancellable else {}))
        if inspect.isgenerator(result):
            result = yield_each(result, lambda: calls.stale(request.key, request.generation),
                                lambda value: report("_yielded", value))
    except Exception as exc:  # every failure is reported to whoever asked, never raised here
        error = exc
    finally:
        calls.done(request.generation)
    if isinstance(error, Cancelled) or calls.stale(request.key, request.generation):
        return
    report("_finished", result, error)


def yield_each(generator, stale: Callable[[], bool], report: Callable[[object], None]):
    """Report each value the generator yields (none once its call is stale); its return value."""
    while True:
        try:
            value = next(generator)
        except StopIteration as stop:
            return stop.value
        if stale():
            generator.close()
            raise Cancelled("superseded")
        report(value)


def _serve(calls: _Calls, owner: weakref.ref, cancellable: bool, yield_to: _Calls | None) -> None:
    """A one-thread Background's thread: its calls in order until it closes."""
    while (request := calls.take()) is not None:
        _call(calls, request, owner, cancellable, yield_to)


class Background(QObject):
    """Calls off the GUI thread, reported on it (see the module's docstring).

    Create it on the GUI thread, with a parent (the object whose calls these are)."""

    done = Signal(str, object)     # key, the call's result (after its on_done)
    failed = Signal(str, object)   # key, the exception the call raised (after its on_failed)
    yielded = Signal(str, object)  # key, a value a generator call yielded (after its on_yielded)
    _finished = Signal(int, object, object)  # from a call's thread: generation, result, exception
    _yielded = Signal(int, object)           # from a call's thread: generation, value

    def __init__(self, parent: QObject | None = None, name: str = "background", *, newest_wins: bool = False,
                 one_thread: bool = False, cancellable: bool = False, yield_to: "Background | None" = None):
        super().__init__(parent)
        make_relay()
        self.name = name
        self._newest_wins, self._one_thread, self._cancellable = newest_wins, one_thread, cancellable
        self._yield_to = yield_to._calls if yield_to is not None else None
        self._calls = _Calls()
        self._handlers: dict[int, tuple] = {}  # calls that will report: (key, on_done, on_failed, on_yielded)
        self._thread: threading.Thread | None = None  # one_thread: made on the first call
        self._finished.connect(self._deliver)  # emitted on the GUI thread (report_from_thread)
        self._yielded.connect(self._deliver_yielded)
        self.destroyed.connect(self._calls.close)  # a plain object's method: callable during deletion

    def start(self, fn: Callable, *args, key: str = "", on_done: Callable | None = None,
              on_failed: Callable | None = None, on_yielded: Callable | None = None, refresh: bool = False) -> int:
        """Start fn(*args) (a call of `key`); returns its number (0 once closed).
        refresh=True (one_thread and newest_wins): it replaces a call of key not
        started yet but lets a running one finish and report (new parameters after
        a training chunk: steady refreshes never starve a slow computation)."""
        if refresh and not (self._one_thread and self._newest_wins):
            raise ValueError("refresh is for a one-thread Background where the newest call wins")
        supersede = self._newest_wins and not refresh
        request, dropped = self._calls.put(key, fn, args, supersede, self._one_thread, self._newest_wins)
        for generation in dropped:
            self._handlers.pop(generation, None)
        if request is None:
            return 0
        if supersede:
            self._forget(key, request.generation)
        self._handlers[request.generation] = (key, on_done, on_failed, on_yielded)
        owner = weakref.ref(self)
        if not self._one_thread:
            threading.Thread(target=_call, args=(self._calls, request, owner, self._cancellable, self._yield_to),
                             name=self.name, daemon=True).start()
        elif self._thread is None:
            self._thread = threading.Thread(target=_serve, name=self.name, daemon=True,
                                            args=(self._calls, owner, self._cancellable, self._yield_to))
            self._thread.start()
        return request.generation

    def cancel(self, key: str = "") -> None:
        """The calls of key report nothing (one not started never runs; a running one's
        cancel() turns true), even a report already on its way."""
        self._calls.cancel(key)
        self._forget(key, self._calls.generation)

    @property
    def busy(self) -> bool:
        """A call is going whose report will count."""
        return bool(self._handlers)

    def close(self, timeout_s: float = 2.0) -> bool:
        """No more calls and no more reports (a running call is asked to cancel); True
        when the one thread ended within timeout_s (calls of their own threads are
        never waited for: they may never return)."""
        self._calls.close()
        self._handlers.clear()
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _forget(self, key: str, below: int) -> None:
        for generation in [g for g, (k, *_) in self._handlers.items() if k == key and g < below]:
            del self._handlers[generation]

    @Slot(int, object, object)
    def _deliver(self, generation: int, result: object, error: object) -> None:
        entry = self._handlers.pop(generation, None)
        if entry is None:
            return  # superseded, cancelled or closed meanwhile
        key, on_done, on_failed, _ = entry
        if error is not None:
            if on_failed is not None:
                on_failed(error)
            self.failed.emit(key, error)
        else:
            if on_done is not None:
                on_done(result)
            self.done.emit(key, result)

    @Slot(int, object)
    def _deliver_yielded(self, generation: int, value: object) -> None:
        entry = self._handlers.get(generation)
        if entry is None:
            return
        key, _, _, on_yielded = entry
        if on_yielded is not None:
            on_yielded(value)
        self.yielded.emit(key, value)


def run_in_background(fn: Callable, *args, parent: QObject, name: str = "", on_done: Callable | None = None,
                      on_failed: Callable | None = None, on_yielded: Callable | None = None) -> Background:
    """fn(*args) in a thread of its own; on_done(result) / on_failed(exc) on the GUI
    thread; its Background deletes itself once it has reported (with the parent,
    if that goes first: nothing is reported then)."""
    call = Background(parent, name or getattr(fn, "__name__", "background"))
    call.done.connect(call.deleteLater)
    call.failed.connect(call.deleteLater)
    call.start(fn, *args, on_done=on_done, on_failed=on_failed, on_yielded=on_yielded)
    return call
