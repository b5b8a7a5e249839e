"""Work off the GUI thread, one way for every job (in the spirit of napari's
create_worker): reading a dataset or a checkpoint, writing a CSV, pruning
autosaves, the scaling study's availability check.

`run_in_background(fn, *args, on_done=..., on_failed=..., parent=window)`
runs fn in its own daemon thread and calls on_done(result) or
on_failed(exception) on the GUI thread, so the window never waits for a
disk, a network share or a FIFO. A call that never returns (a FIFO nobody
writes to) only leaves a sleeping daemon thread, which does not keep the
process from exiting. A thread never emits on a Qt object that the window
may be deleting at that moment (a crash): `report_from_thread` hands the
report to the GUI thread through a relay that lives as long as the app, and
there the report is dropped if its object has gone (the window closed
meanwhile); inspect workers, the scaling study and these calls report so.
`NewestCall` keeps only the newest of a kind of call (Open dataset, Load
checkpoint): a call superseded by a newer one, or forgotten, reports nothing.
"""
from __future__ import annotations

import threading
from typing import Callable

from PySide6.QtCore import QCoreApplication, QObject, Qt, Signal, Slot
from shiboken6 import isValid


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


class BackgroundCall(QObject):
    """fn(*args) in a daemon thread; `done(call, result)` or `failed(call, exception)`
    on the GUI thread (call is this object, to tell a superseded call's report).

    Create it on the GUI thread with a parent (the window); it deletes itself
    after reporting. A result that arrives after the parent is gone is dropped."""

    done = Signal(object, object)
    failed = Signal(object, object)

    def __init__(self, name: str, fn: Callable, *args, parent: QObject | None = None):
        super().__init__(parent)
        make_relay()
        self.name, self.args = name, args
        self._thread = threading.Thread(target=self._run, args=(fn, args), name=name, daemon=True)

    def start(self) -> "BackgroundCall":
        self._thread.start()
        return self

    def _run(self, fn: Callable, args: tuple) -> None:
        try:
            result = fn(*args)
        except Exception as exc:  # every failure is reported, whatever its type
            report_from_thread(self, "failed", self, exc, then=self.deleteLater)
        else:
            report_from_thread(self, "done", self, result, then=self.deleteLater)


def run_in_background(fn: Callable, *args, parent: QObject, name: str = "",
                      on_done: Callable | None = None, on_failed: Callable | None = None) -> BackgroundCall:
    """Start fn(*args) off the GUI thread; on_done(result) / on_failed(exc) on the
    GUI thread. Returns the call (`call.args` are its args; NewestCall drops a
    superseded call's report)."""
    call = BackgroundCall(name or getattr(fn, "__name__", "background"), fn, *args, parent=parent)
    if on_done is not None:
        call.done.connect(lambda c, result: on_done(result))
    if on_failed is not None:
        call.failed.connect(lambda c, exc: on_failed(exc))
    return call.start()


class NewestCall:
    """Background calls of one kind where the newest wins: starting one supersedes
    the call before, forget() drops the call going, and only the newest call's
    report reaches its on_done / on_failed (the call is over before they run)."""

    def __init__(self, parent: QObject, name: str):
        self._parent, self._name = parent, name
        self._call: BackgroundCall | None = None

    @property
    def busy(self) -> bool:
        """A call is going whose report will count."""
        return self._call is not None

    def start(self, fn: Callable, *args, on_done: Callable, on_failed: Callable) -> BackgroundCall:
        """Start fn(*args), superseding the call going; returns the new call."""
        def if_newest(handler):
            # `call` is bound below, before any report: reports are queued to this (the GUI) thread
            return lambda value: self._report(call, handler, value)

        call = self._call = run_in_background(fn, *args, parent=self._parent, name=self._name,
                                              on_done=if_newest(on_done), on_failed=if_newest(on_failed))
        return call

    def forget(self) -> None:
        """The call going (if any) reports nothing."""
        self._call = None

    def _report(self, call: BackgroundCall, handler: Callable, value) -> None:
        if call is not self._call:
            return  # superseded by a newer call, or forgotten
        self._call = None
        handler(value)
