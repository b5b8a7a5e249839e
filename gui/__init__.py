"""microgpt-gui's window (PySide6 + pyqtgraph); all model arithmetic lives in engine/."""
from ._refcount_guard import make_singletons_immortal

make_singletons_immortal()  # before any Qt call: see _refcount_guard (PySide6 6.12 on Python 3.11)

from .main_window import MainWindow  # noqa: E402

__all__ = ["MainWindow"]
