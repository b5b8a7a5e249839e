"""The Sweep tab's trials, live (gui.sweep_panel fills them from the runner's
events): a table of every trial (settings, status, best and final held-out
loss, steps, names/s; sortable) with Stop trial and Load trial under it, a
plot of every trial's curve coloured by its status, and a scatter of one
setting against the best held-out loss. What it shows is an
engine.sweep.events.SweepTable's; it only draws it.
"""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QHBoxLayout, QHeaderView, QPushButton, QSplitter,
                               QTableWidget, QTableWidgetItem, QWidget)

from engine.config import get_preset
from engine.sweep.events import SweepTable, TrialRecord, TrialStatus
from engine.sweep.spec import SweepSpec

from .controls import buddy, column, plot_widget
from .loss_series import ema

STATUS_COLORS = {  # Okabe-Ito: distinct for the common colour-vision deficiencies
    TrialStatus.RUNNING: (0, 114, 178), TrialStatus.DONE: (0, 158, 115),
    TrialStatus.STOPPED_EARLY: (230, 159, 0), TrialStatus.STOPPED: (120, 120, 120),
    TrialStatus.DIVERGED: (213, 94, 0), TrialStatus.FAILED: (204, 121, 167),
}
FIXED_COLUMNS = ["Trial", "Status", "Best held-out", "Final held-out", "Steps", "names/s"]
REDRAW_MS = 250   # curves of trials with new results are redrawn at most this often
TRAINING, HELDOUT = "training", "heldout"
SMOOTHING = 0.9   # the EMA weight over a trial's reported loss points (block means of its steps)


class SortKeyItem(QTableWidgetItem):
    """A cell that sorts by a number (its UserRole) rather than by its text."""

    def __lt__(self, other):
        mine, theirs = self.data(Qt.UserRole), other.data(Qt.UserRole)
        if isinstance(mine, (int, float)) and isinstance(theirs, (int, float)):
            return (math.isnan(mine), mine) < (math.isnan(theirs), theirs)  # no value ("-") last
        return self.text() < other.text()  # (QTableWidgetItem's own would call this one again)


class SweepTrialsView(QWidget):
    """The trials' table, Stop trial and Load trial (the Sweep tab acts on their clicks), and plots."""

    def __init__(self, parent=None):
        super().__init__(parent, objectName="sweepTrials")
        self.table = SweepTable()              # the trials shown (reset() gives the sweep's)
        self.spec: SweepSpec | None = None     # the sweep they are of
        self._curves: dict[str, tuple] = {}    # trial -> (loss curve, held-out markers)
        self._dirty: set[str] = set()

        self.trial_table = QTableWidget(0, len(FIXED_COLUMNS), objectName="sweepTable")
        self.trial_table.setHorizontalHeaderLabels(FIXED_COLUMNS)
        self.trial_table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.trial_table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.trial_table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.trial_table.verticalHeader().setVisible(False)
        self.trial_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.trial_table.setSortingEnabled(True)
        self.stop_trial_button = QPushButton("Stop tria&l", objectName="sweepStopTrialButton")
        self.load_button = QPushButton("Load trial", objectName="sweepLoadButton")
        self.load_button.setToolTip("Load the selected trial's newest checkpoint into the window "
                                    "(sample it, train it on); double-click a row does the same")
        self.y_combo = QComboBox(objectName="sweepYCombo")
        self.y_combo.addItem("training loss (smoothed)", TRAINING)
        self.y_combo.addItem("held-out loss", HELDOUT)
        self.y_combo.currentIndexChanged.connect(lambda *_: self.redraw_all())
        self.curve_plot = plot_widget("sweepCurves", "Every trial's loss against names seen, coloured by status")
        self.curve_plot.getPlotItem().setLabel("bottom", "names seen")
        self.curve_plot.getPlotItem().setLabel("left", "loss")
        legend = self.curve_plot.getPlotItem().addLegend(offset=(-10, 10))
        for status, color in STATUS_COLORS.items():  # the legend says what the colours mean
            legend.addItem(pg.PlotDataItem(pen=pg.mkPen(color, width=2)), status.value)
        self.x_combo = QComboBox(objectName="sweepScatterCombo")
        self.x_combo.setToolTip("The setting the scatter plots the best held-out loss against")
        self.x_combo.currentIndexChanged.connect(lambda *_: self.draw_scatter())
        self.scatter_plot = plot_widget("sweepScatter", "Each trial's best held-out loss against a setting")
        self.scatter_plot.getPlotItem().setLabel("left", "best held-out loss")
        self.scatter = pg.ScatterPlotItem(size=9)
        self.scatter_plot.addItem(self.scatter)

        trial_buttons = QHBoxLayout()
        trial_buttons.addWidget(self.stop_trial_button)
        trial_buttons.addWidget(self.load_button)
        trial_buttons.addStretch(1)
        trial_buttons.addWidget(buddy("Plot", self.y_combo))
        trial_buttons.addWidget(self.y_combo)
        scatter_controls = QHBoxLayout()
        scatter_controls.addWidget(buddy("Best held-out against", self.x_combo))
        scatter_controls.addWidget(self.x_combo)
        scatter_controls.addStretch(1)
        plots = QSplitter(Qt.Horizontal)
        plots.addWidget(self.curve_plot)
        plots.addWidget(column(scatter_controls, (self.scatter_plot, 1)))
        column((self.trial_table, 2), trial_buttons, (plots, 3), box=self)

        self._redraw_timer = QTimer(self, singleShot=True, interval=REDRAW_MS)
        self._redraw_timer.timeout.connect(self._redraw_dirty)

    def reset(self, table: SweepTable, spec: SweepSpec) -> None:
        """A new sweep: its table of trials (filled as its events come), a column per setting."""
        self.table, self.spec, self._dirty = table, spec, set()
        for curve, markers in self._curves.values():
            self.curve_plot.removeItem(curve)
            self.curve_plot.removeItem(markers)
        self._curves = {}
        keys = list(spec.space)
        self.trial_table.setSortingEnabled(False)
        self.trial_table.setRowCount(0)
        self.trial_table.setColumnCount(len(FIXED_COLUMNS) + len(keys))
        self.trial_table.setHorizontalHeaderLabels(FIXED_COLUMNS + keys)
        self.trial_table.setSortingEnabled(True)
        self.x_combo.blockSignals(True)
        self.x_combo.clear()
        self.x_combo.addItems(keys)
        self.x_combo.blockSignals(False)
        self.scatter.clear()

    # the table -----------------------------------------------------------------------------
    def show_trial(self, record: TrialRecord) -> None:
        """The trial's row, new or updated; its curve redrawn soon."""
        table = self.trial_table
        table.setSortingEnabled(False)  # rows stay put while their cells change
        row = self.row_of(record.trial)
        if row is None:
            row = table.rowCount()
            table.insertRow(row)
            for col in range(table.columnCount()):
                table.setItem(row, col, SortKeyItem())
            table.item(row, 0).setData(Qt.UserRole + 1, record.trial)
        keys = list(self.spec.space) if self.spec else []
        values = [(record.trial, record.trial), (record.status.value, record.status.value),
                  loss_cell(record.best_heldout), loss_cell(record.final_heldout),
                  (f"{record.step:,}", record.step),
                  (f"{record.names_per_second:,.0f}", record.names_per_second)
                  if math.isfinite(record.names_per_second) else ("-", math.nan)]
        values += [(setting_text(record.settings.get(k)), record.settings.get(k)) for k in keys]
        for col, (text, key) in enumerate(values):
            item = table.item(row, col)
            item.setText(text)
            item.setData(Qt.UserRole, key)
        table.item(row, 1).setForeground(QColor(*STATUS_COLORS[record.status]))
        tip = record.message or (f"checkpoint: {record.checkpoint}" if record.checkpoint else "no checkpoint yet")
        for col in range(table.columnCount()):
            table.item(row, col).setToolTip(tip)
        table.setSortingEnabled(True)
        self._dirty.add(record.trial)
        if not self._redraw_timer.isActive():
            self._redraw_timer.start()

    def row_of(self, trial: str) -> int | None:
        for row in range(self.trial_table.rowCount()):
            item = self.trial_table.item(row, 0)
            if item is not None and item.data(Qt.UserRole + 1) == trial:
                return row
        return None

    def selected_trial(self) -> TrialRecord | None:
        rows = self.trial_table.selectionModel().selectedRows()
        if not rows:
            return None
        trial = self.trial_table.item(rows[0].row(), 0).data(Qt.UserRole + 1)
        return self.table.trials.get(trial)

    def select_trial(self, trial: str) -> None:
        row = self.row_of(trial)
        if row is not None:
            self.trial_table.selectRow(row)

    # plots ---------------------------------------------------------------------------------
    def _redraw_dirty(self) -> None:
        dirty, self._dirty = self._dirty, set()
        for trial in dirty:
            record = self.table.trials.get(trial)
            if record is not None:
                self._draw(record)

    def redraw_all(self) -> None:
        self._dirty = set(self.table.trials)
        self._redraw_dirty()

    def _draw(self, record: TrialRecord) -> None:
        batch = batch_of(record.settings)
        if record.trial not in self._curves:
            curve, markers = pg.PlotDataItem(), pg.ScatterPlotItem(size=6)
            self.curve_plot.addItem(curve)
            self.curve_plot.addItem(markers)
            self._curves[record.trial] = (curve, markers)
        curve, markers = self._curves[record.trial]
        color = STATUS_COLORS[record.status]
        if self.y_combo.currentData() == HELDOUT:
            points = [(s, x) for s, x in record.heldout if x is not None]
            xs = np.array([s * batch for s, _ in points], dtype=float)
            ys = np.array([x for _, x in points], dtype=float)
            curve.setData(xs, ys, pen=pg.mkPen(color, width=1.5))
            markers.setData(xs, ys, brush=pg.mkBrush(*color), pen=None)
        else:
            xs = np.array([s * batch for s, _ in record.losses], dtype=float)
            ys = ema(np.array([x for _, x in record.losses], dtype=float), SMOOTHING)[0]
            curve.setData(xs, ys, pen=pg.mkPen(color, width=1.5), connect="finite")
            markers.setData([], [])
        curve.setToolTip(f"trial {record.trial}: {record.status.value}")

    def curve_colors(self) -> dict[str, tuple]:
        """Each drawn trial's curve colour (RGB), by trial."""
        return {trial: curve.opts["pen"].color().getRgb()[:3] for trial, (curve, _) in self._curves.items()}

    def draw_scatter(self) -> None:
        key = self.x_combo.currentText()
        trials = [t for t in self.table.trials.values() if math.isfinite(t.best_heldout) and key in t.settings]
        values = [t.settings[key] for t in trials]
        categories = sorted({v for v in values if isinstance(v, str)})
        xs = [categories.index(v) if isinstance(v, str) else float(v) for v in values]
        log_x = bool(self.spec and key in self.spec.space
                     and self.spec.space[key].kind.startswith("log") and all(x > 0 for x in xs))
        self.scatter_plot.getPlotItem().setLogMode(x=log_x, y=False)
        self.scatter_plot.getPlotItem().setLabel("bottom", key + (" (" + ", ".join(categories) + ")" if categories else ""))
        spots = [{"pos": (math.log10(x) if log_x else x, t.best_heldout), "brush": pg.mkBrush(*STATUS_COLORS[t.status]),
                  "pen": None, "data": t.trial} for x, t in zip(xs, trials)]
        self.scatter.setData(spots)

    def scatter_points(self) -> list[tuple[float, float]]:
        """The scatter's points (x as plotted, best held-out loss)."""
        return [tuple(p.pos()) for p in self.scatter.points()]



def loss_cell(value: float) -> tuple[str, float]:
    return (f"{value:.4f}", value) if math.isfinite(value) else ("-", math.nan)


def setting_text(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def batch_of(settings: dict) -> int:
    if "batch_size" in settings:
        return int(settings["batch_size"])
    try:
        return get_preset(settings.get("preset", "tiny")).train.batch_size
    except ValueError:
        return 1
