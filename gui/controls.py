"""Small pieces the panels share: a label that gives a control its keyboard
mnemonic, a named plot widget with room for its edge tick labels, the seed
box's step after a sample, and a status bar whose messages stop short of
its permanent fields."""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QSpinBox, QStatusBar, QWidget

STATUS_GAP_PX = 16  # between a message's end and the first permanent field


def buddy(text: str, widget: QWidget) -> QLabel:
    """QLabel(text) whose &-mnemonic (Alt+letter) moves the focus to widget."""
    label = QLabel(text)
    label.setBuddy(widget)
    return label


def plot_widget(name: str, tooltip: str) -> pg.PlotWidget:
    """A white pyqtgraph PlotWidget with an objectName. (PlotWidget passes its
    keyword arguments to its PlotItem, so objectName= would not name the widget.)"""
    plot = pg.PlotWidget(background="w")
    plot.setObjectName(name)
    # room above and right of the axes: tick labels are centred on their tick, so the
    # top y label and the last x label would otherwise be cut in half by the widget's edge
    plot.getPlotItem().layout.setContentsMargins(2, 10, 14, 2)
    plot.setToolTip(tooltip)
    return plot


def take_seed(spin: QSpinBox) -> int:
    """The seed box's value, which then moves on by one (wrapping to 0 at its
    maximum), so the next sample draws other names."""
    seed = spin.value()
    spin.setValue(seed + 1 if seed < spin.maximum() else 0)
    return seed


class ElidingStatusBar(QStatusBar):
    """A status bar whose messages end in "..." where they would reach the permanent
    fields on the right (QStatusBar cuts them mid-letter against the first field);
    the whole message is its tooltip."""

    def showMessage(self, text: str, timeout: int = 0) -> None:
        shown = self._elided(text)
        self.setToolTip(text if shown != text else "")
        super().showMessage(shown, timeout)

    def message_room(self) -> int:
        """Pixels from the bar's left edge to the gap before the first permanent field."""
        fields = [w for w in self.findChildren(QWidget, options=Qt.FindDirectChildrenOnly)
                  if w.isVisible() and w.x() > 0]
        right = min((w.x() for w in fields), default=self.width())
        return max(0, right - STATUS_GAP_PX - 6)  # QStatusBar starts its message 6 px in

    def _elided(self, text: str) -> str:
        if not self.isVisible():  # not laid out yet: the fields' places are unknown
            return text
        return self.fontMetrics().elidedText(text, Qt.ElideRight, self.message_room())
