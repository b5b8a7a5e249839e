"""The main window: settings on the left, the live loss plot and the samples
on the right, controls, progress and status bar. It holds the application
model (engine.app.AppModel: dataset, settings, backend choice and the run's
model, engine.training.run_model.RunModel) and the controllers that observe
it and send it commands, each given what it uses: gui.settings_control (the
settings column), gui.run_control (runs and the worker's events),
gui.dataset_control (the dataset), gui.file_actions (files and the File and
Help menus) and gui.explore (the explore tabs). The run's state (step, losses, parameters)
stays with the worker's backend; the window keeps only what it displays.

Closing asks the save question first when a trained model would be lost;
then the window closes at once, or, when a checkpoint asked for is still to
be written, hides at once and closes once it is, giving up after
sessions.END_BOUND_S (exit_hook) only while the worker is inside another
call. Messages after the close is decided go to stderr. Nothing waits on the
GUI thread.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from PySide6.QtCore import QSettings, QTimer, Qt, Signal
from PySide6 import QtGui
from PySide6.QtGui import QIcon, QTextDocumentFragment
from PySide6.QtWidgets import (QFileDialog, QGridLayout, QLabel, QMainWindow, QProgressBar, QPushButton,
                               QScrollArea, QSplitter, QVBoxLayout, QWidget)

import engine
from engine.app import AppModel
from engine.training.run_model import Phase, RunModel

from . import sessions as sessions_module
from .config_panel import ConfigPanel
from .controls import ElidingStatusBar
from .dataset_control import DatasetController
from .dialogs import show_message_box
from .explore import ExploreController
from .file_actions import FileController
from .loss_plot import LossPlot
from .plot_axes import epoch_text, names_seen
from .run_control import Notifier, RunController, RunWidgets
from .sample_panel import SamplePanel
from .sessions import Sessions, exit_now, shorten_gil_switch_interval
from .settings_control import SettingsController

ORGANIZATION, APPLICATION = "microgpt-gui", "microgpt-gui"
SETTINGS_ENV = "MICROGPT_GUI_SETTINGS"  # an .ini path that replaces the user's settings
RESOURCES = Path(__file__).resolve().parent.parent / "resources"
STATUS_MS = 15000  # how long a message stays in the status bar
SAVES_POLL_MS = 100  # a closed window waiting for checkpoints looks this often


def open_settings() -> QSettings:
    path = os.environ.get(SETTINGS_ENV)
    return QSettings(path, QSettings.IniFormat) if path else QSettings(ORGANIZATION, APPLICATION)


def plain_text(text: str) -> str:
    """Rich text (as message boxes take it) as plain text, for the status bar."""
    return QTextDocumentFragment.fromHtml(text).toPlainText() if QtGui.Qt.mightBeRichText(text) else text


class MainWindow(QMainWindow):
    stateChanged = Signal(str)     # the run's phase (engine.training.run_model.Phase's value)
    datasetChanged = Signal(str)   # path of the dataset now in use
    messageShown = Signal(str, str)  # kind ("error", "warning", "info"), text
    exported = Signal(str)         # path of a file export_csv wrote
    closed = Signal()              # the window has closed (after its worker finished)

    def __init__(self, data_path: str | os.PathLike | None = None, parent=None):
        super().__init__(parent)
        shorten_gil_switch_interval()  # datasets are read, runs trained, in other threads
        self.setWindowTitle("microgpt-gui")
        self.setWindowIcon(QIcon(str(RESOURCES / "icon.svg")))
        self.app = AppModel()
        self.run = self.app.run
        self.sessions = Sessions(self)
        self.messages: list[tuple[str, str, str]] = []  # (kind, title, text), newest last
        self.message_hook = show_message_box             # replaceable, e.g. by tests
        self.exit_hook = exit_now  # called if a closed window's worker outlasts END_BOUND_S
        self._closing = False      # the close is decided: the window hides, then closes
        self._closed = False       # `closed` was emitted
        self._exit_timer = QTimer(self, singleShot=True)
        self._exit_timer.timeout.connect(self._give_up_waiting)
        # a hidden window waiting for checkpoints closes once they are written (the worker
        # reports nothing more after its end)
        self._saves_timer = QTimer(self, interval=SAVES_POLL_MS)
        self._saves_timer.timeout.connect(lambda: self.sessions.saves_pending() or self.close())

        self.setStatusBar(ElidingStatusBar())  # before anything shows a message
        self._build_ui()
        self._build_controllers()
        self.settings = open_settings()
        self._restore_settings()
        self.run.subscribe(self._on_model)
        self.runs.update_actions()
        self._update_status()
        if data_path is not None:
            self.open_dataset(str(data_path))
        else:
            self.datasets.start_default(str(self.settings.value("dataset", "") or ""))

    # layout -----------------------------------------------------------------
    def _build_ui(self) -> None:
        self.config_panel = ConfigPanel(backends=self.app.backends)
        self.train_button = QPushButton("Train", objectName="trainButton")
        self.stop_button = QPushButton("Stop", objectName="stopButton")
        self.reset_button = QPushButton("Reset", objectName="resetButton")
        buttons = QGridLayout()  # Train on a row of its own: "Continue to 1,000,000 steps" is long
        buttons.addWidget(self.train_button, 0, 0, 1, 2)
        buttons.addWidget(self.stop_button, 1, 0)
        buttons.addWidget(self.reset_button, 1, 1)
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
        self._training_page = right
        self._splitter = splitter
        self.setCentralWidget(splitter)

        self.status_labels = {key: QLabel(" ", objectName=f"status_{key}")
                              for key in ("backend", "params", "step", "loss", "smoothed", "heldout")}
        for label in self.status_labels.values():
            self.statusBar().addPermanentWidget(label)

        self.app.subscribe(lambda app, change, subject: self._update_status())  # settings, backend, dataset
        self.config_panel.openDatasetRequested.connect(self.open_dataset)
        # the smoothed loss shown follows the redraw that a new smoothing ends in, not the slider
        self.loss_plot.redrawn.connect(self._update_status)

    def _build_controllers(self) -> None:
        notify = Notifier(self.show_message, lambda text, ms: self.statusBar().showMessage(text, ms))
        widgets = RunWidgets(self.config_panel, self.train_button, self.stop_button, self.reset_button,
                             self.progress_bar, self.loss_plot, self.sample_panel)
        ask_save_path = lambda: self.files.ask_save_path()  # noqa: E731  (files is made below)
        self.settings_control = SettingsController(self, self.app, self.config_panel, notify)
        self.runs = RunController(self, self.app, self.sessions, widgets, notify, ask_save_path)
        self.datasets = DatasetController(self, self.app, self.runs, self.config_panel, self.loss_plot,
                                          notify, self._ask_open_path)
        self.datasets.changed.connect(self.datasetChanged)
        self.explore = ExploreController(self, self.app, self.runs.send, self._training_page, self.loss_plot,
                                         self.sample_panel, notify, lambda: self.app.dataset.path,
                                         lambda: self.session.worker.step if self.session else 0)
        x = self.explore  # its widgets, by the window's names for them
        self.tabs, self.run_list, self.inspect_hub = x.tabs, x.run_list, x.inspect_hub
        self.next_char_panel, self.attention_panel, self.char_map_panel = (
            x.next_char_panel, x.attention_panel, x.char_map_panel)
        self.datasets.changed.connect(lambda path: self.explore.run_list.set_reference_dataset(
            self.datasets.identity.content_hash))
        self._splitter.addWidget(self.explore.tabs)
        self._splitter.setStretchFactor(1, 1)
        self.files = FileController(self, self.app, self.runs, self.datasets, self.loss_plot, notify,
                                    self._ask_open_path)
        self.files.exported.connect(self.exported)
        self.files.build_file_menu()
        self.save_action = self.files.save_action
        self.runs.build_menu()
        self.explore.build_menus()
        self.files.build_help_menu()

    # messages ---------------------------------------------------------------
    def show_message(self, kind: str, title: str, text: str, details: str = "", status: str = "") -> None:
        """A message box (through message_hook) and a plain-text line in the status bar
        (`status`, or the text's first line)."""
        self.messages.append((kind, title, text))
        if self._closing:  # the window is going (hidden): a box would go with it unread
            print(f"microgpt-gui: {plain_text(text)}", file=sys.stderr)
            self.messageShown.emit(kind, text)
            return
        lines = [line for line in plain_text(status or text).splitlines() if line.strip()]
        self.statusBar().showMessage(lines[0] if lines else "", STATUS_MS)
        shown = self.statusBar().message()
        box = self.message_hook(self, kind, title, text, details) if self.message_hook is not None else None
        if hasattr(box, "finished"):  # the box read and closed: its line leaves the status bar too
            box.finished.connect(lambda *_: self.statusBar().message() == shown
                                 and self.statusBar().clearMessage())
        self.messageShown.emit(kind, text)

    # the model ----------------------------------------------------------------------
    def _on_model(self, run: RunModel, what: str) -> None:
        if what == "step":
            return  # the status follows the plot's redraws
        if what == "phase":
            self.stateChanged.emit(run.phase.value)
        elif what == "run" and run.dataset is not None:
            self.explore.run_list.set_reference_dataset(run.dataset.content_hash)
        self._update_status()

    # what tests, scripts and the app use: the controllers' actions -------------------
    @property
    def state(self) -> Phase:
        return self.run.phase

    @property
    def session(self):
        """The current run's Session (None with no run; ended runs are not current)."""
        return self.sessions.current

    @property
    def corpus(self) -> engine.Corpus | None:
        return self.datasets.corpus

    @property
    def dataset_path(self) -> str | None:
        return self.datasets.path

    @property
    def reading_dataset(self) -> bool:
        return self.datasets.reading

    @property
    def ask_before_discarding(self) -> bool:
        return self.files.ask_action.isChecked()

    @ask_before_discarding.setter
    def ask_before_discarding(self, on: bool) -> None:
        self.files.ask_action.setChecked(on)

    def open_dataset(self, path: str | None = None) -> bool:
        return self.datasets.open(path)

    def start_run(self) -> bool:
        return self.runs.start_run()

    def train_or_pause(self) -> None:
        self.runs.train_or_pause()

    def stop(self) -> None:
        self.runs.stop()

    def reset(self) -> None:
        self.runs.reset()

    def request_samples(self, num_samples: int, temperature: float, seed: int,
                        max_length: int | None = None) -> None:
        self.runs.request_samples(num_samples, temperature, seed, max_length)

    def save_checkpoint(self, path: str | None = None) -> None:
        self.files.save_checkpoint(path)

    def load_checkpoint(self, path: str | None = None) -> None:
        self.files.load_checkpoint(path)

    def export_csv(self, path: str | None = None) -> None:
        self.files.export_csv(path)

    def export_png(self, path: str | None = None) -> None:
        self.files.export_png(path)

    def show_about(self) -> None:
        self.files.show_about()

    def show_scaling_study(self):
        return self.explore.show_scaling_study()

    def _train_problem(self) -> str:
        return self.runs.train_problem()

    @property
    def scaling_dialog(self):
        return self.explore.scaling_dialog

    def _ask_open_path(self, title: str, folder: str, filters: str) -> str:
        path, _ = QFileDialog.getOpenFileName(self, title, folder, filters)
        return path

    # closing ----------------------------------------------------------------------
    def closeEvent(self, event) -> None:
        if not self._closing:
            if self.runs.guard.needed() or self.runs.guard.busy:  # ask first; the answer closes
                event.ignore()
                self.runs.guard.confirm("Quitting", self.close_without_asking)
                return
            self._begin_closing()
        if self.sessions.saves_pending():  # hide now, close when the checkpoints asked for are written
            event.ignore()
            self.hide()
            self._saves_timer.start()
            if not self._exit_timer.isActive():
                self._exit_timer.start(int(1000 * sessions_module.END_BOUND_S))
            return
        self._saves_timer.stop()
        # nothing left to write: closed now, though a worker may still be finishing its call (the
        # app then exits without waiting for it: gui.app.leave)
        self._exit_timer.stop()
        super().closeEvent(event)
        if not self._closed:
            self._closed = True
            self.closed.emit()

    def close_without_asking(self) -> bool:
        """Close now, whatever is unsaved (after the question's answer, or when the
        app's event loop has ended and nobody can answer)."""
        if not self._closing:
            self._begin_closing()
        return self.close()

    def _begin_closing(self) -> None:
        self._closing = True
        self.runs.guard.forget()  # nothing is asked after the window is gone
        self.save_settings()
        self.explore.close()
        self.files.forget_reads()
        self.datasets.forget_read()
        self.sessions.allEnded.connect(self.close)
        self.runs.end_run()

    def _give_up_waiting(self) -> None:
        if self.sessions.saving():  # a checkpoint being written is never given up on
            self._exit_timer.start(int(1000 * sessions_module.END_BOUND_S))
            return
        if self.sessions.saves_pending():  # stuck in another call before them: said, not silent
            self.exit_hook(f"the training thread is still busy ({self.sessions.waiting_for() or 'ending'}) "
                           f"{sessions_module.END_BOUND_S:g} s after the window was closed; exiting without "
                           "waiting for it: the checkpoints asked for after its call are not written")

    # settings ---------------------------------------------------------------------
    def _restore_settings(self) -> None:
        s = self.settings
        geometry = s.value("geometry")
        if geometry is not None:
            self.restoreGeometry(geometry)
        else:
            self.resize(1200, 760)
        self.config_panel.restore_settings(s)
        self.sample_panel.set_temperature(float(s.value("sampling/temperature", 0.5)))
        self.sample_panel.count_spin.setValue(int(s.value("sampling/count", 10)))
        self.loss_plot.smoothing_slider.setValue(int(s.value("plot/smoothing", 950)))
        self.loss_plot.set_log_y(str(s.value("plot/log_y", "false")).lower() == "true")
        self.loss_plot.set_x_axis(str(s.value("plot/x_axis", "step")))
        self.ask_before_discarding = str(s.value("runs/ask_to_save", "true")).lower() == "true"
        try:
            self.files.set_autosave_minutes(int(s.value("runs/autosave_minutes", 0)))
            self.tabs.setCurrentIndex(int(s.value("view/tab", 0)))  # out of range: stays on Training
        except (TypeError, ValueError):
            pass

    def save_settings(self) -> None:
        s = self.settings
        s.setValue("geometry", self.saveGeometry())
        if self.dataset_path:
            s.setValue("dataset", self.dataset_path)
        self.config_panel.save_settings(s)
        s.setValue("sampling/temperature", self.sample_panel.temperature)
        s.setValue("sampling/count", self.sample_panel.count_spin.value())
        s.setValue("plot/smoothing", self.loss_plot.smoothing_slider.value())
        s.setValue("plot/log_y", self.loss_plot.log_y.isChecked())
        s.setValue("plot/x_axis", self.loss_plot.x_axis)
        s.setValue("runs/ask_to_save", self.ask_before_discarding)
        s.setValue("runs/autosave_minutes", self.files.autosave_minutes)
        s.setValue("view/tab", self.tabs.currentIndex())
        s.sync()

    # display ----------------------------------------------------------------------
    def _update_status(self, *_) -> None:
        run, labels = self.run, self.status_labels
        has_run = run.train is not None and run.phase != Phase.OPENING
        labels["backend"].setText(f"Backend: {run.backend if has_run else self.app.backend_label()}")
        settings, vocab = self.app.settings, self.app.vocab_size
        params = (run.model.num_params(run.dataset.vocab_size) if has_run and run.dataset
                  else settings.model.num_params(vocab) if settings.model is not None and vocab else None)
        labels["params"].setText(f"Params: {params:,}" if params else "Params: -")
        labels["step"].setText(f"Step {self.loss_plot.series.n:,} / {run.train.num_steps:,}" if has_run
                               else "Step -")
        plot = self.loss_plot
        # the epoch once it says something; names seen in the tooltip (the progress bar shows both)
        epoch = epoch_text(plot.series.n, plot.batch_size, plot.train_docs) if has_run else ""
        if epoch:
            labels["step"].setText(labels["step"].text() + f" · {epoch}")
        names = names_seen(plot.series.n, plot.batch_size)
        labels["step"].setToolTip(f"{names:,} names seen (step x batch size {plot.batch_size})" if has_run else "")
        last = plot.last()
        labels["loss"].setText(f"Loss {last[0]:.4f}" if last else "Loss -")
        labels["smoothed"].setText(f"Smoothed {last[1]:.4f}" if last else "Smoothed -")
        labels["heldout"].setText(f"Held-out {plot.heldout[-1].loss:.4f}" if plot.heldout else "Held-out -")
