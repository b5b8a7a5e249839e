"""Tools > Scaling study...: time per step against model size, per backend.

Tick backends and presets and press Run: each (backend, preset) is measured
in the background by `microgpt-gui bench`'s code (an engine.bench.scaling measure
function), and a log-log plot of ms/step against the parameter count grows
one point at a time, one line per backend, with a table beside it. Backends
that cannot run here get a row saying why. Cancel stops the study at once;
the table and plot export to CSV and PNG.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QCoreApplication, Qt, QTimer, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (QAbstractItemView, QDialog, QFileDialog, QHBoxLayout, QHeaderView, QLabel,
                               QListWidget, QListWidgetItem, QProgressBar, QPushButton, QSplitter, QTableWidget,
                               QTableWidgetItem, QVBoxLayout, QWidget)
from shiboken6 import isValid

import engine
from engine.bench import measure as bench
from engine.bench import scaling
from engine.bench.measure import BenchResult
from engine.bench.report import busy_note, is_busy, status_text

from .controls import buddy, plot_widget
from .background import Background
from .run_list import PALETTE

DEFAULT_PRESETS = ("tiny", "s32", "s64", "s128")  # a few seconds each; larger ones are opt-in
TABLE_COLUMNS = ["Backend", "Preset", "Params", "ms/step", "steps/s", "Status"]
STATUS_COLUMN = TABLE_COLUMNS.index("Status")
BUSY_BRUSH = (190, 110, 0)  # a busy row's status, in amber


def log_ticks(lo: float, hi: float) -> list[list[tuple[float, str]]]:
    """Ticks for an axis that shows log10 of values from lo to hi: labelled
    powers of ten (and 2 and 5 times them), unlabelled minor ticks between."""
    major, minor = [], []
    for power in range(int(np.floor(np.log10(lo))) - 1, int(np.ceil(np.log10(hi))) + 2):
        for m in range(1, 10):
            value, labelled = m * 10.0**power, m in (1, 2, 5)
            (major if labelled else minor).append((float(np.log10(value)), _short(value) if labelled else ""))
    return [major, minor]


def figure(value: float) -> str:
    """A measured figure as a person reads it, three digits or whole numbers, never an
    exponent: 14970.3 -> '14,970', 28 -> '28.0', 0.1965 -> '0.197'."""
    if abs(float(f"{value:.3g}")) >= 100:  # 99.97 too: it rounds to 100
        return f"{value:,.0f}"
    return f"{value:#.3g}"


def _short(value: float) -> str:
    """1e-3 -> '0.001', 2e4 -> '20k', 5e6 -> '5M'."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:g}{suffix}"
    return f"{value:g}"


def study_reports(backends, presets, measure, availability, seconds, cancelled: Callable[[], bool]):
    """One study, in a background thread (a generator: gui.background reports what it
    yields on the GUI thread): ("started", backend, preset, index, jobs) before each
    measurement and ("row", BenchResult) for each measured, skipped or failed
    configuration; returns whether it was cancelled."""
    try:
        study = scaling.plan(list(backends), list(presets), availability)
        for result in study.skipped:
            yield ("row", result)
        for i, (backend, preset) in enumerate(study.jobs):
            if cancelled():
                break
            yield ("started", backend, preset, i, len(study.jobs))
            try:
                result = measure(backend, preset, seconds, cancelled)
            except engine.Cancelled:
                break
            except Exception as exc:  # one failed configuration is one error row
                result = BenchResult(backend, preset, "error", reason=f"{type(exc).__name__}: {exc}")
            if cancelled():
                break
            yield ("row", result)
    except Exception as exc:  # e.g. availability failed: say so, end the study
        yield ("row", BenchResult("-", "-", "error", reason=f"{type(exc).__name__}: {exc}"))
    return cancelled()


_study_thread: Background | None = None


def study_thread() -> Background:
    """The one thread every scaling study dialog's calls run on (the availability
    check, then the studies, in the order asked), made on the first call and kept
    as long as the app. threading.Thread.start returns only once the new thread
    has run, so a thread started as the dialog opens held the GUI thread for as
    long as the new thread waited for a CPU (over 100 ms on a loaded machine);
    later dialogs start none. Studies of two windows take turns."""
    global _study_thread
    if _study_thread is None or not isValid(_study_thread):
        _study_thread = Background(QCoreApplication.instance(), "scaling-study", one_thread=True)
    return _study_thread


def _study_plot() -> pg.PlotWidget:
    plot = plot_widget("scalingPlot", "Median ms per training step against parameter count, one line per backend")
    item = plot.getPlotItem()
    # log10 of the values, with our own ticks: pyqtgraph's log axes label
    # every minor tick, which turns a narrow range into a smear of digits
    item.setLabel("bottom", "parameters (log scale)")
    item.setLabel("left", "ms per step (log scale)")
    item.showGrid(x=True, y=True, alpha=0.2)
    item.addLegend(offset=(10, 10))
    return plot


class ScalingStudyDialog(QDialog):
    studyFinished = Signal(bool)   # True when cancelled

    def __init__(self, data_path: str | Path | None = None, measure: scaling.MeasureFn | None = None,
                 availability: Callable = bench.availability, backends: list[str] | None = None,
                 presets: list[str] | None = None, seconds: float = 2.0, parent=None):
        super().__init__(parent, objectName="scalingStudy")
        self.setWindowTitle("Scaling study")
        self.measure = measure or (scaling.isolated_measure(data_path) if data_path else None)
        self.availability = availability
        self.seconds = seconds
        self.results: list[BenchResult] = []
        self._cancelled: threading.Event | None = None  # the running study's cancel flag
        # set when the dialog is deleted: its study ends at its next check (the thread is shared)
        self._gone = threading.Event()
        self.destroyed.connect(self._gone.set)
        self._availability_asked = False
        self._curves: dict[str, pg.PlotDataItem] = {}

        self.backend_list = QListWidget(objectName="scalingBackendList")
        self.backend_list.setToolTip("Backends to measure (one that cannot run here is reported with the reason)")
        for name in backends if backends is not None else bench.default_backends():
            self._add_checkable(self.backend_list, name, name == "numpy")
        self.preset_list = QListWidget(objectName="scalingPresetList")
        self.preset_list.setToolTip("Model sizes to measure")
        for name in presets if presets is not None else list(engine.PRESETS):
            self._add_checkable(self.preset_list, name, name in DEFAULT_PRESETS)
        self.run_button = QPushButton("&Run", objectName="scalingRunButton")
        self.run_button.setToolTip("Measure every ticked (backend, preset) for a few seconds each")
        self.cancel_button = QPushButton("&Cancel", objectName="scalingCancelButton", enabled=False)
        self.cancel_button.setToolTip("Stop the study; the rows measured so far stay")
        self.csv_button = QPushButton("Export C&SV...", objectName="scalingCsvButton")
        self.png_button = QPushButton("Export &PNG...", objectName="scalingPngButton")
        self.csv_button.setToolTip("Save the table (backend, preset, params, ms/step, steps/s, status, reason)")
        self.png_button.setToolTip("Save the plot as an image")
        self.progress = QProgressBar(objectName="scalingProgress")
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("idle")
        self.status = QLabel(" ", objectName="scalingStatus", wordWrap=True)

        # the plot's place until it is built, just after the dialog's first paint (see plot)
        self._plot: pg.PlotWidget | None = None
        self._plot_slot = QWidget(objectName="scalingPlotSlot")
        self._plot_queued = False
        self.table = QTableWidget(0, len(TABLE_COLUMNS), objectName="scalingTable")
        self.table.setToolTip("One row per (backend, preset): measured, or why it could not be")
        self.table.setHorizontalHeaderLabels(TABLE_COLUMNS)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.setWordWrap(False)  # a long reason is elided; its tooltip has all of it
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeToContents)
        # the status takes the width left and is elided there, never pushed behind a scroll bar
        header.setSectionResizeMode(STATUS_COLUMN, QHeaderView.Stretch)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)

        choose = QVBoxLayout()
        choose.addWidget(buddy("&Backends", self.backend_list))
        choose.addWidget(self.backend_list, 1)
        choose.addWidget(buddy("Pr&esets", self.preset_list))
        choose.addWidget(self.preset_list, 1)
        runs = QHBoxLayout()
        runs.addWidget(self.run_button)
        runs.addWidget(self.cancel_button)
        choose.addLayout(runs)
        left = QWidget()
        left.setLayout(choose)
        left.setMaximumWidth(220)
        results = self._results = QSplitter(Qt.Horizontal)
        results.addWidget(self._plot_slot)
        results.addWidget(self.table)
        results.setSizes([460, 540])
        top = QHBoxLayout()
        top.addWidget(left)
        top.addWidget(results, 1)
        bottom = QHBoxLayout()
        bottom.addWidget(self.progress, 1)
        bottom.addWidget(self.csv_button)
        bottom.addWidget(self.png_button)
        layout = QVBoxLayout(self)
        layout.addLayout(top, 1)
        layout.addLayout(bottom)
        layout.addWidget(self.status)
        order = [self.backend_list, self.preset_list, self.run_button, self.cancel_button, self.table,
                 self.csv_button, self.png_button]
        for first, second in zip(order, order[1:]):
            QWidget.setTabOrder(first, second)
        self.resize(1160, 600)

        self.run_button.clicked.connect(self.run)
        self.cancel_button.clicked.connect(self.cancel)
        self.csv_button.clicked.connect(lambda: self.export_csv())
        self.png_button.clicked.connect(lambda: self.export_png())
        if self.measure is None:
            self.run_button.setEnabled(False)
            self.status.setText("Open a dataset first: the measurements train on it.")

    # the plot ------------------------------------------------------------------
    @property
    def plot(self) -> pg.PlotWidget:
        """The log-log plot, built when first used or just after the dialog's first
        paint: pyqtgraph's PlotItem (its axes, menus, view box) takes 15-20 ms of the
        GUI thread, as much as the rest of the dialog, so the dialog shows first and
        the plot comes in the next turn of the event loop."""
        if self._plot is None:
            self._plot = _study_plot()
            self._results.replaceWidget(0, self._plot)
            self._plot_slot.deleteLater()
        return self._plot

    def paintEvent(self, event) -> None:
        super().paintEvent(event)
        if self._plot is None and not self._plot_queued:
            self._plot_queued = True
            QTimer.singleShot(0, self, lambda: (self.plot, self._ask_availability()))

    def _ask_availability(self) -> None:
        """Which backends can run here, found off the GUI thread, once (after the first
        paint, or with the first study)."""
        if not self._availability_asked:
            self._availability_asked = True
            names = [self.backend_list.item(i).text() for i in range(self.backend_list.count())]
            study_thread().start(self.availability, names, on_done=self._if_alive(self._show_availability))

    def _if_alive(self, fn: Callable) -> Callable:
        """fn, called only while this dialog exists (the shared thread outlives it)."""
        return lambda *args: fn(*args) if isValid(self) else None

    # running ------------------------------------------------------------------
    @staticmethod
    def _add_checkable(listing: QListWidget, name: str, checked: bool) -> QListWidgetItem:
        item = QListWidgetItem(name, listing)
        item.setFlags(item.flags() | Qt.ItemIsUserCheckable)
        item.setCheckState(Qt.Checked if checked else Qt.Unchecked)
        return item

    @staticmethod
    def _checked(listing: QListWidget) -> list[str]:
        return [listing.item(i).text() for i in range(listing.count())
                if listing.item(i).checkState() == Qt.Checked]

    def set_checked(self, backends: list[str], presets: list[str]) -> None:
        for listing, names in ((self.backend_list, backends), (self.preset_list, presets)):
            for i in range(listing.count()):
                item = listing.item(i)
                item.setCheckState(Qt.Checked if item.text() in names else Qt.Unchecked)

    def _show_availability(self, status: dict) -> None:
        for i in range(self.backend_list.count()):
            item = self.backend_list.item(i)
            available, reason = status.get(item.text(), (True, ""))
            item.setToolTip(reason)
            if not available:
                item.setForeground(Qt.gray)
                item.setToolTip(f"cannot run here: {reason}")

    @property
    def running(self) -> bool:
        return self._cancelled is not None

    def run(self) -> bool:
        """Start a study of the ticked backends and presets (the old results are cleared)."""
        backends, presets = self._checked(self.backend_list), self._checked(self.preset_list)
        if self.running or self.measure is None:
            return False
        if not backends or not presets:
            self.status.setText("Tick at least one backend and one preset.")
            return False
        self.clear()
        self._cancelled = threading.Event()
        self.progress.setRange(0, 0)
        self.progress.setFormat("checking the backends...")
        self._set_running(True)
        self._ask_availability()
        flag, gone = self._cancelled, self._gone
        study_thread().start(study_reports, backends, presets, self.measure, self.availability, self.seconds,
                             lambda: flag.is_set() or gone.is_set(), on_yielded=self._if_alive(self._on_report),
                             on_done=self._if_alive(self._on_done))
        return True

    def cancel(self) -> None:
        if self._cancelled is not None:
            self._cancelled.set()
            self.status.setText("Cancelling...")

    def _set_running(self, running: bool) -> None:
        self.run_button.setEnabled(not running and self.measure is not None)
        self.cancel_button.setEnabled(running)
        self.backend_list.setEnabled(not running)
        self.preset_list.setEnabled(not running)

    def _on_report(self, report: tuple) -> None:
        kind, *args = report
        (self._on_started if kind == "started" else self._on_row)(*args)

    def _on_started(self, backend: str, preset: str, index: int, total: int) -> None:
        self.progress.setRange(0, total)
        self._show_progress(index)
        self.status.setText(f"Measuring {backend} on {preset}...")

    def _on_row(self, result: BenchResult) -> None:
        self.add_result(result)
        if result.status != "skipped" and self.progress.maximum() > 0:
            self._show_progress(self.progress.value() + 1)

    def _show_progress(self, done: int) -> None:
        self.progress.setValue(done)
        self.progress.setFormat(f"{done} / {self.progress.maximum()}")

    def _on_done(self, cancelled: bool) -> None:
        self._cancelled = None
        self._set_running(False)
        measured = sum(r.status == "ok" for r in self.results)
        self.progress.setRange(0, 1)
        self.progress.setValue(0 if cancelled else 1)
        self.progress.setFormat("cancelled" if cancelled else "done")
        note = busy_note(self.results)  # bench's own warning, for the rows it flags busy
        self.status.setText(f"{'Cancelled' if cancelled else 'Done'}: {measured} configuration(s) measured. "
                            "Each point is the median ms/step of bench's chunks after warm-up."
                            + (f"\n{note[0].upper()}{note[1:]}" if note else ""))
        self.studyFinished.emit(cancelled)

    # results --------------------------------------------------------------------
    def add_result(self, result: BenchResult) -> None:
        self.results.append(result)
        row = self.table.rowCount()
        self.table.insertRow(row)
        ok = result.status == "ok"
        values = [result.backend, result.preset, f"{result.params:,}" if result.params else "",
                  figure(result.ms_per_step) if ok else "", figure(result.steps_per_s) if ok else "",
                  status_text(result)]  # bench's words: "busy" where bench's table says busy
        for col, text in enumerate(values):
            cell = QTableWidgetItem(text)
            cell.setToolTip(text)
            self.table.setItem(row, col, cell)
        if is_busy(result):
            self.table.item(row, STATUS_COLUMN).setForeground(QColor(*BUSY_BRUSH))
            self.table.item(row, STATUS_COLUMN).setToolTip(
                "Other work shared the CPU while this was measured (load average above the core count): "
                "slower and noisier than this machine can do; measure again when it is idle")
        if ok:
            self._draw(result.backend)

    def _draw(self, backend: str) -> None:
        points = sorted((r.params, r.ms_per_step) for r in self.results if r.backend == backend and r.status == "ok")
        x, y = np.array(points, dtype=np.float64).T
        curve = self._curves.get(backend)
        if curve is None:
            color = PALETTE[len(self._curves) % len(PALETTE)]
            curve = self.plot.getPlotItem().plot(name=backend, pen=pg.mkPen(*color, width=2), symbol="o",
                                                 symbolBrush=pg.mkBrush(*color), symbolPen=None, symbolSize=8)
            self._curves[backend] = curve
        curve.setData(np.log10(x), np.log10(y))
        item = self.plot.getPlotItem()
        ok = [r for r in self.results if r.status == "ok"]
        for side, values in (("bottom", [r.params for r in ok]), ("left", [r.ms_per_step for r in ok])):
            item.getAxis(side).setTicks(log_ticks(min(values), max(values)))

    def curve_data(self, backend: str) -> tuple[np.ndarray, np.ndarray]:
        """(params, ms/step) of a backend's line, in plotting order (the curve holds their log10)."""
        curve = self._curves.get(backend)
        if curve is None:
            return np.empty(0), np.empty(0)
        x, y = curve.getOriginalDataset()
        return np.round(10.0**x), 10.0**y

    def clear(self) -> None:
        self.results = []
        self.table.setRowCount(0)
        for curve in self._curves.values():
            self.plot.getPlotItem().removeItem(curve)
        self._curves = {}

    def export_csv(self, path: str | None = None) -> bool:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Export scaling study", "scaling.csv", "CSV files (*.csv)")
            if not path:
                return False
        try:
            scaling.write_csv(path, self.results)
        except OSError as exc:
            self.status.setText(f"Could not write {path}: {exc.strerror or exc}")
            return False
        self.status.setText(f"Saved {path}")
        return True

    def export_png(self, path: str | None = None) -> bool:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Export scaling plot", "scaling.png", "PNG images (*.png)")
            if not path:
                return False
        if not self.plot.grab().save(str(path), "PNG"):
            self.status.setText(f"Could not write {path}")
            return False
        self.status.setText(f"Saved {path}")
        return True

    def closeEvent(self, event) -> None:
        self.cancel()  # the study's thread ends at its next check; nothing waits for it
        super().closeEvent(event)
