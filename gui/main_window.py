"""The main window: settings on the left, the live loss plot and the samples
on the right, controls, progress and status bar. It starts and ends runs
(gui.worker.Session) and shows what the worker reports; the run's state
(step, losses, parameters) stays with the worker's backend.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
from PySide6.QtCore import QSettings, Qt, Signal, Slot
from PySide6.QtGui import QIcon, QKeySequence
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QLabel, QMainWindow, QProgressBar,
                               QPushButton, QScrollArea, QSplitter, QVBoxLayout, QWidget)

import engine

from . import worker as w
from .config_panel import ConfigPanel
from .dialogs import DefaultDatasetDownload, show_message_box
from .file_actions import FileActions
from .loss_plot import LossPlot
from .sample_panel import SamplePanel

ORGANIZATION, APPLICATION = "microgpt-gui", "microgpt-gui"
SETTINGS_ENV = "MICROGPT_GUI_SETTINGS"  # an .ini path that replaces the user's settings
RESOURCES = Path(__file__).resolve().parent.parent / "resources"
ACTIVE = (w.RUNNING, w.PAUSED)
IDLE = ("none", w.DONE, w.FAILED)  # no run going: settings are editable and Train starts one


def open_settings() -> QSettings:
    path = os.environ.get(SETTINGS_ENV)
    return QSettings(path, QSettings.IniFormat) if path else QSettings(ORGANIZATION, APPLICATION)


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class MainWindow(FileActions, QMainWindow):
    stateChanged = Signal(str)     # the worker's state, or "none" with no run
    datasetChanged = Signal(str)   # path of the dataset now in use
    messageShown = Signal(str, str)  # kind ("error", "warning", "info"), text

    def __init__(self, data_path: str | os.PathLike | None = None, parent=None):
        super().__init__(parent)
        self.setWindowTitle("microgpt-gui")
        self.setWindowIcon(QIcon(str(RESOURCES / "icon.svg")))
        self.corpus: engine.Corpus | None = None
        self.dataset_path: str | None = None
        self.session: w.Session | None = None
        self.run_info: w.RunInfo | None = None
        self.state = "none"
        self.messages: list[tuple[str, str, str]] = []  # (kind, title, text), newest last
        self.message_hook = show_message_box             # replaceable, e.g. by tests
        self._rate: float | None = None
        self._rate_mark: tuple[float, int] | None = None
        self._download: DefaultDatasetDownload | None = None

        self._build_ui()
        self._build_menus()
        self.settings = open_settings()
        self._restore_settings()
        self._update_controls()
        if data_path is not None:
            self.open_dataset(str(data_path))
        else:
            self._start_default_dataset()

    # layout -----------------------------------------------------------------
    def _build_ui(self) -> None:
        self.config_panel = ConfigPanel()
        self.train_button = QPushButton("Train", objectName="trainButton")
        self.stop_button = QPushButton("Stop", objectName="stopButton")
        self.reset_button = QPushButton("Reset", objectName="resetButton")
        self.train_button.setShortcut(QKeySequence("F5"))
        self.stop_button.setShortcut(QKeySequence("Shift+F5"))
        self.reset_button.setShortcut(QKeySequence("Ctrl+R"))
        self.stop_button.setToolTip("Stop the run (Shift+F5); you can still sample and save")
        self.reset_button.setToolTip("Forget the run and clear the plot (Ctrl+R)")
        buttons = QHBoxLayout()
        for button in (self.train_button, self.stop_button, self.reset_button):
            buttons.addWidget(button)
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.addWidget(self.config_panel)
        left_layout.addLayout(buttons)
        left_layout.addStretch(1)
        scroll = QScrollArea(widgetResizable=True, objectName="settingsScroll")
        scroll.setWidget(left)
        scroll.setMinimumWidth(300)

        self.loss_plot = LossPlot()
        self.progress_bar = QProgressBar(objectName="progressBar")
        self.progress_bar.setRange(0, 1)
        self.progress_bar.setValue(0)
        self.progress_bar.setFormat("no run")
        self.sample_panel = SamplePanel()
        right = QSplitter(Qt.Vertical)
        top = QWidget()
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(0, 0, 0, 0)
        top_layout.addWidget(self.loss_plot, 1)
        top_layout.addWidget(self.progress_bar)
        right.addWidget(top)
        right.addWidget(self.sample_panel)
        right.setStretchFactor(0, 3)
        right.setStretchFactor(1, 2)
        splitter = QSplitter(Qt.Horizontal, objectName="mainSplitter")
        splitter.addWidget(scroll)
        splitter.addWidget(right)
        splitter.setStretchFactor(1, 1)
        self.setCentralWidget(splitter)

        self.status_labels = {key: QLabel(" ", objectName=f"status_{key}")
                              for key in ("backend", "params", "step", "loss", "smoothed")}
        for label in self.status_labels.values():
            self.statusBar().addPermanentWidget(label)

        self.config_panel.changed.connect(self._update_controls)
        self.config_panel.changed.connect(self._on_config_changed)
        self.config_panel.openDatasetRequested.connect(self.open_dataset)
        self.train_button.clicked.connect(self.train_or_pause)
        self.stop_button.clicked.connect(self.stop)
        self.reset_button.clicked.connect(self.reset)
        self.sample_panel.sampleRequested.connect(self.request_samples)
        self.loss_plot.smoothingChanged.connect(self._update_status)
        self.loss_plot.redrawn.connect(self._on_redrawn)

    # messages ---------------------------------------------------------------
    def show_message(self, kind: str, title: str, text: str, details: str = "") -> None:
        self.messages.append((kind, title, text))
        self.statusBar().showMessage(text.splitlines()[0] if text else "", 15000)
        if self.message_hook is not None:
            self.message_hook(self, kind, title, text, details)
        self.messageShown.emit(kind, text)

    # dataset ----------------------------------------------------------------
    def open_dataset(self, path: str | None = None) -> bool:
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Open dataset", self.dataset_path or "",
                                                  "Text files (*.txt);;All files (*)")
            if not path:
                return False
        try:
            corpus = engine.load_corpus(path)
        except engine.DatasetError as exc:
            self.show_message("error", "Cannot use this dataset", str(exc))
            return False
        self.reset()
        self.corpus, self.dataset_path = corpus, str(path)
        self.config_panel.dataset_path.setText(str(path))
        self._show_dataset_info()
        self.config_panel.set_vocab_size(corpus.vocab_size)
        self.loss_plot.set_vocab_size(corpus.vocab_size)
        self.statusBar().showMessage(f"Dataset {Path(path).name}: {len(corpus):,} documents", 10000)
        self._update_controls()
        self.datasetChanged.emit(str(path))
        return True

    def _show_dataset_info(self, info: w.RunInfo | None = None) -> None:
        if info is not None:
            text = f"{info.num_docs:,} documents, vocabulary {info.vocab_size} (from the checkpoint)"
        elif self.corpus is not None:
            c = self.corpus
            text = f"{len(c):,} documents, vocabulary {c.vocab_size} ({''.join(c.chars)} + end)"
            try:
                note = c.truncation_note(self.config_panel.model_config().block_size)
            except ValueError:  # no valid block_size yet; the config panel says why
                note = ""
            text += f". Note: {note}." if note else ""
        else:
            text = " "
        self.config_panel.dataset_info.setText(text)

    def _on_config_changed(self) -> None:
        if self.session is None:  # a run shows its own dataset (perhaps a checkpoint's)
            self._show_dataset_info()

    def _start_default_dataset(self) -> None:
        saved = str(self.settings.value("dataset", "") or "")
        if saved and Path(saved).is_file():
            self.open_dataset(saved)
            return
        self.config_panel.dataset_info.setText("Fetching the default dataset (names.txt)...")
        self.progress_bar.setRange(0, 0)  # busy until the size is known
        self.progress_bar.setFormat("downloading names.txt")
        self._download = DefaultDatasetDownload(self)
        self._download.progress.connect(self._on_download_progress)
        self._download.done.connect(self._on_download_done)
        self._download.failed.connect(self._on_download_failed)
        self._download.start()

    @Slot(int, int)
    def _on_download_progress(self, done: int, total: int) -> None:
        if total:
            self.progress_bar.setRange(0, total)
            self.progress_bar.setValue(done)
        self.progress_bar.setFormat(f"downloading names.txt: {done // 1024} KiB")

    @Slot(str)
    def _on_download_done(self, path: str) -> None:
        self._reset_progress()
        if self.corpus is None:  # the user may have opened another file meanwhile
            self.open_dataset(path)

    @Slot(str)
    def _on_download_failed(self, message: str) -> None:
        self._reset_progress()
        if self.corpus is None:
            self.config_panel.dataset_info.setText(
                "The default dataset could not be downloaded. Use <b>Open dataset...</b> "
                "to train on a text file of your own (one name per line).")
            self.show_message("warning", "No dataset", message)

    # runs -------------------------------------------------------------------
    def train_or_pause(self) -> None:
        """Train starts a run; while it runs the same button pauses and resumes."""
        if self.state == w.RUNNING:
            self.session.worker.pause()
        elif self.state in (w.PAUSED, w.READY):
            self.session.worker.resume()
        elif self.state in ("none", w.DONE, w.FAILED, w.CLOSED):
            self.start_run()

    def start_run(self) -> bool:
        problem = self._train_problem()
        if problem:
            self.show_message("warning", "Cannot train", problem)
            return False
        cp = self.config_panel
        spec = w.RunSpec(cp.backend_name(), self.corpus, cp.model_config(), cp.train_config())
        self._start_session(spec)
        return True

    def _start_session(self, spec: w.RunSpec) -> None:
        self._end_session()
        self.loss_plot.clear()
        self.sample_panel.clear()
        self.session = w.Session(spec)
        worker = self.session.worker
        worker.opened.connect(self._on_opened)
        worker.losses.connect(self._on_losses)
        worker.samples.connect(self._on_samples)
        worker.saved.connect(self._on_saved)
        worker.stateChanged.connect(self._on_state)
        worker.status.connect(self._on_status)
        worker.error.connect(self._on_error)
        self._set_state(w.OPENING)
        self.session.start()

    def stop(self) -> None:
        if self.session is not None:
            self.session.worker.stop()

    def reset(self) -> None:
        self._end_session()
        self.run_info = None
        self.loss_plot.clear()
        self.sample_panel.clear()
        self._show_dataset_info()
        self._reset_progress()
        self._set_state("none")

    def _end_session(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            if not session.shutdown():
                self.show_message("warning", "Still busy", "the training thread did not end in time")

    def request_samples(self, num_samples: int, temperature: float, seed: int) -> None:
        if self.session is None or self.state not in w.HAS_MODEL:
            self.show_message("info", "Nothing to sample from", "Train a model or load a checkpoint first.")
            return
        self.session.worker.request_samples(num_samples, temperature, seed)

    def _train_problem(self) -> str:
        if self.corpus is None:
            return "open a dataset first (File > Open dataset...)"
        return self.config_panel.problem()

    def _is_current(self) -> bool:
        """Signals queued by a worker that has since been replaced are ignored."""
        return self.session is not None and self.sender() is self.session.worker

    # worker reports -----------------------------------------------------------
    @Slot(object)
    def _on_opened(self, info: w.RunInfo) -> None:
        if not self._is_current():
            return
        self.run_info = info
        self.config_panel.set_configs(info.model, info.train)
        self.config_panel.select_backend(info.backend)
        self.loss_plot.set_vocab_size(info.vocab_size)
        self._show_dataset_info(info if self.session.worker.spec.checkpoint else None)
        self.progress_bar.setRange(0, info.train.num_steps)
        self.progress_bar.setValue(info.step)
        self._update_status()

    @Slot(object, int)
    def _on_losses(self, losses: np.ndarray, first_step: int) -> None:
        if not self._is_current():
            return
        self.loss_plot.append(losses, first_step)  # progress and status follow its redraw
        step, now = first_step + len(losses), time.monotonic()
        if self._rate_mark is not None and now > self._rate_mark[0] and step > self._rate_mark[1]:
            rate = (step - self._rate_mark[1]) / (now - self._rate_mark[0])
            self._rate = rate if self._rate is None else 0.8 * self._rate + 0.2 * rate
        if self.state == w.RUNNING:
            self._rate_mark = (now, step)

    def _on_redrawn(self) -> None:
        if self.run_info is not None and self.state != w.OPENING:
            self.progress_bar.setValue(self.loss_plot.series.n)
            self._update_progress_text()
        self._update_status()

    @Slot(list, int)
    def _on_samples(self, names: list, step: int) -> None:
        if self._is_current():
            self.sample_panel.show_samples(names, step)

    @Slot(str)
    def _on_saved(self, path: str) -> None:
        if self._is_current():
            self.statusBar().showMessage(f"Checkpoint saved to {path}", 10000)

    @Slot(str)
    def _on_status(self, text: str) -> None:
        if self._is_current():
            self.statusBar().showMessage(text, 10000)
            if self.state == w.OPENING:
                self.progress_bar.setRange(0, 0)
                self.progress_bar.setFormat(text)

    @Slot(str, str)
    def _on_error(self, message: str, details: str) -> None:
        if self._is_current():
            self.show_message("error", "microgpt-gui", message, details)

    @Slot(str)
    def _on_state(self, state: str) -> None:
        if self._is_current() and state != w.CLOSED:
            self._set_state(state)

    def _set_state(self, state: str) -> None:
        self.state = state
        if state != w.RUNNING:
            self.loss_plot.flush()
        if state == w.RUNNING:
            self._rate_mark = (time.monotonic(), self.progress_bar.value())
        if state == w.FAILED:
            self._reset_progress()
        self._update_progress_text()
        self._update_controls()
        messages = {w.RUNNING: "Training...", w.PAUSED: "Paused", w.READY: "Ready to resume training",
                    w.DONE: "Run ended: you can sample, save a checkpoint, or train again"}
        if state in messages:
            self.statusBar().showMessage(messages[state], 0 if state != w.RUNNING else 5000)
        self.stateChanged.emit(state)

    # display ----------------------------------------------------------------
    def _update_controls(self) -> None:
        state, problem = self.state, self._train_problem()
        labels = {w.RUNNING: "Pause", w.PAUSED: "Resume", w.READY: "Resume", w.OPENING: "Opening..."}
        self.train_button.setText(labels.get(state, "Train"))
        can_start = state in IDLE and not problem
        self.train_button.setEnabled(state in (w.RUNNING, w.PAUSED, w.READY) or can_start)
        self.train_button.setToolTip(problem if state in IDLE and problem
                                     else "Start, pause or resume training (F5)")
        self.stop_button.setEnabled(state in ACTIVE)
        self.reset_button.setEnabled(self.session is not None or self.loss_plot.series.n > 0)
        has_model = state in w.HAS_MODEL
        self.sample_panel.sample_button.setEnabled(has_model)
        self.save_action.setEnabled(has_model)
        self.config_panel.set_editable(state in IDLE)

    def _update_progress_text(self) -> None:
        if self.run_info is None or self.state == w.OPENING:
            return
        step, total = self.progress_bar.value(), self.progress_bar.maximum()
        text = f"{step:,} / {total:,} steps"
        if self.state == w.RUNNING and self._rate:
            text += f"  ·  {self._rate:,.0f} steps/s  ·  ETA {format_duration((total - step) / self._rate)}"
        elif self.state in (w.PAUSED, w.DONE, w.READY):
            text += {w.PAUSED: "  ·  paused", w.DONE: "  ·  done" if step >= total else "  ·  stopped",
                     w.READY: "  ·  ready"}[self.state]
        self.progress_bar.setFormat(text)

    def _reset_progress(self) -> None:
        self.progress_bar.setRange(0, 1)
        self.progress_bar.setValue(0)
        self.progress_bar.setFormat("no run")
        self._rate = self._rate_mark = None

    def _update_status(self, *_) -> None:
        info, labels = self.run_info, self.status_labels
        labels["backend"].setText(f"Backend: {info.backend if info else self.config_panel.backend_name()}")
        labels["params"].setText(f"Params: {info.num_params:,}" if info else "Params: -")
        total = info.train.num_steps if info else 0
        labels["step"].setText(f"Step {self.loss_plot.series.n:,} / {total:,}" if info else "Step -")
        last = self.loss_plot.last()
        labels["loss"].setText(f"Loss {last[0]:.4f}" if last else "Loss -")
        labels["smoothed"].setText(f"Smoothed {last[1]:.4f}" if last else "Smoothed -")

    def closeEvent(self, event) -> None:
        self.save_settings()
        self._end_session()
        super().closeEvent(event)
