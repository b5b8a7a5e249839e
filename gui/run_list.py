"""The run list and overlay: every run of the session in a table (preset,
backend, learning rate, steps, final smoothed loss, ms/step); ticking runs
overlays their smoothed loss curves in distinct colours with a legend, as
TensorBoard's run selector does. The x axis is the step or the wall-clock
training time, so backends can be compared by time.

Runs are engine.runs.RunRecord objects that the window fills as losses come
in; smoothing is the loss plot's, kept incrementally in a GrowingSeries per
run.
"""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QColor, QIcon, QPixmap
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QHBoxLayout, QHeaderView, QLabel, QSplitter,
                               QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from engine.runs import RunRecord

from .controls import buddy, plot_widget
from .loss_series import GrowingSeries, Resmoother

# distinct on white and for the common colour-vision deficiencies (Okabe-Ito, then tab10)
PALETTE = [(0, 114, 178), (230, 159, 0), (0, 158, 115), (213, 94, 0), (204, 121, 167), (86, 180, 233),
           (120, 120, 120), (148, 103, 189), (140, 86, 75), (188, 189, 34)]
COLUMNS = ["Run", "Preset", "Backend", "LR", "Steps", "Smoothed loss", "ms/step", "Status"]
STEP, SECONDS = "step", "seconds"
UPDATE_MS = 250  # a live run's row and curve are redrawn at most this often
TABLE_ROWS = 6  # runs in view before the table scrolls
TIME_AXIS = "training time"


def table_height(table: QTableWidget, rows: int) -> int:
    """The height that shows the header and `rows` rows."""
    return (table.horizontalHeader().sizeHint().height() + rows * table.verticalHeader().defaultSectionSize()
            + 2 * table.frameWidth())


class RunListPanel(QWidget):
    checkedChanged = Signal()

    def __init__(self, parent=None, smoothing: float = 0.95):
        super().__init__(parent, objectName="runListPanel")
        self.runs: list[RunRecord] = []
        self.smoothing = smoothing
        self._colors: dict[int, tuple[int, int, int]] = {}
        self._series: dict[int, GrowingSeries] = {}  # each record's steps and EMA so far
        self._resmoother = Resmoother(self)  # a new weight, off the GUI thread for long runs
        self._resmoother.done.connect(self._redraw_all)
        self._dirty: set[int] = set()
        self._next_color = 0

        self.table = QTableWidget(0, len(COLUMNS), objectName="runList")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setToolTip("Every run of this session; tick runs to overlay their smoothed loss curves")
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeToContents)
        header.setStretchLastSection(True)
        self.table.setMinimumHeight(table_height(self.table, TABLE_ROWS))
        self.x_axis_combo = QComboBox(objectName="runXAxisCombo")
        self.x_axis_combo.addItem("step", STEP)
        self.x_axis_combo.addItem(TIME_AXIS, SECONDS)  # the axis's own words (it adds the unit)
        self.x_axis_combo.setToolTip("Compare runs by step, or by training time (pauses left out)")
        self.plot = plot_widget("runOverlayPlot", "Smoothed loss of each ticked run")
        item = self.plot.getPlotItem()
        item.setLabel("left", "smoothed loss")
        self.legend = item.addLegend(offset=(-10, 10))
        self.curves: dict[int, pg.PlotDataItem] = {}  # id(record) -> its curve while ticked
        self.info = QLabel(" ", objectName="runListInfo", wordWrap=True)

        controls = QHBoxLayout()
        controls.addWidget(buddy("&X axis", self.x_axis_combo))
        controls.addWidget(self.x_axis_combo)
        controls.addStretch(1)
        bottom = QWidget()
        bottom_layout = QVBoxLayout(bottom)
        bottom_layout.setContentsMargins(0, 0, 0, 0)
        bottom_layout.addLayout(controls)
        bottom_layout.addWidget(self.plot, 1)
        bottom_layout.addWidget(self.info)
        splitter = QSplitter(Qt.Vertical)
        splitter.addWidget(self.table)
        splitter.addWidget(bottom)
        splitter.setStretchFactor(0, 1)
        splitter.setStretchFactor(1, 3)
        layout = QVBoxLayout(self)
        layout.addWidget(splitter)
        QWidget.setTabOrder(self.table, self.x_axis_combo)

        self._timer = QTimer(self, singleShot=True, interval=UPDATE_MS)
        self._timer.timeout.connect(self._flush)
        self.table.itemChanged.connect(self._on_item_changed)
        self.x_axis_combo.currentIndexChanged.connect(self._on_x_axis)
        self._set_axis_label()

    # runs -------------------------------------------------------------------
    def add_run(self, record: RunRecord, checked: bool = True) -> None:
        self.runs.append(record)
        self._colors[id(record)] = PALETTE[self._next_color % len(PALETTE)]
        self._next_color += 1
        row = self.table.rowCount()
        self.table.blockSignals(True)
        self.table.insertRow(row)
        for col in range(len(COLUMNS)):
            cell = QTableWidgetItem()
            flags = Qt.ItemIsEnabled | Qt.ItemIsSelectable
            cell.setFlags(flags | Qt.ItemIsUserCheckable if col == 0 else flags)
            self.table.setItem(row, col, cell)
        self.table.item(row, 0).setCheckState(Qt.Checked if checked else Qt.Unchecked)
        self.table.item(row, 0).setIcon(_swatch(self._colors[id(record)]))
        self.table.blockSignals(False)
        self._fill_row(row)
        self._draw(record)
        self.checkedChanged.emit()

    def update_run(self, record: RunRecord) -> None:
        """The record has new steps or a new status: redraw it soon (coalesced)."""
        self._dirty.add(id(record))
        if not self._timer.isActive():
            self._timer.start()

    def is_checked(self, record: RunRecord) -> bool:
        return self.table.item(self._row(record), 0).checkState() == Qt.Checked

    def set_checked(self, record: RunRecord, checked: bool) -> None:
        self.table.item(self._row(record), 0).setCheckState(Qt.Checked if checked else Qt.Unchecked)

    def checked_runs(self) -> list[RunRecord]:
        return [r for r in self.runs if self.is_checked(r)]

    def set_smoothing(self, weight: float) -> None:
        """The loss plot's smoothing weight (0 to 0.999)."""
        self.smoothing = float(weight)
        self._resmoother.resmooth(list(self._series.values()), self.smoothing)  # then _redraw_all

    @property
    def x_axis(self) -> str:
        return self.x_axis_combo.currentData()

    def set_x_axis(self, axis: str) -> None:
        self.x_axis_combo.setCurrentIndex(self.x_axis_combo.findData(axis))

    def _series_of(self, record: RunRecord) -> GrowingSeries:
        """The record's steps and smoothed losses (the EMA of the loss plot), extended
        by the steps it gained since the last call (rebuilt if it was rewound)."""
        series = self._series.get(id(record))
        if series is None:
            series = self._series[id(record)] = GrowingSeries(self.smoothing)
        n = record.steps
        if series.n > n:
            series.truncate(n)
        if series.n < n:
            series.extend(record.losses[series.n:n], series.n)
        return series

    def smoothed(self, record: RunRecord) -> np.ndarray:
        series = self._series_of(record)
        return series.smooth[: series.n]

    # drawing ------------------------------------------------------------------
    def _row(self, record: RunRecord) -> int:
        return next(i for i, r in enumerate(self.runs) if r is record)

    def _fill_row(self, row: int) -> None:
        r = self.runs[row]
        smoothed = self.smoothed(r)
        ms = r.ms_per_step
        values = [r.name, r.preset, r.backend, f"{r.train.learning_rate:g}", f"{r.steps:,}",
                  f"{smoothed[-1]:.4f}" if len(smoothed) else "-", "-" if math.isnan(ms) else f"{ms:.3g}", r.status]
        self.table.blockSignals(True)
        for col, text in enumerate(values):
            self.table.item(row, col).setText(text)
        self.table.item(row, 0).setToolTip(f"{r.model}, {r.train}")
        self.table.blockSignals(False)

    def _xy(self, record: RunRecord) -> tuple[np.ndarray, np.ndarray]:
        series = self._series_of(record)
        y = series.smooth[: series.n]
        if self.x_axis == STEP:
            return series.steps, y
        x = record.wall_seconds()
        timed = ~np.isnan(x)
        return x[timed], y[timed]

    def _draw(self, record: RunRecord) -> None:
        if not self.is_checked(record):
            self._undraw(record)
            return
        x, y = self._xy(record)
        curve = self.curves.get(id(record))
        if curve is not None:  # a live run's flush: new data, same curve and legend entry
            curve.setData(x, y)
            return
        pen = pg.mkPen(*self._colors[id(record)], width=2)
        label = f"{record.name}: {record.preset}, {record.backend}, lr {record.train.learning_rate:g}"
        curve = self.plot.getPlotItem().plot(x, y, pen=pen, name=label, autoDownsampleFactor=1.0)
        curve.setClipToView(True)
        curve.setDownsampling(auto=True, method="peak")
        self.curves[id(record)] = curve

    def _undraw(self, record: RunRecord) -> None:
        curve = self.curves.pop(id(record), None)
        if curve is not None:
            self.plot.getPlotItem().removeItem(curve)

    def _redraw_all(self, *_) -> None:
        self._set_axis_label()
        for row, record in enumerate(self.runs):
            self._fill_row(row)
            self._draw(record)
        self._show_info()

    def _on_x_axis(self, *_) -> None:
        # the new x values are in other units: range to them first, or clip-to-view
        # would clip them against the old range and draw nothing
        self._redraw_all()
        bounds = [(float(x.min()), float(x.max())) for x, _ in map(self._xy, self.checked_runs()) if len(x)]
        item = self.plot.getPlotItem()
        if bounds:
            item.setXRange(min(b[0] for b in bounds), max(b[1] for b in bounds))
        item.enableAutoRange()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self._flush()

    def _flush(self) -> None:
        if not self.isVisible():  # in a hidden tab: redrawn when shown (a long curve costs)
            return
        for row, record in enumerate(self.runs):
            if id(record) in self._dirty:
                self._fill_row(row)
                self._draw(record)
        self._dirty.clear()
        self._show_info()

    def _on_item_changed(self, item: QTableWidgetItem) -> None:
        if item.column() == 0:
            self._draw(self.runs[item.row()])
            self._show_info()
            self.checkedChanged.emit()

    def _set_axis_label(self) -> None:
        if self.x_axis == STEP:
            self.plot.getPlotItem().setLabel("bottom", "step", units=None)
        else:  # pyqtgraph picks ms, s or ks from the range
            self.plot.getPlotItem().setLabel("bottom", TIME_AXIS, units="s")

    def _show_info(self) -> None:
        untimed = [r.name for r in self.checked_runs() if self.x_axis == SECONDS and np.isnan(r.ms_per_step)]
        self.info.setText(f"No step times for {', '.join(untimed)} (loaded from a checkpoint): "
                          "not on the time axis." if untimed else " ")


def _swatch(color: tuple[int, int, int]) -> QIcon:
    pixmap = QPixmap(12, 12)
    pixmap.fill(QColor(*color))
    return QIcon(pixmap)
