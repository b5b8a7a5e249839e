"""PySide6 6.12 drops a reference to None/True/False on every void call and
emit on Python < 3.12; importing gui must make that harmless."""
import sys

import pytest


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="None and bools are immortal from Python 3.12 (PEP 683)")
def test_void_qt_calls_cannot_exhaust_none_or_bools(qtbot):
    import gui  # noqa: F401  (applies the guard)
    from PySide6.QtCore import QObject, Signal
    from PySide6.QtWidgets import QWidget

    class Emitter(QObject):
        ping = Signal(int)

    widget, emitter = QWidget(), Emitter()
    qtbot.addWidget(widget)
    before = sys.getrefcount(None), sys.getrefcount(True), sys.getrefcount(False)
    for _ in range(20_000):  # several times None's natural reference count
        widget.setEnabled(True)
        emitter.ping.emit(1)
    after = sys.getrefcount(None), sys.getrefcount(True), sys.getrefcount(False)
    assert min(after) > 2**40
    assert all(a >= b - 40_000 for a, b in zip(after, before))
