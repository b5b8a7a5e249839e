"""The inspect panels' shared state: the newest parameter snapshot and the
background worker that computes engine.inspect results from it.

The window feeds snapshots (engine.inspect.Snapshot, made in the training
thread between chunks) with set_snapshot; each panel asks for its results
through request() and listens to resultReady for its own key. Panels that
are shown say so, and `wants_snapshots` tells the window whether making
snapshots is worth it at all.
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QWidget

from engine.inspect import Snapshot

from .latest_worker import LatestRequestWorker


class InspectHub(QObject):
    snapshotChanged = Signal(object)  # the new Snapshot, or None (no model)
    resultReady = Signal(str, object)  # key, result
    failed = Signal(str, str)  # key, message

    def __init__(self, parent=None):
        super().__init__(parent)
        self._snapshot: Snapshot | None = None
        self._panels: list[QWidget] = []
        self.worker = LatestRequestWorker(self)
        self.worker.resultReady.connect(self.resultReady)
        self.worker.failed.connect(self.failed)

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    def set_snapshot(self, snapshot: Snapshot | None) -> None:
        """New parameters (after a training chunk, a loaded checkpoint), or None after Reset."""
        self._snapshot = snapshot
        self.snapshotChanged.emit(snapshot)

    def register(self, panel: QWidget) -> None:
        self._panels.append(panel)

    @property
    def wants_snapshots(self) -> bool:
        """Whether a panel that uses snapshots is on screen."""
        return any(panel.isVisible() for panel in self._panels)

    def request(self, key: str, fn: Callable, *args, refresh: bool = False) -> bool:
        """fn(snapshot, *args, cancel=...) off the GUI thread on the current snapshot;
        False when there is none. refresh=True: let a running request of key finish."""
        if self._snapshot is None:
            return False
        put = self.worker.refresh if refresh else self.worker.submit
        put(key, fn, self._snapshot, *args)
        return True

    def cancel(self, key: str) -> None:
        self.worker.cancel(key)

    def close(self) -> bool:
        return self.worker.close()
