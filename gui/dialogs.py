"""Small pieces around the window: the non-blocking message box, the About
text, and the default dataset's download in a background thread."""
from __future__ import annotations

import platform
import threading

import numpy as np
import PySide6
import pyqtgraph as pg
from PySide6.QtCore import QObject, Qt, Signal, qVersion
from PySide6.QtWidgets import QMessageBox, QWidget

import engine
from engine import data as engine_data


def show_message_box(parent: QWidget, kind: str, title: str, text: str, details: str = "") -> QMessageBox:
    """A non-modal message box: it never blocks the caller (or a test)."""
    icons = {"error": QMessageBox.Critical, "warning": QMessageBox.Warning, "info": QMessageBox.Information}
    box = QMessageBox(icons.get(kind, QMessageBox.Information), title, text, QMessageBox.Ok, parent)
    box.setObjectName("messageBox")
    box.setAttribute(Qt.WA_DeleteOnClose)
    box.setTextInteractionFlags(Qt.TextSelectableByMouse)
    if details:
        box.setDetailedText(details)
    box.setModal(False)
    box.show()
    return box


def about_html(backend: str | None) -> str:
    rows = [
        ("microgpt-gui", engine.__version__),
        ("Backend in use", backend or "none yet"),
        ("Python", platform.python_version()),
        ("PySide6 / Qt", f"{PySide6.__version__} / {qVersion()}"),
        ("pyqtgraph", pg.__version__),
        ("NumPy", np.__version__),
    ]
    table = "".join(f"<tr><td>{k}</td><td>&nbsp;&nbsp;<b>{v}</b></td></tr>" for k, v in rows)
    return ("<h3>microgpt-gui</h3><p>Train and sample Karpathy's microgpt, a tiny "
            f"character-level GPT that invents names.</p><table>{table}</table>")


class DefaultDatasetDownload(QObject):
    """Fetches the default names.txt (or finds it cached) off the GUI thread."""

    progress = Signal(int, int)   # bytes so far, total (0 if unknown)
    done = Signal(str)            # the local path
    failed = Signal(str)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dataset-download", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            path = engine_data.default_dataset_path(progress=self._emit_progress)
        except Exception as exc:  # offline, corrupt download, unwritable data dir
            self._emit(self.failed, str(exc))
        else:
            self._emit(self.done, str(path))

    def _emit_progress(self, done: int, total: int) -> None:
        self._emit(self.progress, done, total)

    @staticmethod
    def _emit(signal, *args) -> None:
        try:
            signal.emit(*args)
        except RuntimeError:  # the window (and this object) went away meanwhile
            pass
