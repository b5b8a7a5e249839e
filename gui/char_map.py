"""The character map: every character's embedding (a wte row) projected to
2-D by PCA, one labelled point per character, refreshed as training goes on.
Vowels are drawn in red; faint trails show where each character has been
over the last refreshes (its earlier embeddings seen on today's axes), so
the vowels' drift towards each other is visible. Each label sits on the side
of its point where it covers no other label (place_labels), so characters
that end up close together stay readable.
The projection comes from engine.model.introspect through an InspectHub.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QCheckBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from engine.model import introspect as ins

from .controls import plot_widget
from .inspect_hub import InspectHub

CHAR_MAP_KEY = "charmap"
TRAIL_LENGTH = 15  # refreshes remembered per character
VOWEL_COLOR, OTHER_COLOR = (200, 40, 40), (30, 60, 140)


# where a label may sit, as pyqtgraph TextItem anchors (the fraction of the label's box
# that lies on its point): right and above, right and below, left and above, left and below
ANCHORS = ((-0.15, 0.9), (-0.15, 0.1), (1.15, 0.9), (1.15, 0.1))
MARKER_PX = 9  # a point's marker, which a label should not cover either


def is_vowel(label: str) -> bool:
    return label.lower() in ins.VOWELS


def label_box(point, size, anchor) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) in pixels of a label of size (w, h) anchored at point (x, y)."""
    (x, y), (w, h), (ax, ay) = point, size, anchor
    left, top = x - ax * w, y - ay * h
    return left, top, left + w, top + h


def _overlaps(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def place_labels(points: np.ndarray, sizes: np.ndarray, order: list[int]) -> list[tuple[float, float]]:
    """An anchor from ANCHORS for each label (pixel point, pixel size), placed greedily
    in `order`: the first side that covers no label placed before and no other point,
    else the side that covers fewest (a label counts ten points)."""
    half = MARKER_PX / 2
    markers = [(x - half, y - half, x + half, y + half) for x, y in points]
    placed: list[tuple[float, float, float, float]] = []
    anchors: list[tuple[float, float]] = [ANCHORS[0]] * len(points)
    for i in order:
        def cost(anchor):
            box = label_box(points[i], sizes[i], anchor)
            return (10 * sum(_overlaps(box, p) for p in placed)
                    + sum(_overlaps(box, m) for j, m in enumerate(markers) if j != i))
        anchors[i] = min(ANCHORS, key=cost)  # min keeps the first of equal costs
        placed.append(label_box(points[i], sizes[i], anchors[i]))
    return anchors


class CharMapPanel(QWidget):
    mapShown = Signal(object)  # the engine.model.introspect.CharMap now drawn

    def __init__(self, hub: InspectHub, parent=None):
        super().__init__(parent, objectName="charMapPanel")
        self.hub = hub
        self.char_map: ins.CharMap | None = None
        self.history: list[np.ndarray] = []  # earlier maps' embeddings, oldest first (trails)
        self._stale = True

        self.plot = plot_widget("charMapPlot", "Each character's embedding projected on its first two "
                                "principal components; vowels in red. Characters the model treats alike "
                                "end up close together.")
        item = self.plot.getPlotItem()
        item.setLabel("bottom", "principal component 1")
        item.setLabel("left", "principal component 2")
        item.getViewBox().setAspectLocked(True)  # distances on screen are distances in the projection
        item.setMenuEnabled(False)
        for side in ("bottom", "left"):
            item.getAxis(side).enableAutoSIPrefix(False)
        self.scatter = pg.ScatterPlotItem(size=7, pen=None)
        item.addItem(self.scatter)
        self.labels: list[pg.TextItem] = []
        self.trail_curves: list[pg.PlotCurveItem] = []
        self._trail_labels: tuple[str, ...] | None = None  # the characters trail_curves were made for
        self.trails_check = QCheckBox("Show t&rails", objectName="charMapTrailsCheck", checked=True)
        self.trails_check.setToolTip(f"Faint lines through each character's last {TRAIL_LENGTH} positions")
        self.clear_trails_button = QPushButton("&Clear trails", objectName="charMapClearTrailsButton")
        self.clear_trails_button.setToolTip("Forget the earlier positions; trails start again from here")
        self.info = QLabel(" ", objectName="charMapInfo", wordWrap=True)

        controls = QHBoxLayout()
        controls.addWidget(self.trails_check)
        controls.addWidget(self.clear_trails_button)
        controls.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.plot, 1)
        layout.addLayout(controls)
        layout.addWidget(self.info)

        self.trails_check.toggled.connect(self._draw_trails)
        item.getViewBox().sigRangeChanged.connect(self._place_labels)  # zoom, pan, resize: pixels move
        item.getViewBox().sigResized.connect(self._place_labels)
        self.clear_trails_button.clicked.connect(self.clear_trails)
        hub.register(self)

    def refresh(self, *_) -> None:
        """Project the hub's current snapshot (oriented like the map now shown);
        while hidden, only remember to do it when shown."""
        if not self.isVisible():
            self._stale = True
            return
        self._stale = False
        self.hub.request(CHAR_MAP_KEY, ins.char_map, self.char_map, self._trail_history(), refresh=True)

    def _trail_history(self) -> list[np.ndarray]:
        """The embeddings the next map draws trails through: the earlier ones and the one shown."""
        shown = [self.char_map.embeddings] if self.char_map is not None else []
        return [*self.history, *shown][-TRAIL_LENGTH:]

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._stale:
            self.refresh()

    def _on_snapshot(self, snapshot) -> None:
        if snapshot is None:
            self.clear()
            self.info.setText("Train a model or load a checkpoint to see its character map.")
            return
        self.refresh()

    def _on_result(self, key: str, result) -> None:
        if key != CHAR_MAP_KEY:
            return
        previous = self.char_map
        if previous is not None and (previous.labels != result.labels or result.step < previous.step):
            self.history.clear()  # another run: its trails would mean nothing here
            result = replace(result, trails=result.trails[:0])
        elif previous is not None and result.step != previous.step:
            self.history = self._trail_history()
        self.char_map = result
        self._draw()
        self.mapShown.emit(result)

    def _on_failed(self, key: str, message: str) -> None:
        if key == CHAR_MAP_KEY:
            self.info.setText(f"<span style='color:#b00020'>{message}</span>")

    def _draw(self) -> None:
        m = self.char_map
        vowel = [is_vowel(label) for label in m.labels]
        colors = [VOWEL_COLOR if v else OTHER_COLOR for v in vowel]
        self.scatter.setData(pos=m.points, brush=[pg.mkBrush(*c) for c in colors],
                             size=[9 if v else 6 for v in vowel], data=list(m.labels))
        if [label.toPlainText() for label in self.labels] != list(m.labels):
            for label in self.labels:
                self.plot.removeItem(label)
            self.labels = []
            for text, v, color in zip(m.labels, vowel, colors):
                label = pg.TextItem(text, color=color, anchor=(-0.15, 0.9))
                font = QFont()
                font.setPointSize(12 if v else 10)
                font.setBold(v)
                label.setFont(font)
                self.plot.addItem(label)
                self.labels.append(label)
        for label, (x, y) in zip(self.labels, m.points):
            label.setPos(float(x), float(y))
        self._place_labels()
        self._draw_trails()
        spread = ins.group_spread(m, ins.VOWELS)
        vowels = ("" if math.isnan(spread) else
                  f" Vowels (red) lie {spread:.2f}× as far apart as characters do on average.")
        self.info.setText(f"Axes: {100 * m.explained[0]:.0f}% and {100 * m.explained[1]:.0f}% of the embeddings' "
                          f"variance, after step {m.step:,}.{vowels}")

    def _place_labels(self, *_) -> None:
        m = self.char_map
        if m is None or len(self.labels) != len(m.points):
            return
        view = self.plot.getPlotItem().getViewBox()
        pixels = [view.mapViewToScene(QPointF(float(x), float(y))) for x, y in m.points]
        points = np.array([(p.x(), p.y()) for p in pixels])
        sizes = np.array([(label.boundingRect().width(), label.boundingRect().height()) for label in self.labels])
        vowels_first = sorted(range(len(m.labels)), key=lambda i: not is_vowel(m.labels[i]))
        for label, anchor in zip(self.labels, place_labels(points, sizes, vowels_first)):
            if tuple(label.anchor) != anchor:
                label.setAnchor(anchor)

    def _draw_trails(self, *_) -> None:
        m = self.char_map
        shown = m is not None and self.trails_check.isChecked() and len(m.trails) > 0
        if not shown or self._trail_labels != m.labels:  # hidden, or other characters: new curves
            for curve in self.trail_curves:
                self.plot.removeItem(curve)
            self.trail_curves, self._trail_labels = [], None
        if not shown:
            return
        if not self.trail_curves:
            for label in m.labels:
                color = VOWEL_COLOR if is_vowel(label) else OTHER_COLOR
                curve = pg.PlotCurveItem(pen=pg.mkPen(*color, 60, width=1.5))
                self.plot.addItem(curve)
                self.trail_curves.append(curve)
            self._trail_labels = m.labels
        path = np.concatenate([m.trails, m.points[None]])  # (refreshes, characters, 2), oldest first
        for i, curve in enumerate(self.trail_curves):  # a refresh: the same curves, new data
            curve.setData(path[:, i, 0], path[:, i, 1])

    def clear_trails(self) -> None:
        self.history = []
        if self.char_map is not None:
            self.char_map = replace(self.char_map, trails=self.char_map.trails[:0])
        self._draw_trails()

    def clear(self) -> None:
        self.char_map = None
        self.history = []
        self.scatter.clear()
        for item in [*self.labels, *self.trail_curves]:
            self.plot.removeItem(item)
        self.labels, self.trail_curves, self._trail_labels = [], [], None
