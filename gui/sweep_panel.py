"""The Sweep tab: a sweep file edited as text (checked as it is typed), where
it runs (this machine, or a Ray cluster's address), Start, Stop (the sweep or
one trial) and Resume; every trial live in gui.sweep_trials' view (a
sortable table, a plot of every trial's curve coloured by its status, a
scatter of one setting against the best held-out loss). A trial's checkpoint
loads into the window (Load trial), where it samples and trains on like any
run; each trial is also a run of the Runs tab (runAdded / runChanged /
runEnded).

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
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (QComboBox, QFileDialog, QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit, QPushButton,
                               QSplitter, QVBoxLayout, QWidget)

from engine.data.corpus import user_data_dir
from engine.sweep import launch
from engine.sweep.connect import RAY_MISSING, SweepError, check_address
from engine.sweep.events import SPEC_FILE, SweepStatus, SweepTable, TrialRecord, TrialStatus
from engine.sweep.spec import EXAMPLES, SweepSpec, SweepSpecError, examples, parse_spec, run_configs, space_size
from engine.training.heldout import HeldoutPoint
from engine.training.records import RunRecord

from .controls import buddy, column
from .sweep_runner import SweepRunner
from .sweep_trials import SweepTrialsView

RUN_STATUS = {TrialStatus.DONE: "finished", TrialStatus.STOPPED_EARLY: "stopped early",
              TrialStatus.STOPPED: "stopped", TrialStatus.DIVERGED: "diverged", TrialStatus.FAILED: "failed"}
CHECK_MS = 300    # the sweep file is checked this long after the last keystroke


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

        self.trials = SweepTrialsView()
        self.trials.trial_table.itemSelectionChanged.connect(self._update_buttons)
        self.trials.trial_table.itemDoubleClicked.connect(lambda *_: self.load_selected())
        self.trials.stop_trial_button.clicked.connect(self.stop_selected)
        self.trials.load_button.clicked.connect(self.load_selected)

        splitter = QSplitter(Qt.Horizontal)
        splitter.addWidget(left)
        splitter.addWidget(self.trials)
        splitter.setStretchFactor(0, 2)
        splitter.setStretchFactor(1, 3)
        layout = QVBoxLayout(self)
        layout.addWidget(splitter)

        self._check_timer = QTimer(self, singleShot=True, interval=CHECK_MS)
        self._check_timer.timeout.connect(self.check_spec)

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
        record = self.trials.selected_trial()
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
        self.runs, self._run_seconds = {}, {}
        self.trials.reset(self.table, spec)
        self.status_label.setText(f"Starting the sweep {spec.name} in {folder}...")
        self._update_buttons()

    # the runner's events --------------------------------------------------------------
    def on_event(self, event: dict) -> None:
        record = self.table.apply(event)
        kind = event["event"]
        if record is not None:
            self.trials.show_trial(record)
            self._update_buttons()
            self._update_run(record, event)
        if kind in ("sweep", "trial_started", "trial_ended", "sweep_ended"):
            self._show_status()
        if kind in ("trial_ended", "sweep_ended"):
            self.trials.draw_scatter()

    def _on_ended(self, code: int, message: str) -> None:
        if message and self.table.status == SweepStatus.RUNNING:
            self.table.status, self.table.message = SweepStatus.FAILED, message
        if message:
            self.messageShown.emit("error", "The sweep failed", message)
        for record in self.table.trials.values():
            if not record.status.ended:
                record.status = TrialStatus.STOPPED
                self.trials.show_trial(record)
        self._show_status()
        self.trials.draw_scatter()
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

    def load_selected(self) -> None:
        record = self.trials.selected_trial()
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
        record = self.trials.selected_trial()
        self.trials.stop_trial_button.setEnabled(running and record is not None
                                                 and record.status == TrialStatus.RUNNING)
        self.trials.load_button.setEnabled(record is not None and bool(record.checkpoint))

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
