"""GUI tests run offscreen, each with its own settings file and no message boxes."""
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before anything imports Qt

from pathlib import Path

import pytest

from gui._refcount_guard import make_singletons_immortal

make_singletons_immortal()  # before pytest-qt's first Qt call (PySide6 6.12 on Python 3.11)

# makemore's names.txt lives in ../shared beside the repository (never in it);
# MICROGPT_NAMES_TXT points elsewhere (e.g. from a git worktree).
NAMES = Path(os.environ.get("MICROGPT_NAMES_TXT")
             or Path(__file__).resolve().parents[2].parent / "shared" / "data" / "names.txt")


@pytest.fixture(autouse=True)
def isolated_settings(tmp_path, monkeypatch):
    """Every test reads and writes its own settings file, never the user's."""
    path = tmp_path / "settings.ini"
    monkeypatch.setenv("MICROGPT_GUI_SETTINGS", str(path))
    return path


@pytest.fixture
def names_path():
    if not NAMES.is_file():
        pytest.skip(f"the names dataset is not at {NAMES} (set MICROGPT_NAMES_TXT)")
    return NAMES


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
