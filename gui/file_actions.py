"""The window's File and Help menus: datasets and checkpoints, exports, the
save question's and autosave's settings, About.

A FileController is given the run controller, the dataset controller and the
widgets it exports from. Files are read and written off the GUI thread
(gui.background): a checkpoint is read and checked before the current run is
touched (and, after the save question, replaces it), and every way reading
it can fail is a message. Exports take the window's own display copy of the
losses, never the worker's state.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QFileDialog, QMainWindow

import engine
from engine.app import AppModel, Change
from engine.training import protocol as rs
from engine.training.records import write_loss_csv

from .background import Background, run_in_background
from .dataset_control import DatasetController
from .dialogs import about_html
from .loss_plot import LossPlot
from .run_control import RunController

AUTOSAVE_CHOICES = (0, 5, 10, 30)  # minutes of training between autosaves (0: off)


def standard_keys(key: QKeySequence.StandardKey, fallback: str) -> list[QKeySequence]:
    """The platform's keys for a standard action, or fallback where it defines none
    (Qt's offscreen and some minimal platforms have no key for Quit)."""
    return QKeySequence.keyBindings(key) or [QKeySequence(fallback)]


def read_checkpoint(path: str):
    """engine.read_checkpoint, looked up when called (tests replace it)."""
    return engine.read_checkpoint(path)


class FileController(QObject):
    exported = Signal(str)  # path of a file export_csv wrote

    def __init__(self, host: QMainWindow, app: AppModel, runs: RunController, datasets: DatasetController,
                 loss_plot: LossPlot, notify, ask_open_path: Callable[..., str]):
        super().__init__(host)
        self._host, self.runs, self.datasets, self.loss_plot, self.notify = host, runs, datasets, loss_plot, notify
        self.app, self._ask_open_path = app, ask_open_path
        self._checkpoint_read = Background(self, "read-checkpoint", newest_wins=True)  # the latest Load checkpoint, until it reports
        app.subscribe(lambda model, change, subject: change == Change.DISCARD and self.forget_reads())

    def build_file_menu(self) -> None:
        host = self._host

        def action(menu, text, slot, shortcut=None, name=None):
            act = QAction(text, host, objectName=name or "")
            if shortcut is not None:
                act.setShortcuts(shortcut if isinstance(shortcut, list) else [QKeySequence(shortcut)])
            act.triggered.connect(lambda checked=False: slot())
            menu.addAction(act)
            return act

        menu = host.menuBar().addMenu("&File")
        action(menu, "&Open dataset...", self.datasets.open, standard_keys(QKeySequence.Open, "Ctrl+O"),
               "openDatasetAction")
        menu.addSeparator()
        self.save_action = action(menu, "&Save checkpoint...", self.save_checkpoint,
                                  standard_keys(QKeySequence.Save, "Ctrl+S"), "saveCheckpointAction")
        action(menu, "&Load checkpoint...", self.load_checkpoint, "Ctrl+Shift+O", "loadCheckpointAction")
        self.ask_action = QAction("As&k to save before discarding a trained model", host,
                                  objectName="askToSaveAction", checkable=True, checked=True)
        self.ask_action.toggled.connect(lambda on: setattr(self.runs.guard, "enabled", on))
        menu.addAction(self.ask_action)
        autosave_menu = menu.addMenu("A&utosave")
        self.autosave_group = QActionGroup(host)
        for minutes in AUTOSAVE_CHOICES:
            act = QAction(f"Every {minutes} minutes of training" if minutes else "Off", host, checkable=True,
                          objectName=f"autosave{minutes}Action")
            act.setData(minutes)
            act.toggled.connect(lambda on, m=minutes: on and self.runs.autosaver.set_minutes(m))
            self.autosave_group.addAction(act)
            autosave_menu.addAction(act)
        self.set_autosave_minutes(0)
        menu.addSeparator()
        action(menu, "Export loss as &CSV...", self.export_csv, "Ctrl+E", "exportCsvAction")
        action(menu, "Export plot as &PNG...", self.export_png, "Ctrl+Shift+E", "exportPngAction")
        menu.addSeparator()
        action(menu, "&Quit", host.close, standard_keys(QKeySequence.Quit, "Ctrl+Q"), "quitAction")
        self.runs.run.subscribe(lambda run, what: self.save_action.setEnabled(run.has_model))
        self.save_action.setEnabled(False)

    def build_help_menu(self) -> None:
        help_menu = self._host.menuBar().addMenu("&Help")
        act = QAction("&About microgpt-gui", self._host, objectName="aboutAction")
        act.triggered.connect(lambda checked=False: self.show_about())
        help_menu.addAction(act)

    def set_autosave_minutes(self, minutes: int) -> None:
        chosen = next((a for a in self.autosave_group.actions() if a.data() == minutes), None)
        if chosen is None:  # a hand-edited setting: the nearest choice is not guessed, it is off
            chosen = self.autosave_group.actions()[0]
        chosen.setChecked(True)
        self.runs.autosaver.set_minutes(chosen.data())

    @property
    def autosave_minutes(self) -> int:
        return self.autosave_group.checkedAction().data()

    def show_about(self) -> None:
        run = self.runs.run
        self.notify.show_message("info", "About microgpt-gui",
                                 about_html(run.backend if run.has_model else self.app.backend_label()))

    # checkpoints --------------------------------------------------------------
    def save_checkpoint(self, path: str | None = None) -> None:
        if not self.runs.run.has_model:
            self.notify.show_message("info", "Nothing to save", "Train a model first.")
            return
        if path is None:
            path = self.ask_save_path()
            if not path:
                return
        self.runs.send(rs.Save(str(path)))

    def ask_save_path(self) -> str:
        path, _ = QFileDialog.getSaveFileName(self._host, "Save checkpoint", "microgpt.npz", "Checkpoints (*.npz)")
        return path

    def load_checkpoint(self, path: str | None = None) -> None:
        """Read and check the file off the GUI thread; the current run is ended only
        once it has proved usable (and after the save question)."""
        if path is None:
            path = self._ask_open_path("Load checkpoint", "", "Checkpoints (*.npz);;All files (*)")
            if not path:
                return
        path = str(path)
        self._checkpoint_read.start(read_checkpoint, path,
                                    on_done=lambda checkpoint: self._on_checkpoint_read(path, checkpoint),
                                    on_failed=lambda exc: self._on_checkpoint_failed(path, exc))
        self.notify.status(f"Reading checkpoint {Path(path).name}...", 10000)

    def forget_reads(self) -> None:
        """Reset, a new run or closing: a checkpoint still being read is not loaded."""
        self._checkpoint_read.cancel()

    def _on_checkpoint_read(self, path: str, checkpoint) -> None:
        identity = self.datasets.checkpoint_identity(checkpoint, path)
        self.runs.guard.confirm(f"Loading {Path(path).name}", lambda: self._open_checkpoint(checkpoint, identity, path))

    def _open_checkpoint(self, checkpoint, identity, path: str) -> None:
        spec, lines = self.app.checkpoint_run(checkpoint)  # the backend selected, or auto's for its model
        self.runs.open_run(spec, identity, path)
        if lines[1:]:
            self.notify.status(" ".join(lines[1:]), 0)

    def _on_checkpoint_failed(self, path: str, exc: Exception) -> None:
        if isinstance(exc, engine.CheckpointError):
            message = str(exc)
        elif isinstance(exc, MemoryError):
            message = f"{path}: not enough memory to read this checkpoint"
        elif isinstance(exc, OSError):
            message = f"cannot read {path}: {exc.strerror or exc}"
        else:  # whatever else a damaged file raises from deep inside
            message = f"{path} is not a usable checkpoint ({type(exc).__name__}: {exc})"
        self.notify.show_message("error", "Cannot load this checkpoint", message)

    # exports ------------------------------------------------------------------
    def export_csv(self, path: str | None = None) -> None:
        """step,loss,smoothed,heldout from the plot's own copy; written off the GUI thread (`exported`)."""
        steps, losses, smoothed = self.loss_plot.data()
        heldout = list(self.loss_plot.heldout)
        if not len(losses):
            self.notify.show_message("info", "Nothing to export", "There is no loss history yet.")
            return
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self._host, "Export loss", "loss.csv", "CSV files (*.csv)")
            if not path:
                return
        path = str(path)
        run_in_background(write_loss_csv, path, steps, losses, smoothed, heldout, parent=self, name="export-csv",
                          on_done=self._on_csv_written, on_failed=lambda exc: self._on_csv_failed(path, exc))

    def _on_csv_written(self, path: str) -> None:
        self.notify.status(f"Loss exported to {path}", 10000)
        self.exported.emit(path)

    def _on_csv_failed(self, path: str, exc: Exception) -> None:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        self.notify.show_message("error", "Export failed", f"could not write {path}: {reason}")

    def export_png(self, path: str | None = None) -> None:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self._host, "Export plot", "loss.png", "PNG images (*.png)")
            if not path:
                return
        if not self.loss_plot.plot.grab().save(str(path), "PNG"):
            self.notify.show_message("error", "Export failed", f"could not write {path}")
        else:
            self.notify.status(f"Plot exported to {path}", 10000)

