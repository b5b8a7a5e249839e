"""Small constructors the inspect panels share: a label that gives a control
its keyboard mnemonic, and a named plot widget."""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtWidgets import QLabel, QWidget


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
