"""GUI tests run offscreen, each with its own settings file and no message boxes."""
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before anything imports Qt

import pytest

from gui._refcount_guard import make_singletons_immortal

make_singletons_immortal()  # before pytest-qt's first Qt call (PySide6 6.12 on Python 3.11)


@pytest.fixture(autouse=True)
def isolated_settings(tmp_path, monkeypatch):
    """Every test reads and writes its own settings file, never the user's."""
    path = tmp_path / "settings.ini"
    monkeypatch.setenv("MICROGPT_GUI_SETTINGS", str(path))
    return path


@pytest.fixture
def make_window(qtbot):
    """Build MainWindows that record messages instead of showing boxes; closed at the end."""
    from gui import MainWindow

    windows = []

    def make(data_path=None):
        window = MainWindow(data_path=data_path)
        window.message_hook = None
        qtbot.addWidget(window)
        window.show()
        windows.append(window)
        return window

    yield make
    for window in windows:
        window.close()
