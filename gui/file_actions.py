"""The window's File and Help menus: checkpoints, exports, About, and the
settings that persist between sessions (QSettings). A mixin of MainWindow.

Files are read and written off the GUI thread (gui.background): a checkpoint
is read and checked before the current run is touched, and every way reading
it can fail is a message. Exports take the window's own display copy of the
losses, never the worker's state.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QFileDialog

import engine
from engine.runs import write_loss_csv

from . import worker as w
from .background import BackgroundCall
from .dialogs import about_html


def standard_keys(key: QKeySequence.StandardKey, fallback: str) -> list[QKeySequence]:
    """The platform's keys for a standard action, or fallback where it defines none
    (Qt's offscreen and some minimal platforms have no key for Quit)."""
    return QKeySequence.keyBindings(key) or [QKeySequence(fallback)]


class FileActions:
    """File menu, Help menu and settings, for MainWindow (which provides the widgets)."""

    def _build_menus(self) -> None:
        def action(menu, text, slot, shortcut=None, name=None):
            act = QAction(text, self, objectName=name or "")
            if shortcut is not None:
                act.setShortcuts(shortcut if isinstance(shortcut, list) else [QKeySequence(shortcut)])
            act.triggered.connect(lambda checked=False: slot())
            menu.addAction(act)
            return act

        file_menu = self.menuBar().addMenu("&File")
        action(file_menu, "&Open dataset...", self.open_dataset, standard_keys(QKeySequence.Open, "Ctrl+O"), "openDatasetAction")
        file_menu.addSeparator()
        self.save_action = action(file_menu, "&Save checkpoint...", self.save_checkpoint,
                                  standard_keys(QKeySequence.Save, "Ctrl+S"), "saveCheckpointAction")
        action(file_menu, "&Load checkpoint...", self.load_checkpoint, "Ctrl+Shift+O", "loadCheckpointAction")
        file_menu.addSeparator()
        action(file_menu, "Export loss as &CSV...", self.export_csv, "Ctrl+E", "exportCsvAction")
        action(file_menu, "Export plot as &PNG...", self.export_png, "Ctrl+Shift+E", "exportPngAction")
        file_menu.addSeparator()
        action(file_menu, "&Quit", self.close, standard_keys(QKeySequence.Quit, "Ctrl+Q"), "quitAction")
        self._build_run_menu()
        self._build_explore_menus()
        help_menu = self.menuBar().addMenu("&Help")
        action(help_menu, "&About microgpt-gui", self.show_about, None, "aboutAction")

    def show_about(self) -> None:
        self.show_message("info", "About microgpt-gui", about_html(self.run_info.backend if self.run_info
                                                                   else self.config_panel.backend_name()))

    # files ------------------------------------------------------------------
    def save_checkpoint(self, path: str | None = None) -> None:
        if self.session is None or self.state not in w.HAS_MODEL:
            self.show_message("info", "Nothing to save", "Train a model first.")
            return
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Save checkpoint", "microgpt.npz", "Checkpoints (*.npz)")
            if not path:
                return
        self.session.worker.request_save(str(path))

    def load_checkpoint(self, path: str | None = None) -> None:
        """Read and check the file off the GUI thread; the current run is ended only
        once it has proved usable."""
        if path is None:
            path = self._ask_open_path("Load checkpoint", "", "Checkpoints (*.npz);;All files (*)")
            if not path:
                return
        self._checkpoint_read = BackgroundCall("read-checkpoint", engine.read_checkpoint, str(path), parent=self)
        self._checkpoint_read.done.connect(self._on_checkpoint_read)
        self._checkpoint_read.failed.connect(self._on_checkpoint_failed)
        self._checkpoint_read.start()
        self.statusBar().showMessage(f"Reading checkpoint {Path(path).name}...", 10000)

    def _on_checkpoint_read(self, call: BackgroundCall, checkpoint) -> None:
        if call is not self._checkpoint_read:
            return  # superseded by a later load, a Reset or closing
        self._checkpoint_read = None
        self._start_session(w.RunSpec(self.config_panel.backend_name(), checkpoint=checkpoint, autostart=False))

    def _on_checkpoint_failed(self, call: BackgroundCall, exc: Exception) -> None:
        if call is not self._checkpoint_read:
            return
        path, self._checkpoint_read = call.args[0], None
        if isinstance(exc, engine.CheckpointError):
            message = str(exc)
        elif isinstance(exc, MemoryError):
            message = f"{path}: not enough memory to read this checkpoint"
        elif isinstance(exc, OSError):
            message = f"cannot read {path}: {exc.strerror or exc}"
        else:  # whatever else a damaged file raises from deep inside
            message = f"{path} is not a usable checkpoint ({type(exc).__name__}: {exc})"
        self.show_message("error", "Cannot load this checkpoint", message)

    def export_csv(self, path: str | None = None) -> None:
        """step,loss,smoothed from the plot's own copy; written off the GUI thread (`exported`)."""
        steps, losses, smoothed = self.loss_plot.data()
        if not len(losses):
            self.show_message("info", "Nothing to export", "There is no loss history yet.")
            return
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Export loss", "loss.csv", "CSV files (*.csv)")
            if not path:
                return
        write = BackgroundCall("export-csv", write_loss_csv, str(path), steps, losses, smoothed, parent=self)
        write.done.connect(self._on_csv_written)
        write.failed.connect(self._on_csv_failed)
        write.start()

    def _on_csv_written(self, call: BackgroundCall, path: str) -> None:
        self.statusBar().showMessage(f"Loss exported to {path}", 10000)
        self.exported.emit(path)

    def _on_csv_failed(self, call: BackgroundCall, exc: Exception) -> None:
        path = call.args[0]
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        self.show_message("error", "Export failed", f"could not write {path}: {reason}")

    def export_png(self, path: str | None = None) -> None:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Export plot", "loss.png", "PNG images (*.png)")
            if not path:
                return
        if not self.loss_plot.plot.grab().save(str(path), "PNG"):
            self.show_message("error", "Export failed", f"could not write {path}")
        else:
            self.statusBar().showMessage(f"Plot exported to {path}", 10000)

    def _ask_open_path(self, title: str, folder: str, filters: str) -> str:
        path, _ = QFileDialog.getOpenFileName(self, title, folder, filters)
        return path

    # settings -------------------------------------------------------------------
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
        try:
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
        s.setValue("view/tab", self.tabs.currentIndex())
        s.sync()

