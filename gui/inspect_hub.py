"""The inspect panels' shared state: the newest parameter snapshot and the
background worker that computes engine.model.introspect results from it.

The window feeds snapshots (engine.model.introspect.Snapshot, made in the training
thread between chunks) with set_snapshot; each panel asks for its results
through request() and listens to resultReady for its own key. Quick results
(the bars, attention, the map: milliseconds) and slow ones (beam search: up
to a second at s128 without a KV cache) run in two threads, so a keystroke's
bars never queue behind a search, and the search pauses while the quick
thread works. `wants_snapshots` tells the window whether
a panel that uses snapshots is on screen at all.
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QWidget

from engine.model.introspect import Snapshot

from .background import Background


class InspectHub(QObject):
    snapshotChanged = Signal(object)  # the new Snapshot, or None (no model)
    resultReady = Signal(str, object)  # key, result
    failed = Signal(str, str)  # key, message

    def __init__(self, parent=None):
        super().__init__(parent)
        self._snapshot: Snapshot | None = None
        self._panels: list[QWidget] = []
        self.worker = Background(self, "inspect", newest_wins=True, one_thread=True, cancellable=True)
        self.slow_worker = Background(self, "inspect-slow", newest_wins=True, one_thread=True, cancellable=True,
                                      yield_to=self.worker)
        for worker in (self.worker, self.slow_worker):
            worker.done.connect(self.resultReady)
            worker.failed.connect(self._on_failed)

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    def set_snapshot(self, snapshot: Snapshot | None) -> None:
        """New parameters (after a training chunk, a loaded checkpoint), or None after Reset."""
        self._snapshot = snapshot
        self.snapshotChanged.emit(snapshot)

    def register(self, panel: QWidget) -> None:
        """Attach a panel: its _on_snapshot(snapshot), _on_result(key, result) and
        _on_failed(key, message) follow the hub, starting with the current snapshot."""
        self._panels.append(panel)
        self.snapshotChanged.connect(panel._on_snapshot)
        self.resultReady.connect(panel._on_result)
        self.failed.connect(panel._on_failed)
        panel._on_snapshot(self._snapshot)

    @property
    def wants_snapshots(self) -> bool:
        """Whether a panel that uses snapshots is on screen."""
        return any(panel.isVisible() for panel in self._panels)

    def request(self, key: str, fn: Callable, *args, refresh: bool = False, slow: bool = False) -> bool:
        """fn(snapshot, *args, cancel=...) off the GUI thread on the current snapshot;
        False when there is none. refresh=True: let a running request of key finish.
        slow=True: in the thread for long computations. A key stays in one thread."""
        if self._snapshot is None:
            return False
        worker = self.slow_worker if slow else self.worker
        worker.start(fn, self._snapshot, *args, key=key, refresh=refresh)
        return True

    def cancel(self, key: str) -> None:
        self.worker.cancel(key)
        self.slow_worker.cancel(key)

    def is_busy(self) -> bool:
        return self.worker.busy or self.slow_worker.busy

    def _on_failed(self, key: str, exc: Exception) -> None:
        self.failed.emit(key, str(exc) or type(exc).__name__)

    def close(self, timeout_s: float = 2.0) -> bool:
        """Stop both threads (running requests are asked to cancel); True when they ended
        within timeout_s each (the window passes 0: it never waits)."""
        return all([self.worker.close(timeout_s), self.slow_worker.close(timeout_s)])
