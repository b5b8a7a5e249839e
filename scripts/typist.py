"""A typist for the next-character panel, shared by inspect_latency.py and
responsiveness.py: types TYPED into the prefix box key by key, each key a
typist's pause (50 to 150 ms) after the previous key's bars were drawn, and
times each key from its key event to its bars drawn (the panel's
distributionShown for the new prefix, plus a forced repaint of the plot).
Call it from a running event loop: the GUI thread idles in Qt between keys,
as it does for a person.
"""
from __future__ import annotations

import random
import statistics
import time

from PySide6.QtCore import Qt, QTimer
from PySide6.QtTest import QTest

TYPED = "kaylee\bn\b\bmar\b\bia\b\bisabella"  # \b is Backspace


def latency_summary(latencies_ms: list[float]) -> tuple[int, float, float, float]:
    """(keys, median, p90, max) of keystroke-to-bars latencies, in ms."""
    ms = sorted(latencies_ms)
    return len(ms), statistics.median(ms), ms[int(0.9 * (len(ms) - 1))], ms[-1]


class Typist:
    def __init__(self, panel, max_prefix: int, keys: int | None = None, on_done=None, seed: int = 0):
        """panel: a NextCharPanel; the prefix is cleared at max_prefix characters;
        keys: stop after this many keys and call on_done (None: type until stop())."""
        self.panel, self.max_prefix, self.keys, self.on_done = panel, max_prefix, keys, on_done
        self.rng = random.Random(seed)
        self.latencies_ms: list[float] = []
        self.typed = 0
        self.running = False
        self._expected: str | None = None  # the prefix whose bars the last key awaits
        self._started = 0.0
        panel.distributionShown.connect(self._on_bars)

    def start(self) -> None:
        self.running, self.latencies_ms = True, []
        QTimer.singleShot(0, self._type_next)

    def stop(self) -> None:
        self.running = False

    def close(self) -> None:
        self.stop()
        self.panel.distributionShown.disconnect(self._on_bars)

    def _type_next(self) -> None:
        if not self.running:
            return
        if self.keys is not None and self.typed >= self.keys:
            self.running = False
            if self.on_done is not None:
                self.on_done()
            return
        key = TYPED[self.typed % len(TYPED)]
        self.typed += 1
        panel = self.panel
        if len(panel.prefix) >= self.max_prefix:
            panel.prefix_edit.clear()
        expected = panel.prefix[:-1] if key == "\b" else panel.prefix + key
        if expected == panel.prefix:  # Backspace on an empty box
            QTimer.singleShot(0, self._type_next)
            return
        self._expected, self._started = expected, time.perf_counter()
        if key == "\b":
            QTest.keyClick(panel.prefix_edit, Qt.Key_Backspace)
        else:
            QTest.keyClicks(panel.prefix_edit, key)

    def _on_bars(self, dist) -> None:
        if not self.running or dist.prefix != self._expected:
            return
        self.panel.plot.viewport().repaint()  # drawn now, not at the next idle moment
        self.latencies_ms.append(1e3 * (time.perf_counter() - self._started))
        self._expected = None
        QTimer.singleShot(int(self.rng.uniform(50, 150)), self._type_next)
