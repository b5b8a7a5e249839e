"""Small pieces the panels share: a label that gives a control its keyboard
mnemonic, a named plot widget with room for its edge tick labels, and the seed box's step after a sample."""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtWidgets import QLabel, QSpinBox, QWidget


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
