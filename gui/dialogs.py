"""Small pieces around the window: the non-blocking message box, the
window-modal save question, and the About text."""
from __future__ import annotations

import platform

import numpy as np
import PySide6
import pyqtgraph as pg
from PySide6.QtCore import Qt, qVersion
from PySide6.QtWidgets import QMessageBox, QWidget

import engine


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


SAVE, DISCARD, CANCEL = "save", "discard", "cancel"


def ask_to_save(parent: QWidget, text: str, answer) -> QMessageBox:
    """Save / Discard / Cancel, as editors ask before closing a changed file:
    window-modal (the rest of the app, and the training thread, go on) and
    non-blocking; answer(SAVE | DISCARD | CANCEL) once it is answered or closed."""
    box = QMessageBox(QMessageBox.Warning, "Save the trained model?", text,
                      QMessageBox.Save | QMessageBox.Discard | QMessageBox.Cancel, parent)
    box.setObjectName("saveQuestion")
    box.setInformativeText("Save writes a checkpoint first; Discard forgets the model; "
                           "Cancel leaves everything as it was.")
    box.setDefaultButton(QMessageBox.Save)
    box.setEscapeButton(QMessageBox.Cancel)
    box.setAttribute(Qt.WA_DeleteOnClose)
    box.setWindowModality(Qt.WindowModal)
    choices = {QMessageBox.Save: SAVE, QMessageBox.Discard: DISCARD}
    box.finished.connect(lambda *_: answer(choices.get(box.standardButton(box.clickedButton()), CANCEL)))
    box.open()
    return box
