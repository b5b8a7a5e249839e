"""The window's File and Help menus: checkpoints, exports, About, and the
settings that persist between sessions (QSettings). A mixin of MainWindow."""
from __future__ import annotations

import numpy as np
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QFileDialog

import engine

from . import worker as w
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
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Load checkpoint", "", "Checkpoints (*.npz);;All files (*)")
            if not path:
                return
        try:  # read it here so a bad file leaves the current run alone
            checkpoint = engine.read_checkpoint(path)
        except engine.CheckpointError as exc:
            self.show_message("error", "Cannot load this checkpoint", str(exc))
            return
        self._start_session(w.RunSpec(self.config_panel.backend_name(), checkpoint=checkpoint, autostart=False))

    def export_csv(self, path: str | None = None) -> None:
        losses = self.session.worker.loss_history() if self.session else np.empty(0)
        if not len(losses):
            self.show_message("info", "Nothing to export", "There is no loss history yet.")
            return
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Export loss", "loss.csv", "CSV files (*.csv)")
            if not path:
                return
        _, _, smoothed = self.loss_plot.data()
        n = min(len(losses), len(smoothed))
        table = np.column_stack([np.arange(n), losses[:n], smoothed[:n]])
        try:
            np.savetxt(path, table, fmt=["%d", "%.6f", "%.6f"], delimiter=",",
                       header=f"step,loss,smoothed_{self.loss_plot.smoothing:.3f}", comments="")
        except OSError as exc:
            self.show_message("error", "Export failed", f"could not write {path}: {exc.strerror or exc}")

    def export_png(self, path: str | None = None) -> None:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Export plot", "loss.png", "PNG images (*.png)")
            if not path:
                return
        if not self.loss_plot.plot.grab().save(str(path), "PNG"):
            self.show_message("error", "Export failed", f"could not write {path}")

    # settings and closing -------------------------------------------------------
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
        s.sync()
