"""Python's cyclic garbage collector, run on the GUI thread only.

CPython collects cycles in whichever thread happens to allocate past the
collector's threshold. When that is a worker thread and the garbage holds Qt
wrappers (a closed dialog, a finished worker's QObject, a plot item), their C++
destructors run in that thread, off the GUI thread, and Qt can crash: the test
suite once died with "Segmentation fault ... Garbage-collecting" in a worker
thread. So while the window runs, automatic collection is off and a GUI-thread
timer collects instead, by the collector's own generation thresholds.

A full collection walks every object the collector tracks, holding the GIL
throughout: with the window's imports (Qt, pyqtgraph, NumPy, the engine) some
73,000 objects, 40-50 ms of CPU on the 2-core machine of docs/window.md, the
window standing still meanwhile. Those objects (modules, classes, functions)
live as long as the app, so the app starts the collector with freeze=True:
what has survived a collection by then goes into the permanent generation
(gc.freeze), and a full collection walks only what came after.
"""
from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

INTERVAL_MS = 250  # garbage waits at most this long; a check without garbage costs microseconds


class GuiThreadCollector(QObject):
    """Turns automatic collection off while started; its timer (this object's thread,
    the GUI thread) collects the generations that have passed their thresholds."""

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.thresholds = gc.get_threshold()
        self._was_enabled = gc.isenabled()
        self._froze = False
        self._timer = QTimer(self, interval=INTERVAL_MS)
        self._timer.timeout.connect(self.collect_due)

    def start(self, freeze: bool = False) -> None:
        """freeze: collect now, then leave every object still alive out of later
        collections (gc.freeze), as the app does once its imports are done."""
        self._was_enabled = gc.isenabled()
        gc.disable()
        if freeze:
            gc.collect()
            gc.freeze()
            self._froze = True
        self._timer.start()

    def stop(self) -> None:
        """Collect once more here, then hand collection back to the interpreter."""
        self._timer.stop()
        if self._froze:  # what was frozen is collectable again
            gc.unfreeze()
            self._froze = False
        gc.collect()
        if self._was_enabled:
            gc.enable()

    def due_generation(self) -> int | None:
        """The oldest generation whose count passed its threshold (as CPython picks), or None."""
        counts = gc.get_count()
        due = None
        for generation, (count, threshold) in enumerate(zip(counts, self.thresholds)):
            if threshold and count > threshold:
                due = generation
            else:
                break
        return due

    def collect_due(self) -> None:
        generation = self.due_generation()
        if generation is not None:
            gc.collect(generation)
