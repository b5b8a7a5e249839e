"""Small pieces the panels share: a label that gives a control its keyboard
mnemonic, a named plot widget, and the seed box's step after a sample."""
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
    plot.setToolTip(tooltip)
    return plot


def take_seed(spin: QSpinBox) -> int:
    """The seed box's value, which then moves on by one (wrapping to 0 at its
    maximum), so the next sample draws other names."""
    seed = spin.value()
    spin.setValue(seed + 1 if seed < spin.maximum() else 0)
    return seed
