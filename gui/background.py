"""File work off the GUI thread: reading a dataset or a checkpoint, writing a CSV.

Each call runs in its own daemon thread and reports through a queued signal,
so the window never waits for a disk, a network share or a FIFO. A call that
never returns (a FIFO nobody writes to) only leaves a sleeping daemon thread,
which does not keep the process from exiting.
"""
from __future__ import annotations

import threading
from typing import Callable

from PySide6.QtCore import QObject, Signal


class BackgroundCall(QObject):
    """fn(*args) in a daemon thread; `done(call, result)` or `failed(call, exception)`
    on the GUI thread (call is this object, to tell a superseded call's report).

    Create it on the GUI thread with a parent (the window); it deletes itself
    after reporting. A result that arrives after the parent is gone is dropped."""

    done = Signal(object, object)
    failed = Signal(object, object)

    def __init__(self, name: str, fn: Callable, *args, parent: QObject | None = None):
        super().__init__(parent)
        self.name, self.args = name, args
        self._thread = threading.Thread(target=self._run, args=(fn, args), name=name, daemon=True)

    def start(self) -> "BackgroundCall":
        self._thread.start()
        return self

    def _run(self, fn: Callable, args: tuple) -> None:
        try:
            result = fn(*args)
        except Exception as exc:  # every failure is reported, whatever its type
            self._emit(self.failed, exc)
        else:
            self._emit(self.done, result)

    def _emit(self, signal, value) -> None:
        try:
            signal.emit(self, value)
            self.deleteLater()  # after the queued report (events are handled in order)
        except RuntimeError:  # the parent went away meanwhile (window closed)
            pass
