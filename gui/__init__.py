"""microgpt-gui's window (PySide6 + pyqtgraph); all model arithmetic lives in engine/."""
from .main_window import MainWindow

__all__ = ["MainWindow"]
