"""What a finished run leaves behind in the window: nothing but its row in the
Runs tab. Its worker, the worker's reports and its thread are deleted once the
thread has finished (they leaked, one set a run, while a Qt signal named
`event` shadowed QObject.event: every event Qt delivered to the object took a
reference that was never given back). scripts/cycle_memory.py measures the
resident memory over hundreds of runs."""
import gc
import weakref

import shiboken6
from PySide6.QtWidgets import QTableWidgetItem

from gui.run_list import MAX_CHECKED
from test_window import TIMEOUT_MS, set_steps, wait_state

CYCLES = 4


def settle(qtbot):
    """Let queued deletions and the sessions' release timers run, then collect."""
    qtbot.wait(200)
    gc.collect()
    qtbot.wait(50)
    gc.collect()


def qt_objects():
    """Valid Qt wrappers by type name (Qt objects that Python still holds)."""
    counts = {}
    for wrapper in shiboken6.getAllValidWrappers():
        name = type(wrapper).__name__
        counts[name] = counts.get(name, 0) + 1
    return counts


def test_finished_runs_leave_no_worker_thread_or_reports_alive(make_window, names_path, qtbot):
    window = make_window(names_path)
    set_steps(window, 40)
    left = []
    for _ in range(CYCLES):
        window.start_run()
        wait_state(qtbot, window, "done")
        session = window.session
        left.append({"worker": weakref.ref(session.worker), "reports": weakref.ref(session.reports),
                     "thread": weakref.ref(session.thread), "session": weakref.ref(session)})
        del session
        window.sample_panel.request()
        qtbot.waitUntil(lambda: bool(window.sample_panel.names()), timeout=TIMEOUT_MS)
        window.reset()
        wait_state(qtbot, window, "none")
    settle(qtbot)
    alive = [(i, name) for i, refs in enumerate(left) for name, ref in refs.items() if ref() is not None]
    assert alive == []


def test_more_runs_add_only_their_rows(make_window, names_path, qtbot):
    """The Qt objects runs add, counted once the Runs overlay is full (MAX_CHECKED
    curves) and again two runs later: only the two rows' cells."""
    window = make_window(names_path)
    set_steps(window, 10)

    def runs(n):
        for _ in range(n):
            window.start_run()
            wait_state(qtbot, window, "done")
            window.reset()
            wait_state(qtbot, window, "none")
        settle(qtbot)
        return qt_objects()

    first = runs(MAX_CHECKED)
    second = runs(2)
    grown = {name: second[name] - first.get(name, 0) for name in second  # (an earlier test's objects may go)
             if second[name] > first.get(name, 0)}
    columns = window.run_list.table.columnCount()
    assert grown == {QTableWidgetItem.__name__: 2 * columns}
