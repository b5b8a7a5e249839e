"""The attention panel: for a name (typed, or set from outside, e.g. a clicked
sample), the attention probabilities of one layer and head as a heatmap with
the characters on both axes: row i is the query position, column j the key
it attends to. Positions never attend to later ones, so the upper triangle
is left blank. The numbers come from engine.model.introspect through an InspectHub.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QLineEdit, QVBoxLayout, QWidget

from engine.model import introspect as ins

from .inspect_hub import InspectHub
from .controls import buddy, plot_widget

ATTENTION_KEY = "attention"


class AttentionPanel(QWidget):
    mapsShown = Signal(object)  # the engine.model.introspect.Attention now drawn

    def __init__(self, hub: InspectHub, parent=None):
        super().__init__(parent, objectName="attentionPanel")
        self.hub = hub
        self.attention: ins.Attention | None = None
        self._stale = True

        self.name_edit = QLineEdit(objectName="attentionNameEdit", placeholderText="a name, e.g. emma")
        self.name_edit.setToolTip("The name whose attention to show (a sample double-clicked elsewhere lands here)")
        self.name_edit.setClearButtonEnabled(True)
        self.layer_combo = QComboBox(objectName="attentionLayerCombo")
        self.layer_combo.setToolTip("Which layer's attention to show")
        self.head_combo = QComboBox(objectName="attentionHeadCombo")
        self.head_combo.setToolTip("Which attention head of the layer to show")
        self.plot = plot_widget("attentionView", "Row: the position reading; column: the position it "
                                "attends to. Each row sums to 1; later positions are not visible (blank).")
        item = self.plot.getPlotItem()
        item.setMenuEnabled(False)
        item.setMouseEnabled(x=False, y=False)
        item.hideButtons()
        item.setLabel("bottom", "attends to (key)")
        item.setLabel("left", "position (query)")
        for side in ("bottom", "left"):
            item.getAxis(side).enableAutoSIPrefix(False)  # the ticks are characters, never "(x0.001)"
        item.getViewBox().invertY(True)  # first position at the top, as a matrix is read
        item.getViewBox().setAspectLocked(True)
        self.image = pg.ImageItem(axisOrder="row-major")
        item.addItem(self.image)
        colormap = pg.colormap.get("viridis")
        self.color_bar = pg.ColorBarItem(values=(0, 1), colorMap=colormap, interactive=False, width=14,
                                         label="probability")
        self.color_bar.setImageItem(self.image, insert_in=item)
        self.readout = QLabel(" ", objectName="attentionReadout")
        self.info = QLabel(" ", objectName="attentionInfo", wordWrap=True)
        self._empty_axes()

        top = QHBoxLayout()
        top.addWidget(buddy("Na&me", self.name_edit))
        top.addWidget(self.name_edit, 2)
        top.addWidget(buddy("&Layer", self.layer_combo))
        top.addWidget(self.layer_combo)
        top.addWidget(buddy("H&ead", self.head_combo))
        top.addWidget(self.head_combo)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.readout)
        layout.addWidget(self.info)
        QWidget.setTabOrder(self.name_edit, self.layer_combo)
        QWidget.setTabOrder(self.layer_combo, self.head_combo)

        self.name_edit.textChanged.connect(self.request)
        self.layer_combo.currentIndexChanged.connect(self._draw)
        self.head_combo.currentIndexChanged.connect(self._draw)
        self.plot.scene().sigMouseMoved.connect(self._on_mouse_moved)
        hub.register(self)

    @property
    def text(self) -> str:
        return self.name_edit.text()

    def set_text(self, name: str) -> None:
        """Show this name's attention (e.g. a sample clicked in another list)."""
        self.name_edit.setText(name)

    def select(self, layer: int, head: int) -> None:
        """Show layer `layer`, head `head` (both counted from 0)."""
        self.layer_combo.setCurrentIndex(layer)
        self.head_combo.setCurrentIndex(head)

    @property
    def layer(self) -> int:
        return max(self.layer_combo.currentIndex(), 0)

    @property
    def head(self) -> int:
        return max(self.head_combo.currentIndex(), 0)

    def request(self, *_, refresh: bool = False) -> None:
        if not self.isVisible() and refresh:
            self._stale = True
            return
        self._stale = False
        if not self.text:
            self.hub.cancel(ATTENTION_KEY)
            self.clear()
            self.info.setText("Type a name, or double-click a sample, to see how its positions attend.")
            return
        self.hub.request(ATTENTION_KEY, ins.attention, self.text, refresh=refresh)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._stale:
            self.request(refresh=True)

    def _on_snapshot(self, snapshot) -> None:
        if snapshot is None:
            self.clear()
            self.info.setText("Train a model or load a checkpoint to see its attention.")
            return
        self._fill_selectors(snapshot.model.n_layer, snapshot.model.n_head)
        self.request(refresh=True)

    def _fill_selectors(self, n_layer: int, n_head: int) -> None:
        for combo, count, word in ((self.layer_combo, n_layer, "layer"), (self.head_combo, n_head, "head")):
            if combo.count() == count:
                continue
            current = combo.currentIndex()
            combo.blockSignals(True)
            combo.clear()
            combo.addItems([f"{word} {i + 1}" for i in range(count)])
            combo.setCurrentIndex(min(max(current, 0), count - 1))
            combo.blockSignals(False)

    def _on_result(self, key: str, result) -> None:
        if key != ATTENTION_KEY:
            return
        self.attention = result
        n_layer, n_head = result.maps.shape[:2]
        self._fill_selectors(n_layer, n_head)
        cut = " (cut to the model's context)" if result.truncated else ""
        self.info.setText(f"'{result.text}'{cut}: each row is one position's attention over itself and "
                          f"the positions before it; parameters after step {result.step:,}")
        self._draw()
        self.mapsShown.emit(result)

    def _on_failed(self, key: str, message: str) -> None:
        if key == ATTENTION_KEY:
            self.info.setText(f"<span style='color:#b00020'>{message}</span>")

    def shown_matrix(self) -> np.ndarray | None:
        """The matrix drawn: the chosen layer and head, NaN above the diagonal."""
        if self.attention is None:
            return None
        matrix = self.attention.maps[self.layer, self.head].copy()
        matrix[np.triu_indices_from(matrix, 1)] = np.nan  # not visible to the query: drawn blank
        return matrix

    def _draw(self, *_) -> None:
        matrix = self.shown_matrix()
        if matrix is None:
            return
        t = len(matrix)
        self.image.setImage(matrix, levels=(0, 1), autoLevels=False)
        self.image.setRect(0, 0, t, t)
        ticks = [[(i + 0.5, label) for i, label in enumerate(self.attention.labels)]]
        item = self.plot.getPlotItem()
        item.getAxis("bottom").setTicks(ticks)
        item.getAxis("left").setTicks(ticks)
        item.getViewBox().setRange(xRange=(0, t), yRange=(0, t), padding=0.02)

    def clear(self) -> None:
        self.attention = None
        self.image.clear()
        self._empty_axes()
        self.readout.setText(" ")

    def _empty_axes(self) -> None:
        """No name shown: no tick labels (not the last name's), on a unit square
        (an empty aspect-locked view would span -600 to 600 by itself)."""
        item = self.plot.getPlotItem()
        for side in ("bottom", "left"):
            item.getAxis(side).setTicks([[]])
        item.getViewBox().setRange(xRange=(0, 1), yRange=(0, 1), padding=0)

    def _on_mouse_moved(self, pos) -> None:
        a, view = self.attention, self.plot.getPlotItem().vb
        if a is None or not view.sceneBoundingRect().contains(pos):
            return
        point = view.mapSceneToView(pos)
        row, col = int(np.floor(point.y())), int(np.floor(point.x()))
        t = len(a.labels)
        if not (0 <= row < t and 0 <= col < t):
            self.readout.setText(" ")
        elif col > row:
            self.readout.setText(f"'{a.labels[row]}' (position {row}) cannot see '{a.labels[col]}' "
                                 f"(position {col}): it comes later")
        else:
            value = a.maps[self.layer, self.head, row, col]
            self.readout.setText(f"layer {self.layer + 1}, head {self.head + 1}: '{a.labels[row]}' (position {row}) "
                                 f"attends to '{a.labels[col]}' (position {col}) with {value:.3f}")
