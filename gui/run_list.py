"""The run list and overlay: every run of the session in a table (preset,
backend, learning rate, batch, steps, final smoothed loss, best and final
held-out loss, ms/step, names/s, dataset); ticking runs overlays their
smoothed training loss curves, or their held-out loss (markers: comparable
across runs, unlike a training curve that follows which names came last),
in distinct colours with a legend, as TensorBoard's run selector does. The x
axis is the step, the names seen (runs of different batch sizes side by
side) or the wall-clock training time, so backends can be compared by time. Runs trained
on another dataset than the reference (the current run's, or the open one)
are marked: their rows greyed, their curves dashed, "other dataset" in the
legend, since their losses are not comparable.

Runs are engine.training.records.RunRecord objects that the window fills as losses come
in; smoothing is the loss plot's, kept incrementally in a GrowingSeries per
ticked run. What a run costs stays bounded: an ended run's record is
compacted (engine.training.records.MAX_POINTS), at most MAX_CHECKED runs are ticked (a
new run unticks the oldest), an unticked run keeps no curve or series, and
runs can be removed (Remove, or the Delete key).
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFont, QFontMetrics, QKeySequence, QShortcut
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QHBoxLayout, QHeaderView, QLabel, QPushButton,
                               QSplitter, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from engine.training.records import RunRecord

from .controls import buddy, column, plot_widget
from .loss_series import GrowingSeries, Resmoother, ema_last
from .plot_axes import AXES, NAMES, SECONDS, STEP, axis_label
from .run_table import COLUMNS, HEADERS, TABLE_ROWS, legend_labels, row_texts, swatch, table_height

# distinct on white and for the common colour-vision deficiencies (Okabe-Ito, then tab10)
PALETTE = [(0, 114, 178), (230, 159, 0), (0, 158, 115), (213, 94, 0), (204, 121, 167), (86, 180, 233),
           (120, 120, 120), (148, 103, 189), (140, 86, 75), (188, 189, 34)]
MAX_CHECKED = 8  # a new run unticks the oldest ticked one past this
OTHER_DATASET = "other dataset"
TRAINING, HELDOUT = "training", "heldout"  # what the overlay plots
UPDATE_MS = 250  # a live run's row and curve are redrawn at most this often
DATASET = COLUMNS.index("Dataset")


class RunListPanel(QWidget):
    checkedChanged = Signal()
    runsRemoved = Signal(list)  # records taken off the list (Remove, Delete, or the model's own removal)

    def __init__(self, parent=None, smoothing: float = 0.95):
        super().__init__(parent, objectName="runListPanel")
        self.runs: list[RunRecord] = []
        self._rows: dict[int, int] = {}  # id(record) -> its row (a long session lists hundreds of runs)
        self._italic: dict[int, bool] = {}  # id(record) -> its row is drawn as not comparable
        self.smoothing = smoothing
        self._colors: dict[int, tuple[int, int, int]] = {}
        self._series: dict[int, GrowingSeries] = {}  # each record's steps and EMA so far
        self._resmoother = Resmoother(self)  # a new weight, off the GUI thread for long runs
        self._resmoother.done.connect(self._redraw_all)
        self._dirty: set[int] = set()
        self._next_color = 0
        self.count = 0  # runs ever added (names stay unique when runs are removed)
        self.reference_hash = ""  # the dataset runs are compared on ("" : none yet)

        self.table = QTableWidget(0, len(COLUMNS), objectName="runList")
        self.table.setHorizontalHeaderLabels([HEADERS.get(c, c) for c in COLUMNS])
        self.table.setToolTip("Every run of this session; tick runs to overlay their smoothed loss curves")
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        header = self.table.horizontalHeader()
        # columns widened here as their texts grow (_widen): Qt's ResizeToContents measures every
        # row at each cell's change, seconds a redraw with hundreds of runs listed
        header.setSectionResizeMode(QHeaderView.Interactive)
        # the dataset, last, takes the room the others leave: the table fits its pane
        header.setSectionResizeMode(DATASET, QHeaderView.Stretch)
        for col in range(len(COLUMNS)):
            header.resizeSection(col, header.sectionSizeFromContents(col).width())
        self._padding: dict[int, int] = {}  # a column's room around its text (the first row's measure)
        self.table.setTextElideMode(Qt.ElideMiddle)  # a long file name keeps its end
        self.table.setMinimumHeight(table_height(self.table, TABLE_ROWS))
        self.x_axis_combo = QComboBox(objectName="runXAxisCombo")
        for key, text in AXES:  # the loss plot's axes, in its words
            self.x_axis_combo.addItem(text, key)
        self.x_axis_combo.setToolTip("Compare runs by step, by names seen (step x batch) or by training time "
                                     "(pauses left out)")
        self.y_combo = QComboBox(objectName="runYCombo")
        self.y_combo.addItem("smoothed training loss", TRAINING)
        self.y_combo.addItem("held-out loss", HELDOUT)
        self.y_combo.setToolTip("The held-out loss is measured on the same held-out names throughout a run: "
                                "comparable across runs (of one dataset and held-out count)")
        self.plot = plot_widget("runOverlayPlot", "Smoothed loss of each ticked run")
        item = self.plot.getPlotItem()
        item.setLabel("left", "smoothed loss")
        self.legend = item.addLegend(offset=(-10, 10))
        self.curves: dict[int, pg.PlotDataItem] = {}  # id(record) -> its curve while ticked
        self.info = QLabel(" ", objectName="runListInfo", wordWrap=True)
        self.remove_button = QPushButton("&Remove", objectName="removeRunsButton")
        self.remove_button.setToolTip("Remove the selected runs from the list and the overlay (Delete)")
        self.remove_button.clicked.connect(self.remove_selected)
        delete = QShortcut(QKeySequence.Delete, self.table, context=Qt.WidgetShortcut)
        delete.activated.connect(self.remove_selected)

        controls = QHBoxLayout()
        controls.addWidget(buddy("&Plot", self.y_combo))
        controls.addWidget(self.y_combo)
        controls.addWidget(buddy("&X axis", self.x_axis_combo))
        controls.addWidget(self.x_axis_combo)
        controls.addStretch(1)
        controls.addWidget(self.remove_button)
        splitter = QSplitter(Qt.Vertical)
        splitter.addWidget(self.table)
        splitter.addWidget(column(controls, (self.plot, 1), self.info))
        splitter.setStretchFactor(0, 1)
        splitter.setStretchFactor(1, 3)
        layout = QVBoxLayout(self)
        layout.addWidget(splitter)
        QWidget.setTabOrder(self.table, self.y_combo)
        QWidget.setTabOrder(self.y_combo, self.x_axis_combo)

        self._timer = QTimer(self, singleShot=True, interval=UPDATE_MS)
        self._timer.timeout.connect(self._flush)
        self.table.itemChanged.connect(self._on_item_changed)
        self.x_axis_combo.currentIndexChanged.connect(self._on_x_axis)
        self.y_combo.currentIndexChanged.connect(self._on_y)
        self._set_axis_label()

    # runs -------------------------------------------------------------------
    def add_run(self, record: RunRecord, checked: bool = True) -> None:
        self.count += 1
        if checked:  # keep the overlay (and its cost) bounded: the oldest ticked run goes off it
            for old in self.checked_runs()[: max(0, len(self.checked_runs()) - MAX_CHECKED + 1)]:
                self.set_checked(old, False)
        self.runs.append(record)
        self._rows[id(record)] = len(self.runs) - 1
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
        self.table.item(row, 0).setIcon(swatch(self._colors[id(record)]))
        self.table.blockSignals(False)
        self._fill_row(row)
        self._draw(record)
        self.checkedChanged.emit()

    def remove_runs(self, records: list[RunRecord]) -> None:
        """Take runs off the list and the overlay (what they held goes with them)."""
        removed = [record for record in records if self.listed(record)]
        for record in removed:
            row = self._row(record)
            self._undraw(record)
            self.table.removeRow(row)
            del self.runs[row]
            for table in (self._colors, self._series, self._italic):
                table.pop(id(record), None)
            self._dirty.discard(id(record))
            self._rows = {id(r): i for i, r in enumerate(self.runs)}
        self._show_info()
        self.checkedChanged.emit()
        if removed:
            self.runsRemoved.emit(removed)

    def replace_run(self, old: RunRecord, new: RunRecord) -> None:
        """new in old's row, with its colour and tick (a reloaded run's fresh record)."""
        row = self._row(old)
        self._undraw(old)
        self.runs[row] = new
        self._rows[id(new)] = self._rows.pop(id(old))
        self._colors[id(new)] = self._colors.pop(id(old))
        self._italic.pop(id(old), None)
        self._dirty.discard(id(old))
        self._fill_row(row)
        self._draw(new)
        self._show_info()

    def remove_selected(self) -> None:
        rows = sorted({index.row() for index in self.table.selectionModel().selectedRows()})
        self.remove_runs([self.runs[row] for row in rows])

    def let_go(self, record: RunRecord) -> None:
        """record is about to be compacted: its series keeps its own copy until dropped."""
        series = self._series.get(id(record))
        if series is not None:
            series.detach()

    def run_ended(self, record: RunRecord) -> None:
        """A run that will not grow again: its record compacted, its series rebuilt from that."""
        if self.listed(record):
            record.compact()
            self._series.pop(id(record), None)  # now, not at the next redraw: its memory goes
            self._fill_row(self._row(record))
            self._draw(record)

    def set_reference_dataset(self, content_hash: str) -> None:
        """Runs on other datasets than this one are marked as not comparable."""
        if content_hash != self.reference_hash:
            self.reference_hash = content_hash
            for record in self.runs:
                self._undraw(record)  # the curves' style and legend change
            self._redraw_all()

    def listed(self, record: RunRecord) -> bool:
        return id(record) in self._rows and self.runs[self._rows[id(record)]] is record

    def comparable(self, record: RunRecord) -> bool:
        return not (self.reference_hash and record.dataset_hash and record.dataset_hash != self.reference_hash)

    def update_run(self, record: RunRecord) -> None:
        """The record has new steps or a new status: redraw it soon (coalesced)."""
        series = self._series.get(id(record))
        if series is not None and series.n > len(record.losses):  # rewound (a checkpoint): its series
            series.truncate(len(record.losses))                     # never reads past what it holds
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
        live = []
        for record in self.runs:
            series = self._series.get(id(record))
            if series is None:
                continue
            if record.block == 1:
                live.append(series)
            else:  # compacted: at most MAX_POINTS points, smoothed at once at the block's weight
                series.set_weight(self.smoothing ** record.block)
        self._resmoother.resmooth(live, self.smoothing)  # then _redraw_all

    @property
    def x_axis(self) -> str:
        return self.x_axis_combo.currentData()

    def set_x_axis(self, axis: str) -> None:
        self.x_axis_combo.setCurrentIndex(self.x_axis_combo.findData(axis))

    @property
    def y_values(self) -> str:
        """What the overlay plots: TRAINING (smoothed) or HELDOUT."""
        return self.y_combo.currentData()

    def set_y_values(self, what: str) -> None:
        self.y_combo.setCurrentIndex(self.y_combo.findData(what))

    def _series_of(self, record: RunRecord) -> GrowingSeries:
        """The record's steps and smoothed losses (the EMA of the loss plot, per block
        of a compacted record), extended by the points it gained since the last call
        (rebuilt if it was rewound)."""
        series = self._series.get(id(record))
        if series is None:
            # the record's losses, read where they are (the application model's copy)
            series = self._series[id(record)] = GrowingSeries(self.smoothing ** record.block, source=record)
        n = len(record.losses)
        if series.n > n:
            series.truncate(n)
        if series.n < n:
            first = series.n
            series.extend(record.losses[first:n], first)
            if record.block != 1:
                series.x[first:n] = record.x[first:n] + 1  # steps count from 1, as in the loss plot
        return series

    def last_smoothed(self, record: RunRecord) -> float | None:
        """The record's last smoothed loss, as its row shows it (None with none): its
        series' while it is ticked, else from the losses still felt in it (an
        unticked live run's whole history is not smoothed again at every flush)."""
        if not self.is_checked(record):
            return ema_last(record.losses, self.smoothing ** record.block)
        series = self._series_of(record)
        return float(series.smooth[series.n - 1]) if series.n else None

    # drawing ------------------------------------------------------------------
    def _row(self, record: RunRecord) -> int:
        return self._rows[id(record)]

    def _fill_row(self, row: int) -> None:
        """Row `row` from its record; only the cells that changed are set (each change
        makes the table measure its columns again)."""
        r = self.runs[row]
        values = row_texts(r, self.last_smoothed(r))
        comparable = self.comparable(r)
        restyle = self._italic.get(id(r)) != (not comparable)
        self._italic[id(r)] = not comparable
        font = QFont(self.table.font())
        font.setItalic(not comparable)
        metrics = QFontMetrics(font)
        self.table.blockSignals(True)
        for col, text in enumerate(values):
            item = self.table.item(row, col)
            if item.text() != text:
                item.setText(text)
                self._widen(col, metrics.horizontalAdvance(text))
            if restyle:
                item.setFont(font)
                item.setForeground(self.palette().text() if comparable else QColor(130, 130, 130))
        tips = {0: f"{r.model}, {r.train}", DATASET: (
            r.dataset if comparable else
            f"{r.dataset}: another dataset than the current run's; its losses are not comparable")}
        for col, tip in tips.items():
            if self.table.item(row, col).toolTip() != tip:
                self.table.item(row, col).setToolTip(tip)
        self.table.blockSignals(False)

    def _widen(self, col: int, text_width: int) -> None:
        """Column col at least as wide as a text of text_width and its room (never
        narrowed: a live run's row would make the columns jump)."""
        if col == DATASET:
            return
        if col not in self._padding:  # the first row: what Qt adds to a text (margins, box, swatch)
            self._padding[col] = max(0, self.table.sizeHintForColumn(col) - text_width)
        needed = text_width + self._padding[col]
        header = self.table.horizontalHeader()
        if needed > header.sectionSize(col):
            header.resizeSection(col, needed)

    def _xy(self, record: RunRecord) -> tuple[np.ndarray, np.ndarray]:
        if self.y_values == HELDOUT:
            return self._heldout_xy(record)
        series = self._series_of(record)
        y = series.smooth[: series.n]
        if self.x_axis == STEP:
            return series.steps, y
        if self.x_axis == NAMES:
            return series.steps * record.train.batch_size, y
        x = record.wall_seconds()
        timed = ~np.isnan(x)
        return x[timed], y[timed]

    def _heldout_xy(self, record: RunRecord) -> tuple[np.ndarray, np.ndarray]:
        steps = np.array([p.step for p in record.heldout], dtype=np.float64)
        y = np.array([p.loss for p in record.heldout], dtype=np.float64)
        if self.x_axis == NAMES:
            return steps * record.train.batch_size, y
        if self.x_axis == SECONDS:
            x = record.seconds_at(steps)
            return x[~np.isnan(x)], y[~np.isnan(x)]
        return steps, y

    def _draw(self, record: RunRecord) -> None:
        if not self.is_checked(record):
            self._undraw(record)
            return
        x, y = self._xy(record)
        curve = self.curves.get(id(record))
        if curve is not None:  # a live run's flush: new data, same curve and legend entry
            curve.setData(x, y)
            return
        comparable = self.comparable(record)
        pen = pg.mkPen(*self._colors[id(record)], width=2, style=Qt.SolidLine if comparable else Qt.DashLine)
        label = self._legend_labels().get(id(record), record.name)
        if self.y_values == HELDOUT:  # few points: markers, drawn whole
            color = self._colors[id(record)]
            curve = self.plot.getPlotItem().plot(x, y, pen=pen, name=label, symbol="o", symbolSize=6,
                                                 symbolPen=pg.mkPen(color), symbolBrush=pg.mkBrush(color))
        else:
            curve = self.plot.getPlotItem().plot(x, y, pen=pen, name=label, autoDownsampleFactor=1.0)
            curve.setClipToView(True)
            curve.setDownsampling(auto=True, method="peak")
        self.curves[id(record)] = curve
        self._relabel()  # the others' labels say what differs from this one

    def _legend_labels(self) -> dict[int, str]:
        """id(record) -> its legend label, for the ticked runs."""
        checked = self.checked_runs()
        labels = legend_labels(checked)
        return {id(r): label + ("" if self.comparable(r) else f" ({OTHER_DATASET}: {r.dataset})")
                for r, label in zip(checked, labels)}

    def _relabel(self) -> None:
        """The ticked runs' legend labels, after the set of ticked runs (or a run's
        settings) changed."""
        changed = False
        for key, label in self._legend_labels().items():
            item = self.legend.getLabel(self.curves[key]) if key in self.curves else None
            if item is not None and item.text != label:
                item.setText(label)
                changed = True
        if changed:
            self.legend.updateSize()

    def _undraw(self, record: RunRecord) -> None:
        curve = self.curves.pop(id(record), None)
        if curve is not None:
            self.plot.getPlotItem().removeItem(curve)
        self._series.pop(id(record), None)  # an unticked run keeps no series: rebuilt when ticked

    def _redraw_all(self, *_) -> None:
        self._set_axis_label()
        if not self.isVisible():  # in a hidden tab: every run redrawn when shown (_flush)
            self._dirty.update(self._rows)
            return
        for row, record in enumerate(self.runs):
            self._fill_row(row)
            self._draw(record)
        self._dirty.clear()
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

    def _on_y(self, *_) -> None:
        """Another quantity: curves of another style (markers) and axis label."""
        for record in self.runs:
            self._undraw(record)
        self._on_x_axis()

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
        item = self.plot.getPlotItem()
        item.setLabel("left", "held-out loss" if self.y_values == HELDOUT else "smoothed loss")
        label, units = axis_label(self.x_axis, 0)  # no epoch: the runs' datasets may differ
        item.setLabel("bottom", label, units=units)

    def _show_info(self) -> None:
        self._relabel()
        checked = self.checked_runs()
        untimed = [r.name for r in checked if self.x_axis == SECONDS and np.isnan(r.ms_per_step)]
        other = [r.name for r in checked if not self.comparable(r)]
        lines = []
        if self.y_values == HELDOUT:
            unmeasured = [r.name for r in checked if not r.heldout]
            if unmeasured:
                lines.append(f"No held-out loss for {', '.join(unmeasured)} (held out 0, or not evaluated yet).")
            counts = {r.train.holdout for r in checked if r.heldout}
            if len(counts) > 1:
                lines.append("The ticked runs hold out different numbers of names: their held-out losses "
                             "are measured on different names.")
        if untimed:
            lines.append(f"No step times for {', '.join(untimed)} (loaded from a checkpoint): not on the time axis.")
        if other:
            lines.append(f"{', '.join(other)} trained on another dataset (dashed): not comparable with the others.")
        self.info.setText(" ".join(lines) or " ")
