"""GUI tests run offscreen, each with its own settings file and no message boxes."""
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before anything imports Qt

import pytest

from gui._refcount_guard import make_singletons_immortal

make_singletons_immortal()  # before pytest-qt's first Qt call (PySide6 6.12 on Python 3.11)

WAIT_MS = 60_000


@pytest.fixture(autouse=True)
def collect_on_the_gui_thread(qapp):
    """As the app does (gui/gui_thread_gc.py): no collection in worker threads during
    a test; a last collection on this thread at its end."""
    from gui.gui_thread_gc import GuiThreadCollector

    collector = GuiThreadCollector()
    collector.start()
    yield collector
    collector.stop()
    collector.deleteLater()


@pytest.fixture(autouse=True)
def isolated_settings(tmp_path_factory, monkeypatch):
    """Every test reads and writes its own settings file, never the user's (in a folder
    of its own: a test's tmp_path holds only what the test writes)."""
    path = tmp_path_factory.mktemp("window-settings") / "settings.ini"
    # remembered from an earlier start: numpy, so that no test's run starts a background
    # Futhark build (a first start's automatic choice has its own tests, which remove it)
    path.write_text("[General]\nbackend=numpy\n", encoding="utf-8")
    monkeypatch.setenv("MICROGPT_GUI_SETTINGS", str(path))
    return path


def wait_dataset(qtbot, window):
    """The dataset is read off the GUI thread: wait until that read has reported."""
    qtbot.waitUntil(lambda: not window.reading_dataset, timeout=WAIT_MS)


@pytest.fixture
def make_window(qtbot):
    """Build MainWindows that record messages instead of showing boxes and do not
    ask to save before discarding a run, with their dataset read. At the end (before pytest-qt deletes them) each is closed (with
no save question), and
    its close must complete: every training thread finished, no forced exit."""
    from gui import MainWindow
    from gui.sessions import running_sessions

    gave_up = []

    def close_and_wait(window):
        window.close_without_asking()  # a test may leave a save question open
        qtbot.waitUntil(lambda: not window.sessions.busy_ending and not running_sessions(), timeout=WAIT_MS)
        assert not window.isVisible()
        assert not gave_up, gave_up

    def make(data_path=None):
        window = MainWindow(data_path=data_path)
        window.message_hook = None
        window.ask_before_discarding = False  # the save question has its own tests (test_run_lifecycle)
        window.exit_hook = gave_up.append  # never os._exit the test process
        qtbot.addWidget(window, before_close_func=close_and_wait)
        window.show()
        wait_dataset(qtbot, window)
        return window

    return make
