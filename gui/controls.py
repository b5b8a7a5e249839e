"""Small pieces the panels share: a label that gives a control its keyboard
mnemonic, a named plot widget with room for its edge tick labels, a pane of
widgets stacked without margins, the seed box's step after a sample, and a status bar whose messages stop short of
its permanent fields."""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, QTimer
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QLabel, QLayout, QSpinBox, QStatusBar, QVBoxLayout, QWidget

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


def column(*items, box: QWidget | None = None) -> QWidget:
    """A widget (box, or a new one) of items stacked top to bottom, without margins of its
    own (a pane of a splitter): each item a widget, a layout, or (widget or layout, stretch)."""
    box = QWidget() if box is None else box
    layout = QVBoxLayout(box)
    layout.setContentsMargins(0, 0, 0, 0)
    for item in items:
        part, stretch = item if isinstance(item, tuple) else (item, 0)
        if isinstance(part, QLayout):
            layout.addLayout(part, stretch)
        else:
            layout.addWidget(part, stretch)
    return box


def take_seed(spin: QSpinBox) -> int:
    """The seed box's value, which then moves on by one (wrapping to 0 at its
    maximum), so the next sample draws other names."""
    seed = spin.value()
    spin.setValue(seed + 1 if seed < spin.maximum() else 0)
    return seed


class ElidingStatusBar(QStatusBar):
    """A status bar whose messages end in "…" after the last whole word that fits
    before the permanent fields on the right (QStatusBar cuts them mid-letter
    against the first field); the whole message is its tooltip and `message()`.
    A message is elided again whenever the room changes (the window resized, a
    field grown), so it never runs under a field; its timeout is kept here, so
    eliding again does not restart it."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._text = ""
        self._expiry = QTimer(self, singleShot=True)
        self._expiry.timeout.connect(self.clearMessage)

    def showMessage(self, text: str, timeout: int = 0) -> None:
        self._text = text
        self._expiry.stop()
        if text and timeout > 0:
            self._expiry.start(timeout)
        self._show()

    def clearMessage(self) -> None:
        self._text = ""
        self._expiry.stop()
        self.setToolTip("")
        super().clearMessage()

    def message(self) -> str:
        """The whole message shown (elided or not); "" when none."""
        return self._text if self.currentMessage() else ""

    def addPermanentWidget(self, widget: QWidget, stretch: int = 0) -> None:
        super().addPermanentWidget(widget, stretch)
        widget.installEventFilter(self)  # its size and place are the message's room

    def eventFilter(self, watched, event) -> bool:
        if event.type() in (QEvent.Resize, QEvent.Move, QEvent.Show, QEvent.Hide):
            self._show()
        return False

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._show()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self._show()

    def message_room(self) -> int:
        """Pixels from the bar's left edge to the gap before the first permanent field."""
        fields = [w for w in self.findChildren(QWidget, options=Qt.FindDirectChildrenOnly)
                  if w.isVisible() and w.x() > 0]
        right = min((w.x() for w in fields), default=self.width())
        return max(0, right - STATUS_GAP_PX - 6)  # QStatusBar starts its message 6 px in

    def _show(self) -> None:
        if not self._text:
            return
        shown = self._elided(self._text)
        self.setToolTip(self._text if shown != self._text else "")
        if shown != self.currentMessage():
            super().showMessage(shown, 0)

    def _elided(self, text: str) -> str:
        if not self.isVisible():  # not laid out yet: the fields' places are unknown
            return text
        return elide_words(text, self.fontMetrics(), self.message_room())


def elide_words(text: str, metrics: QFontMetrics, width: int) -> str:
    """text, or its longest start that ends a word and fits `width` with "…" after
    it (Qt's letter-wise eliding when not even the first word fits)."""
    if metrics.horizontalAdvance(text) <= width:
        return text
    words = text.split(" ")
    for n in range(len(words) - 1, 0, -1):
        start = " ".join(words[:n]).rstrip(" ,.:;(-")
        if start and metrics.horizontalAdvance(start + "…") <= width:
            return start + "…"
    return metrics.elidedText(text, Qt.ElideRight, width)
