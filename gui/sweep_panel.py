"""The Sweep tab: a sweep file edited as text (checked as it is typed), where
it runs (this machine, or a Ray cluster's address), Start, Stop (the sweep or
one trial) and Resume; every trial live in a table (settings, status, best
and final held-out loss, steps, names/s; sortable), in a plot of every
trial's curve coloured by its status, and in a scatter of one setting
against the best held-out loss. A trial's checkpoint loads into the window
(Load trial), where it samples and trains on like any run; each trial is
also a run of the Runs tab (runAdded / runChanged / runEnded).

The sweep runs in engine.sweep's runner, a child process (gui.sweep_runner):
nothing of Ray runs in the window's process. With a job server's address
(http://HEAD:8265) that runner submits the sweep to the cluster as a Ray job
and relays its events: the tab shows them as a local sweep's. Sweep files and events are
engine.sweep's; this panel only shows them.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFontDatabase
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QFileDialog, QHBoxLayout, QHeaderView, QLabel,
                               QLineEdit, QPlainTextEdit, QPushButton, QSplitter, QTableWidget, QTableWidgetItem,
                               QVBoxLayout, QWidget)

from engine.config import get_preset
from engine.data.corpus import user_data_dir
from engine.sweep import launch
from engine.sweep.events import SPEC_FILE, SweepStatus, SweepTable, TrialRecord, TrialStatus
from engine.sweep.connect import RAY_MISSING, SweepError, check_address
from engine.sweep.spec import EXAMPLES, SweepSpec, SweepSpecError, examples, parse_spec, run_configs, space_size
from engine.training.heldout import HeldoutPoint
from engine.training.records import RunRecord

from .controls import buddy, column, plot_widget
from .loss_series import ema
from .sweep_runner import SweepRunner

STATUS_COLORS = {  # Okabe-Ito: distinct for the common colour-vision deficiencies
    TrialStatus.RUNNING: (0, 114, 178), TrialStatus.DONE: (0, 158, 115),
    TrialStatus.STOPPED_EARLY: (230, 159, 0), TrialStatus.STOPPED: (120, 120, 120),
    TrialStatus.DIVERGED: (213, 94, 0), TrialStatus.FAILED: (204, 121, 167),
}
RUN_STATUS = {TrialStatus.DONE: "finished", TrialStatus.STOPPED_EARLY: "stopped early",
              TrialStatus.STOPPED: "stopped", TrialStatus.DIVERGED: "diverged", TrialStatus.FAILED: "failed"}
FIXED_COLUMNS = ["Trial", "Status", "Best held-out", "Final held-out", "Steps", "names/s"]
CHECK_MS = 300    # the sweep file is checked this long after the last keystroke
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


class SweepPanel(QWidget):
    loadRequested = Signal(str)       # a trial's checkpoint to load into the window
    runAdded = Signal(object)         # an engine.training.records.RunRecord for a trial
    runChanged = Signal(object)
    runEnded = Signal(object)
    messageShown = Signal(str, str, str)  # kind, title, text

    def __init__(self, parent=None):
        super().__init__(parent, objectName="sweepPanel")
        self.runner = SweepRunner(self)
        self.runner.event.connect(self.on_event)
        self.runner.ended.connect(self._on_ended)
        self.table = SweepTable()
        self.spec: SweepSpec | None = None      # the editor's sweep, when it is valid
        self.running_spec: SweepSpec | None = None
        self.folder: Path | None = None
        self.runs: dict[str, RunRecord] = {}    # trial -> its run in the Runs tab
        self._run_seconds: dict[str, float] = {}  # trial -> training seconds its run has been given
        self._curves: dict[str, tuple] = {}     # trial -> (loss curve, held-out markers)
        self._dirty: set[str] = set()
        self._build()
        self.load_example(examples()[0] if "quick" not in examples() else "quick")
        self._update_buttons()

    # layout ------------------------------------------------------------------------
    def _build(self) -> None:
        self.example_combo = QComboBox(objectName="sweepExampleCombo")
        self.example_combo.addItems(examples())
        self.example_combo.setToolTip("The sweeps that come with microgpt-gui (resources/sweeps/)")
        self.example_combo.activated.connect(lambda i: self.load_example(self.example_combo.itemText(i)))
        self.open_button = QPushButton("&Open...", objectName="sweepOpenButton")
        self.open_button.clicked.connect(lambda: self.open_file())
        self.save_button = QPushButton("Save as...", objectName="sweepSaveButton")
        self.save_button.clicked.connect(lambda: self.save_file())
        self.editor = QPlainTextEdit(objectName="sweepEditor")
        self.editor.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))
        self.editor.setLineWrapMode(QPlainTextEdit.NoWrap)
        self.editor.setToolTip("The sweep file (TOML): [sweep], [resources], [scheduler], [run] and [space]; "
                               "docs/sweeps.md describes every key")
        self.editor.textChanged.connect(lambda: self._check_timer.start())
        self.problem_label = QLabel(" ", objectName="sweepProblem", wordWrap=True)
        self.address_edit = QLineEdit(objectName="sweepAddress")
        self.address_edit.setPlaceholderText("this machine (a local Ray); or http://HEAD:8265")
        self.address_edit.setToolTip(
            "Where the sweep runs. Empty: a local Ray on this machine's CPUs. http://HEAD:8265: a Ray cluster's "
            "job server (its head's dashboard port): the sweep runs there as a Ray job, its events come back "
            "here. HOST:PORT: the head's GCS (6379): the sweep's driver runs here and joins the cluster (on a "
            "node of it). Resume with this empty continues a sweep where it ran.")
        self.start_button = QPushButton("&Start sweep", objectName="sweepStartButton")
        self.start_button.clicked.connect(lambda: self.start())
        self.stop_button = QPushButton("Sto&p sweep", objectName="sweepStopButton")
        self.stop_button.setToolTip("Stop every trial; Resume continues the sweep later")
        self.stop_button.clicked.connect(self.stop)
        self.resume_button = QPushButton("Resume fol&der...", objectName="sweepResumeButton")
        self.resume_button.setToolTip("Continue a stopped sweep from its folder: finished trials are kept")
        self.resume_button.clicked.connect(lambda: self.resume())
        self.status_label = QLabel("No sweep yet", objectName="sweepStatus", wordWrap=True)
        self.status_label.setTextInteractionFlags(Qt.TextSelectableByMouse)

        files = QHBoxLayout()
        files.addWidget(buddy("E&xample", self.example_combo))
        files.addWidget(self.example_combo, 1)
        files.addWidget(self.open_button)
        files.addWidget(self.save_button)
        where = QHBoxLayout()
        where.addWidget(buddy("&Cluster", self.address_edit))
        where.addWidget(self.address_edit, 1)
        buttons = QHBoxLayout()
        for button in (self.start_button, self.stop_button, self.resume_button):
            buttons.addWidget(button)
        left = column(files, (self.editor, 1), self.problem_label, where, buttons, self.status_label)

        self.trial_table = QTableWidget(0, len(FIXED_COLUMNS), objectName="sweepTable")
        self.trial_table.setHorizontalHeaderLabels(FIXED_COLUMNS)
        self.trial_table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.trial_table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.trial_table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.trial_table.verticalHeader().setVisible(False)
        self.trial_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.trial_table.setSortingEnabled(True)
        self.trial_table.itemSelectionChanged.connect(self._update_buttons)
        self.trial_table.itemDoubleClicked.connect(lambda *_: self.load_selected())
        self.stop_trial_button = QPushButton("Stop tria&l", objectName="sweepStopTrialButton")
        self.stop_trial_button.clicked.connect(self.stop_selected)
        self.load_button = QPushButton("Load trial", objectName="sweepLoadButton")
        self.load_button.setToolTip("Load the selected trial's newest checkpoint into the window "
                                    "(sample it, train it on); double-click a row does the same")
        self.load_button.clicked.connect(self.load_selected)
        self.y_combo = QComboBox(objectName="sweepYCombo")
        self.y_combo.addItem("training loss (smoothed)", TRAINING)
        self.y_combo.addItem("held-out loss", HELDOUT)
        self.y_combo.currentIndexChanged.connect(lambda *_: self._redraw_all())
        self.curve_plot = plot_widget("sweepCurves", "Every trial's loss against names seen, coloured by status")
        self.curve_plot.getPlotItem().setLabel("bottom", "names seen")
        self.curve_plot.getPlotItem().setLabel("left", "loss")
        legend = self.curve_plot.getPlotItem().addLegend(offset=(-10, 10))
        for status, color in STATUS_COLORS.items():  # the legend says what the colours mean
            legend.addItem(pg.PlotDataItem(pen=pg.mkPen(color, width=2)), status.value)
        self.x_combo = QComboBox(objectName="sweepScatterCombo")
        self.x_combo.setToolTip("The setting the scatter plots the best held-out loss against")
        self.x_combo.currentIndexChanged.connect(lambda *_: self._draw_scatter())
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
        right = column((self.trial_table, 2), trial_buttons, (plots, 3))

        splitter = QSplitter(Qt.Horizontal)
        splitter.addWidget(left)
        splitter.addWidget(right)
        splitter.setStretchFactor(0, 2)
        splitter.setStretchFactor(1, 3)
        layout = QVBoxLayout(self)
        layout.addWidget(splitter)

        self._check_timer = QTimer(self, singleShot=True, interval=CHECK_MS)
        self._check_timer.timeout.connect(self.check_spec)
        self._redraw_timer = QTimer(self, singleShot=True, interval=REDRAW_MS)
        self._redraw_timer.timeout.connect(self._redraw_dirty)

    # the sweep file ------------------------------------------------------------------
    def load_example(self, name: str) -> None:
        self.set_text((EXAMPLES / f"{name}.toml").read_text(encoding="utf-8"))
        self.example_combo.setCurrentText(name)

    def set_text(self, text: str) -> None:
        self.editor.setPlainText(text)
        self.check_spec()

    def open_file(self, path: str | None = None) -> None:
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Open sweep file", str(EXAMPLES), "Sweep files (*.toml)")
            if not path:
                return
        try:
            self.set_text(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            self.messageShown.emit("error", "Cannot open the sweep file", f"{path}: {exc}")

    def save_file(self, path: str | None = None) -> None:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Save sweep file", "sweep.toml", "Sweep files (*.toml)")
            if not path:
                return
        try:
            Path(path).write_text(self.editor.toPlainText(), encoding="utf-8")
        except OSError as exc:
            self.messageShown.emit("error", "Cannot save the sweep file", f"{path}: {exc.strerror or exc}")

    def check_spec(self) -> SweepSpec | None:
        """Read the editor's text as a sweep file; its problem (or a summary) below it."""
        self._check_timer.stop()
        try:
            self.spec = parse_spec(self.editor.toPlainText(), default_name="sweep")
        except SweepSpecError as exc:
            self.spec = None
            self.problem_label.setText(str(exc))
            self.problem_label.setStyleSheet("color: #b00020")
        else:
            self.problem_label.setText(summary(self.spec))
            self.problem_label.setStyleSheet("")
        self._update_buttons()
        return self.spec

    # starting and stopping ---------------------------------------------------------------
    def start(self, folder: Path | None = None) -> bool:
        spec = self.check_spec()
        if spec is None or self.runner.running or not self._can_run():
            return False
        folder = Path(folder) if folder is not None else launch.default_sweep_dir(spec.name)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / SPEC_FILE).write_text(spec.source, encoding="utf-8")
        except OSError as exc:
            self.messageShown.emit("error", "Cannot start the sweep", f"{folder}: {exc.strerror or exc}")
            return False
        self._run(spec, folder, resume=False)
        return True

    def resume(self, folder: str | None = None) -> bool:
        if self.runner.running:
            return False
        if folder is None:
            root = user_data_dir() / "sweeps"
            folder = QFileDialog.getExistingDirectory(self, "Resume sweep", str(root if root.is_dir() else Path.home()))
            if not folder:
                return False
        folder = Path(folder)
        try:
            spec = parse_spec((folder / SPEC_FILE).read_text(encoding="utf-8"))
        except (OSError, SweepSpecError) as exc:
            self.messageShown.emit("error", "Cannot resume", f"{folder} holds no sweep that can run: {exc}")
            return False
        if not self._can_run():
            return False
        self.set_text(spec.source)
        self._run(spec, folder, resume=True)
        return True

    def _can_run(self) -> bool:
        """Ray is installed and the address is one a sweep can go to; else a message says why."""
        if not launch.ray_installed():
            self.messageShown.emit("error", "Ray is not installed", RAY_MISSING)
            return False
        try:
            check_address(self.address_edit.text().strip())
        except SweepError as exc:
            self.messageShown.emit("error", "Cannot start the sweep", str(exc))
            return False
        return True

    def _run(self, spec: SweepSpec, folder: Path, resume: bool) -> None:
        self._begin(spec, folder)
        self.runner.start(folder, None if resume else folder / SPEC_FILE, self.address_edit.text().strip(),
                          resume=resume)
        self._update_buttons()

    def stop(self) -> None:
        self.runner.stop()
        self.status_label.setText("Stopping the sweep (Tune saves its state; Resume continues it)...")

    def stop_selected(self) -> None:
        record = self.selected_trial()
        if record is not None and record.status == TrialStatus.RUNNING:
            self.runner.stop(record.trial)

    def shutdown(self) -> None:
        """The window closes: the sweep stops, and its processes end soon after."""
        self.runner.end()

    def _begin(self, spec: SweepSpec, folder: Path) -> None:
        for record in self.runs.values():  # the last sweep's trials stay in the Runs tab, ended
            self.runEnded.emit(record)
        self.table = SweepTable()
        self.running_spec, self.folder = spec, folder
        self.runs, self._run_seconds, self._dirty = {}, {}, set()
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
        self.status_label.setText(f"Starting the sweep {spec.name} in {folder}...")
        self._update_buttons()

    # the runner's events --------------------------------------------------------------
    def on_event(self, event: dict) -> None:
        record = self.table.apply(event)
        kind = event["event"]
        if record is not None:
            self._show_trial(record)
            self._update_run(record, event)
        if kind in ("sweep", "trial_started", "trial_ended", "sweep_ended"):
            self._show_status()
        if kind in ("trial_ended", "sweep_ended"):
            self._draw_scatter()

    def _on_ended(self, code: int, message: str) -> None:
        if message and self.table.status == SweepStatus.RUNNING:
            self.table.status, self.table.message = SweepStatus.FAILED, message
        if message:
            self.messageShown.emit("error", "The sweep failed", message)
        for record in self.table.trials.values():
            if not record.status.ended:
                record.status = TrialStatus.STOPPED
                self._show_trial(record)
        self._show_status()
        self._draw_scatter()
        self._update_buttons()

    def _show_status(self) -> None:
        trials = list(self.table.trials.values())
        counts = {status: sum(1 for t in trials if t.status == status) for status in TrialStatus}
        parts = [f"{n} {status.value}" for status, n in counts.items() if n]
        info = self.table.info
        where = (f" on {info.get('cpus')} CPUs, {info.get('nodes')} node{'s' if info.get('nodes') != 1 else ''} "
                 f"({info.get('address')}{', Ray job ' + info['job'] if info.get('job') else ''})") if info else ""
        state = {SweepStatus.RUNNING: "running" if self.runner.running else "ended",
                 SweepStatus.DONE: "done", SweepStatus.STOPPED: "stopped (Resume continues it)",
                 SweepStatus.FAILED: "failed"}[self.table.status]
        best = self.table.best()
        text = f"Sweep {state}{where}: {', '.join(parts) or 'no trials yet'}"
        if best is not None:
            text += f"; best held-out {best.best_heldout:.4f} (trial {best.trial})"
        if self.table.status == SweepStatus.FAILED and self.table.message:
            text += f". {self.table.message}"
        if self.folder is not None:
            text += f"\nFolder: {self.folder}"
        self.status_label.setText(text)

    def _show_trial(self, record: TrialRecord) -> None:
        table = self.trial_table
        table.setSortingEnabled(False)  # rows stay put while their cells change
        row = self._row_of(record.trial)
        if row is None:
            row = table.rowCount()
            table.insertRow(row)
            for col in range(table.columnCount()):
                table.setItem(row, col, SortKeyItem())
            table.item(row, 0).setData(Qt.UserRole + 1, record.trial)
        keys = list(self.running_spec.space) if self.running_spec else []
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
        self._update_buttons()

    def _row_of(self, trial: str) -> int | None:
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
        row = self._row_of(trial)
        if row is not None:
            self.trial_table.selectRow(row)

    def load_selected(self) -> None:
        record = self.selected_trial()
        if record is None:
            return
        if record.checkpoint and not Path(record.checkpoint).is_file() and self.table.info.get("job"):
            self.messageShown.emit(
                "info", "The checkpoint is on the cluster",
                f"Trial {record.trial}'s checkpoint is on the cluster, at {record.checkpoint}, which this machine "
                "cannot read. A sweep run as a Ray job writes in the data folder of the cluster's head "
                "(sweep-jobs); its trials load here when that folder is on storage this machine mounts at the "
                "same path (start the cluster with MICROGPT_GUI_DATA_DIR there), or copy the file here and use "
                "File > Load checkpoint.")
            return
        if not record.checkpoint or not Path(record.checkpoint).is_file():
            self.messageShown.emit("info", "No checkpoint", f"Trial {record.trial} has no checkpoint to load "
                                   "(a trial checkpoints at ASHA's rungs, now and then, and at its end).")
            return
        self.loadRequested.emit(record.checkpoint)

    def _update_buttons(self) -> None:
        running = self.runner.running
        self.start_button.setEnabled(self.spec is not None and not running)
        self.resume_button.setEnabled(not running)
        self.stop_button.setEnabled(running)
        self.address_edit.setEnabled(not running)
        record = self.selected_trial()
        self.stop_trial_button.setEnabled(running and record is not None and record.status == TrialStatus.RUNNING)
        self.load_button.setEnabled(record is not None and bool(record.checkpoint))

    # the Runs tab ---------------------------------------------------------------------------
    def _update_run(self, record: TrialRecord, event: dict) -> None:
        kind = event["event"]
        run = self.runs.get(record.trial)
        if kind == "trial_started" or run is None:
            if run is not None:
                self.runEnded.emit(run)  # a resumed trial: a new run from its checkpoint on
            try:
                backend, model, train = run_configs(record.settings)
            except ValueError:
                return  # no network: it fails, and has no curve
            dataset = Path(self.running_spec.dataset).name if self.running_spec and self.running_spec.dataset \
                else "names.txt"
            run = self.runs[record.trial] = RunRecord(f"trial {record.trial}", backend, model, train,
                                                      status="running", dataset=dataset)
            self.runAdded.emit(run)
        if kind == "trial_result":
            first, block = int(event.get("first_step", 0)), int(event.get("block", 1))
            losses = np.asarray([math.nan if x is None else x for x in event.get("losses") or ()], dtype=np.float32)
            counts = np.diff(np.minimum(np.arange(len(losses) + 1) * block + first, event["step"]))
            seconds = float(event.get("train_seconds") or 0.0)
            if run.block == 1 and first <= run.steps and len(losses):
                run.extend(np.repeat(losses, counts), first, max(seconds - self._run_seconds.get(record.trial, 0.0), 0.0))
            self._run_seconds[record.trial] = seconds
            points = [HeldoutPoint(int(s), float(x)) for s, x in event.get("heldout") or () if x is not None]
            if points:
                run.add_heldout(points)
            self.runChanged.emit(run)
        elif kind == "trial_ended":
            run.status = RUN_STATUS.get(record.status, record.status.value)
            self.runEnded.emit(run)

    # plots ------------------------------------------------------------------------------
    def _redraw_dirty(self) -> None:
        dirty, self._dirty = self._dirty, set()
        for trial in dirty:
            record = self.table.trials.get(trial)
            if record is not None:
                self._draw(record)

    def _redraw_all(self) -> None:
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

    def _draw_scatter(self) -> None:
        key = self.x_combo.currentText()
        trials = [t for t in self.table.trials.values() if math.isfinite(t.best_heldout) and key in t.settings]
        values = [t.settings[key] for t in trials]
        categories = sorted({v for v in values if isinstance(v, str)})
        xs = [categories.index(v) if isinstance(v, str) else float(v) for v in values]
        log_x = bool(self.running_spec and key in self.running_spec.space
                     and self.running_spec.space[key].kind.startswith("log") and all(x > 0 for x in xs))
        self.scatter_plot.getPlotItem().setLogMode(x=log_x, y=False)
        self.scatter_plot.getPlotItem().setLabel("bottom", key + (" (" + ", ".join(categories) + ")" if categories else ""))
        spots = [{"pos": (math.log10(x) if log_x else x, t.best_heldout), "brush": pg.mkBrush(*STATUS_COLORS[t.status]),
                  "pen": None, "data": t.trial} for x, t in zip(xs, trials)]
        self.scatter.setData(spots)

    def scatter_points(self) -> list[tuple[float, float]]:
        """The scatter's points (x as plotted, best held-out loss)."""
        return [tuple(p.pos()) for p in self.scatter.points()]


def summary(spec: SweepSpec) -> str:
    trials = space_size(spec) or spec.trials
    s = spec.scheduler
    stopping = (f"ASHA on the held-out loss by {s.time_attr.value.replace('_', ' ')}" if s.kind == "asha"
                else "no early stopping")
    budget = f", at most {spec.time_budget_s:g} s" if spec.time_budget_s else ""
    fields = ", ".join(spec.space) or "nothing sampled"
    dataset = spec.dataset or "names.txt (shipped)"
    return (f"{trials} trials of {fields}: {spec.search.value} search, {stopping}{budget}; "
            f"{spec.cpus_per_trial} CPU per trial; dataset {dataset}")


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
