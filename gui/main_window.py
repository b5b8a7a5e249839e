"""The main window: settings on the left, the live loss plot and the samples
on the right, controls, progress and status bar. Runs are started and ended
by gui.run_control (a mixin); files, menus and settings by gui.file_actions.
The run's state (step, losses, parameters) stays with the worker's backend;
the window keeps only what it displays.
"""
from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, Signal, Slot
from PySide6 import QtGui
from PySide6.QtGui import QIcon, QTextDocumentFragment
from PySide6.QtWidgets import (QHBoxLayout, QLabel, QMainWindow, QProgressBar, QPushButton,
                               QScrollArea, QSplitter, QVBoxLayout, QWidget)

import engine

from . import worker as w
from .background import BackgroundCall
from .config_panel import ConfigPanel
from .controls import ElidingStatusBar
from .dialogs import show_message_box
from .explore import ExploreTabs
from .file_actions import FileActions
from .loss_plot import LossPlot
from .run_control import IDLE, STOPPING, RunControl, format_duration
from .sample_panel import SamplePanel
from .sessions import Sessions, exit_now, shorten_gil_switch_interval

ORGANIZATION, APPLICATION = "microgpt-gui", "microgpt-gui"
SETTINGS_ENV = "MICROGPT_GUI_SETTINGS"  # an .ini path that replaces the user's settings
RESOURCES = Path(__file__).resolve().parent.parent / "resources"
STATUS_MS = 15000  # how long a message stays in the status bar


def open_settings() -> QSettings:
    path = os.environ.get(SETTINGS_ENV)
    return QSettings(path, QSettings.IniFormat) if path else QSettings(ORGANIZATION, APPLICATION)


def plain_text(text: str) -> str:
    """Rich text (as message boxes take it) as plain text, for the status bar."""
    return QTextDocumentFragment.fromHtml(text).toPlainText() if QtGui.Qt.mightBeRichText(text) else text


def read_corpus(path: str) -> engine.Corpus:
    """The dataset, with its token arrays built (a Python loop over every document:
    done here, off the GUI thread, not at the window's first look at it)."""
    corpus = engine.load_corpus(path)
    corpus.arrays  # noqa: B018  (a cached property: built once, here)
    return corpus


class MainWindow(RunControl, FileActions, ExploreTabs, QMainWindow):
    stateChanged = Signal(str)     # the run's state, "none" with no run, "stopping" while one ends
    datasetChanged = Signal(str)   # path of the dataset now in use
    messageShown = Signal(str, str)  # kind ("error", "warning", "info"), text
    exported = Signal(str)         # path of a file export_csv wrote
    closed = Signal()              # the window has closed (after its worker finished)

    def __init__(self, data_path: str | os.PathLike | None = None, parent=None):
        super().__init__(parent)
        shorten_gil_switch_interval()  # datasets are read, runs trained, in other threads
        self.setWindowTitle("microgpt-gui")
        self.setWindowIcon(QIcon(str(RESOURCES / "icon.svg")))
        self.corpus: engine.Corpus | None = None
        self.dataset_path: str | None = None
        self.sessions = Sessions(self)
        self.run_info: w.RunInfo | None = None
        self.state = "none"
        self.messages: list[tuple[str, str, str]] = []  # (kind, title, text), newest last
        self.message_hook = show_message_box             # replaceable, e.g. by tests
        self.exit_hook = exit_now  # called if a closed window's worker outlasts END_BOUND_S
        self._dataset_read: BackgroundCall | None = None  # the latest Open dataset, until it reports

        self.setStatusBar(ElidingStatusBar())  # before anything shows a message
        self._build_ui()
        self._init_run_control()
        self._build_menus()
        self.settings = open_settings()
        self._restore_settings()
        self._update_controls()
        self._update_status()
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
        self.sample_panel = SamplePanel()
        right = QSplitter(Qt.Vertical, objectName="trainingPage")
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
        splitter.addWidget(self._build_tabs(right))
        splitter.setStretchFactor(1, 1)
        self.setCentralWidget(splitter)
        self._reset_progress()

        self.status_labels = {key: QLabel(" ", objectName=f"status_{key}")
                              for key in ("backend", "params", "step", "loss", "smoothed")}
        for label in self.status_labels.values():
            self.statusBar().addPermanentWidget(label)

        self.config_panel.changed.connect(self._update_controls)
        self.config_panel.changed.connect(self._on_config_changed)
        self.config_panel.openDatasetRequested.connect(self.open_dataset)
        self.loss_plot.smoothingChanged.connect(self._update_status)
        self.loss_plot.redrawn.connect(self._on_redrawn)

    # messages ---------------------------------------------------------------
    def show_message(self, kind: str, title: str, text: str, details: str = "", status: str = "") -> None:
        """A message box (through message_hook) and a plain-text line in the status bar
        (`status`, or the text's first line)."""
        self.messages.append((kind, title, text))
        lines = [line for line in plain_text(status or text).splitlines() if line.strip()]
        self.statusBar().showMessage(lines[0] if lines else "", STATUS_MS)
        shown = self.statusBar().currentMessage()
        box = self.message_hook(self, kind, title, text, details) if self.message_hook is not None else None
        if hasattr(box, "finished"):  # the box read and closed: its line leaves the status bar too
            box.finished.connect(lambda *_: self.statusBar().currentMessage() == shown
                                 and self.statusBar().clearMessage())
        self.messageShown.emit(kind, text)

    # dataset ----------------------------------------------------------------
    def open_dataset(self, path: str | None = None) -> bool:
        """Start reading a dataset (off the GUI thread); True when a read started.
        datasetChanged follows when it is in use, or an error message."""
        if path is None:
            path = self._ask_open_path("Open dataset", self.dataset_path or "", "Text files (*.txt);;All files (*)")
            if not path:
                return False
        path = str(path)
        self._dataset_read = BackgroundCall("read-dataset", read_corpus, path, parent=self)
        self._dataset_read.done.connect(self._on_dataset_read)
        self._dataset_read.failed.connect(self._on_dataset_failed)
        self._dataset_read.start()
        self.config_panel.dataset_info.setText(f"Reading {Path(path).name}...")
        self._update_controls()
        return True

    @property
    def reading_dataset(self) -> bool:
        return self._dataset_read is not None

    def _on_dataset_read(self, call: BackgroundCall, corpus: engine.Corpus) -> None:
        if call is not self._dataset_read:
            return  # a later Open dataset superseded this one
        path, self._dataset_read = call.args[0], None
        self.reset()  # a run belongs to its dataset
        self.corpus, self.dataset_path = corpus, path
        self.config_panel.set_dataset_path(path)
        self._show_dataset_info()
        self.config_panel.set_vocab_size(corpus.vocab_size)
        self.loss_plot.set_vocab_size(corpus.vocab_size)
        self.statusBar().showMessage(f"Dataset {Path(path).name}: {len(corpus):,} documents", 10000)
        self._update_controls()
        self._update_status()
        self.datasetChanged.emit(path)

    def _on_dataset_failed(self, call: BackgroundCall, exc: Exception) -> None:
        if call is not self._dataset_read:
            return
        path, self._dataset_read = call.args[0], None
        message = str(exc) if isinstance(exc, engine.DatasetError) else f"cannot read {path}: {exc}"
        self._show_dataset_info()
        self._update_controls()
        self.show_message("error", "Cannot use this dataset", message)

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
        if self.session is None and self._dataset_read is None:  # a run shows its own dataset
            self._show_dataset_info()
        self._update_status()

    def _start_default_dataset(self) -> None:
        """The dataset used last, else makemore's names.txt shipped with the package."""
        saved = str(self.settings.value("dataset", "") or "")
        if saved and Path(saved).is_file():
            self.open_dataset(saved)
            return
        try:
            self.open_dataset(str(engine.default_dataset_path()))
        except engine.DatasetError as exc:  # a damaged installation
            self.config_panel.dataset_info.setText(f"{exc}. Use Open dataset... to choose a text file.")
            self.show_message("error", "No dataset", str(exc),
                              status="No dataset: names.txt is damaged (see the Dataset box); "
                                     "use File > Open dataset...")

    # display ----------------------------------------------------------------
    def _update_controls(self) -> None:
        state, problem = self.state, self._train_problem()
        self._update_run_actions(state, problem)
        has_model = state in w.HAS_MODEL
        self.save_action.setEnabled(has_model)
        self.config_panel.set_editable(state in IDLE or state == STOPPING)

    def _update_progress_text(self) -> None:
        if self.state == STOPPING:
            waiting = self.sessions.waiting_for()
            self.progress_bar.setFormat("stopping…" + (f" (waiting for: {waiting})" if waiting else ""))
            return
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
        params = info.num_params if info else self.config_panel.num_params()
        labels["params"].setText(f"Params: {params:,}" if params else "Params: -")
        total = info.train.num_steps if info else 0
        labels["step"].setText(f"Step {self.loss_plot.series.n:,} / {total:,}" if info else "Step -")
        last = self.loss_plot.last()
        labels["loss"].setText(f"Loss {last[0]:.4f}" if last else "Loss -")
        labels["smoothed"].setText(f"Smoothed {last[1]:.4f}" if last else "Smoothed -")
