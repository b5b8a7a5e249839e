"""The scaling study dialog: one row per (backend, preset), unavailable backends
skipped with the reason, a line per backend, exports, and Cancel."""
from __future__ import annotations

import csv
import threading
import time

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget
from shiboken6 import isValid

import engine
from engine.bench import report as bench_report
from engine.bench.measure import BenchResult
from gui.scaling_study import STATUS_COLUMN, ScalingStudyDialog

PARAMS = {"tiny": 4192, "s32": 27328, "s64": 155008}
SPEED = {"numpy": 1.0, "futhark-c": 0.5}


def fake_availability(names):
    return {name: (name != "cupy", "CuPy is not installed" if name == "cupy" else "") for name in names}


def fake_measure(backend, preset, seconds, cancel):
    ms = SPEED[backend] * PARAMS[preset] / 1000
    return BenchResult(backend, preset, "ok", params=PARAMS[preset], ms_per_step=ms, steps_per_s=1e3 / ms)


@pytest.fixture
def dialog(qtbot):
    def make(measure=fake_measure):
        d = ScalingStudyDialog(measure=measure, availability=fake_availability,
                               backends=["numpy", "cupy", "futhark-c"], presets=list(PARAMS))
        qtbot.addWidget(d)
        d.show()
        return d
    return make


def test_the_plot_is_built_after_the_dialogs_first_paint(qtbot):
    """Opening the dialog does not wait for pyqtgraph's plot: it is built in a
    later turn of the event loop, once the dialog has painted, and is in its
    place (the splitter's left pane, named, with its axes) before any result."""
    import pyqtgraph as pg

    d = ScalingStudyDialog(measure=fake_measure, availability=fake_availability, backends=["numpy"],
                           presets=["tiny"])
    qtbot.addWidget(d)
    assert d.findChild(pg.PlotWidget) is None
    painted = []
    d.paintEvent = lambda event, paint=d.paintEvent: (painted.append(d.findChild(pg.PlotWidget)), paint(event))
    d.show()
    qtbot.waitUntil(lambda: d.findChild(pg.PlotWidget) is not None)
    assert painted and painted[0] is None  # the first paint came before the plot
    plot = d.findChild(pg.PlotWidget, "scalingPlot")
    assert plot is d.plot and plot.isVisible() and plot.parent() is d.table.parent()
    assert plot.getPlotItem().getAxis("left").labelText == "ms per step (log scale)"
    qtbot.waitUntil(lambda: d.findChild(QWidget, "scalingPlotSlot") is None)


def test_one_row_per_backend_and_preset_and_unavailable_ones_say_why(qtbot, dialog, tmp_path):
    d = dialog()
    d.set_checked(["numpy", "cupy", "futhark-c"], ["tiny", "s32", "s64"])
    with qtbot.waitSignal(d.studyFinished, timeout=5000) as finished:
        qtbot.mouseClick(d.run_button, Qt.LeftButton)
    assert finished.args == [False]
    rows = [tuple(d.table.item(r, c).text() for c in (0, 1, 5)) for r in range(d.table.rowCount())]
    assert len(rows) == 9
    assert {(b, p) for b, p, _ in rows} == {(b, p) for b in ("numpy", "cupy", "futhark-c") for p in PARAMS}
    assert all(status == "skipped: CuPy is not installed" for b, _, status in rows if b == "cupy")
    for backend in ("numpy", "futhark-c"):  # one line per backend, points sorted by size
        x, y = d.curve_data(backend)
        np.testing.assert_allclose(x, sorted(PARAMS.values()))
        np.testing.assert_allclose(y, [SPEED[backend] * p / 1000 for p in sorted(PARAMS.values())])
    assert d.curve_data("cupy")[0].size == 0

    assert d.export_csv(str(tmp_path / "study.csv"))
    table = list(csv.DictReader(open(tmp_path / "study.csv", encoding="utf-8")))
    assert len(table) == 9 and {r["status"] for r in table} == {"ok", "skipped"}
    assert d.export_png(str(tmp_path / "study.png"))
    assert (tmp_path / "study.png").stat().st_size > 1000


def test_points_arrive_one_at_a_time(qtbot, dialog):
    gate = threading.Semaphore(0)

    def gated(backend, preset, seconds, cancel):
        gate.acquire()
        return fake_measure(backend, preset, seconds, cancel)

    d = dialog(gated)
    d.set_checked(["numpy"], ["tiny", "s32"])
    d.run()
    assert d.running and not d.run_button.isEnabled()
    gate.release()
    qtbot.waitUntil(lambda: len(d.results) == 1, timeout=5000)
    assert d.curve_data("numpy")[0].tolist() == [4192] and d.progress.format() == "1 / 2"
    gate.release()
    qtbot.waitUntil(lambda: not d.running, timeout=5000)
    assert d.curve_data("numpy")[0].tolist() == [4192, 27328] and d.run_button.isEnabled()


def test_cancel_ends_the_study_within_half_a_second(qtbot, dialog):
    started = threading.Event()

    def slow(backend, preset, seconds, cancel):  # would take 30 s; polls cancel like bench's measure
        started.set()
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if cancel():
                raise engine.Cancelled("cancelled")
            time.sleep(0.01)
        return fake_measure(backend, preset, seconds, cancel)

    d = dialog(slow)
    d.set_checked(["numpy", "futhark-c"], ["tiny", "s32"])
    d.run()
    assert started.wait(5)
    with qtbot.waitSignal(d.studyFinished, timeout=500) as finished:
        qtbot.mouseClick(d.cancel_button, Qt.LeftButton)
    assert finished.args == [True]
    assert d.results == [] and d.run_button.isEnabled() and not d.cancel_button.isEnabled()
    assert d.progress.format() == "cancelled"


def test_a_failing_measurement_is_a_row_not_a_crash(qtbot, dialog):
    def failing(backend, preset, seconds, cancel):
        if preset == "s32":
            raise RuntimeError("out of memory")
        return fake_measure(backend, preset, seconds, cancel)

    d = dialog(failing)
    d.set_checked(["numpy"], ["tiny", "s32"])
    with qtbot.waitSignal(d.studyFinished, timeout=5000):
        d.run()
    assert [r.status for r in d.results] == ["ok", "error"]
    assert d.table.item(1, 5).text() == "error: RuntimeError: out of memory"


def test_without_a_dataset_the_default_study_cannot_run(qtbot):
    d = ScalingStudyDialog(availability=fake_availability, backends=["numpy"])
    qtbot.addWidget(d)
    assert not d.run_button.isEnabled() and "dataset" in d.status.text()
    assert not d.run()


def test_the_backend_list_shows_which_cannot_run(qtbot, dialog):
    d = dialog()
    item = d.backend_list.item(1)
    qtbot.waitUntil(lambda: "cannot run here" in item.toolTip(), timeout=5000)
    assert item.toolTip() == "cannot run here: CuPy is not installed"


def test_busy_rows_are_flagged_as_bench_flags_them_and_the_table_reads_easily(qtbot, dialog):
    """numpy s128 at 28 ms/step with the load above the core count: bench's table says
    busy, so the study says busy too (an idle row says ok); figures have no exponents,
    and the Status column stays in view."""
    d = dialog()
    d.resize(1160, 600)
    busy = BenchResult("futhark-multicore", "gpt2-small", "ok", params=124_439_808, ms_per_step=28.0,
                       steps_per_s=35.7, load_avg=5.2, cores=2, busy=True)
    idle = BenchResult("numpy", "tiny", "ok", params=4192, ms_per_step=0.0668, steps_per_s=14970.3,
                       load_avg=0.4, cores=2, busy=False)
    skipped = BenchResult("cupy", "s128", "skipped", reason="CuPy is not installed")
    for result in (busy, idle, skipped):
        d.add_result(result)
    status = [d.table.item(r, STATUS_COLUMN).text() for r in range(3)]
    assert bench_report.table_row(busy).endswith(" busy") and status[0] == "busy (load 5.2 on 2 cores)"
    assert not bench_report.table_row(idle).endswith(" busy") and status[1] == "ok"
    assert status[2] == "skipped: CuPy is not installed"
    assert [d.table.item(1, c).text() for c in (2, 3, 4)] == ["4,192", "0.0668", "14,970"]
    assert d.table.item(0, 3).text() == "28.0" and d.table.item(0, 4).text() == "35.7"
    qtbot.waitUntil(lambda: d.table.viewport().width() > 0)
    d.table.resizeColumnsToContents()
    assert not d.table.horizontalScrollBar().isVisible()
    left = d.table.columnViewportPosition(STATUS_COLUMN)
    assert left >= 0 and left + 80 <= d.table.viewport().width()  # at least 80 px of it in view


def test_a_study_on_a_busy_machine_ends_with_benchs_warning(qtbot, dialog):
    def busy_measure(backend, preset, seconds, cancel):
        ms = SPEED[backend] * PARAMS[preset] / 1000
        return BenchResult(backend, preset, "ok", params=PARAMS[preset], ms_per_step=ms, steps_per_s=1e3 / ms,
                           load_avg=9.0, cores=2, busy=preset == "s32")

    d = dialog(busy_measure)
    d.set_checked(["numpy"], ["tiny", "s32"])
    with qtbot.waitSignal(d.studyFinished, timeout=5000):
        d.run()
    assert [d.table.item(r, STATUS_COLUMN).text() for r in range(2)] == ["ok", "busy (load 9.0 on 2 cores)"]
    assert "the machine was busy during 1 of 2 rows" in d.status.text()


def test_opening_a_dialog_and_starting_a_study_start_no_thread(qtbot, dialog, monkeypatch):
    """threading.Thread.start waits until the new thread has run, so each thread
    started as the dialog opened held the GUI thread while it waited for a CPU:
    every dialog's calls share one thread, made once."""
    first = dialog()
    qtbot.waitUntil(lambda: "cannot run here" in first.backend_list.item(1).toolTip(), timeout=5000)
    started = []
    monkeypatch.setattr(threading.Thread, "start", lambda thread, real=threading.Thread.start: (
        started.append(thread.name), real(thread))[1])
    d = dialog()
    d.set_checked(["numpy", "cupy"], ["tiny"])
    with qtbot.waitSignal(d.studyFinished, timeout=5000):
        assert d.run()
    qtbot.waitUntil(lambda: "cannot run here" in d.backend_list.item(1).toolTip(), timeout=5000)
    assert [(r.backend, r.status) for r in d.results] == [("cupy", "skipped"), ("numpy", "ok")]
    assert started == []


def test_a_deleted_dialogs_study_ends_and_the_next_dialog_is_served(qtbot, dialog):
    """The thread is shared: a study whose dialog is deleted without Cancel stops at
    its next check, and a new dialog's calls run after it."""
    polling = threading.Event()

    def endless(backend, preset, seconds, cancel):
        polling.set()
        while not cancel():
            time.sleep(0.01)
        raise engine.Cancelled("cancelled")

    d = ScalingStudyDialog(measure=endless, availability=fake_availability, backends=["numpy"], presets=["tiny"])
    assert d.run() and polling.wait(5)
    d.deleteLater()
    qtbot.waitUntil(lambda: not isValid(d), timeout=5000)
    second = dialog()
    qtbot.waitUntil(lambda: "cannot run here" in second.backend_list.item(1).toolTip(), timeout=5000)
    with qtbot.waitSignal(second.studyFinished, timeout=5000) as finished:
        second.set_checked(["numpy"], ["tiny"])
        assert second.run()
    assert finished.args == [False] and [r.status for r in second.results] == ["ok"]
