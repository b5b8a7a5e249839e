"""The window's automatic backend choice and its application model: the
backend box's first entry is "auto", shown with what it chose for the preset
and batch size; it is a first start's backend (a remembered one wins); a
first start whose choice is not built trains on NumPy meanwhile, builds it in
the background and says so; once built, the next run trains on it. And the
command line's options write the model, which the fields follow."""
from __future__ import annotations

import argparse

import pytest
from PySide6.QtWidgets import QComboBox, QSpinBox

from engine.backends import speeds as sp
from engine.backends.choice import AUTO
from engine.bench.timing import BenchResult
from engine.config import get_preset
from engine.data.corpus import CACHE_DIR_ENV, DATA_DIR_ENV
from engine.futhark import cc
from futhark_support import hide_futhark
from gui.app import apply_options

WAIT_MS = 60_000
BUILD_MS = 400_000  # a first build of the shipped C on a busy two-core machine
needs_cc = pytest.mark.skipif(cc.find_c_compiler() is None, reason=cc.NO_C_COMPILER)


def bench_row(backend, preset, ms, batch=1):
    params = get_preset(preset).model.num_params(27)
    return BenchResult(backend, preset, "ok", params=params, ms_per_step=ms, batch=batch, load_avg=1.0)


@pytest.fixture
def measured(tmp_path, monkeypatch):
    """This machine's own bench figures (which the choice prefers to the shipped table):
    futhark-c the fastest at tiny, NumPy at tiny with batch 8, futhark-multicore at s32."""
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    sp.record_bench([bench_row("numpy", "tiny", 0.3), bench_row("futhark-c", "tiny", 0.05),
                     bench_row("futhark-multicore", "tiny", 0.2),
                     bench_row("numpy", "tiny", 0.1, batch=8), bench_row("futhark-c", "tiny", 0.9, batch=8),
                     bench_row("futhark-multicore", "tiny", 0.5, batch=8),
                     bench_row("numpy", "s32", 2.0), bench_row("futhark-c", "s32", 1.5),
                     bench_row("futhark-multicore", "s32", 0.7)], ["bench"])


@pytest.fixture
def first_start(isolated_settings):
    """No settings remembered (the suite's windows otherwise remember numpy)."""
    isolated_settings.unlink()
    return isolated_settings


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """Nothing built; no Futhark compiler: the shipped C is what builds."""
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("MICROGPT_FUTHARK_THREADS", raising=False)  # futhark-c at tiny: its own library
    hide_futhark(monkeypatch, tmp_path)
    return tmp_path / "cache"


def combo(window, name):
    return window.findChild(QComboBox, name)


def auto_text(window) -> str:
    return combo(window, "backendCombo").itemText(0)


def test_a_first_start_selects_auto_shown_with_its_choice_which_follows_preset_and_batch(
        make_window, names_path, measured, first_start):
    window = make_window(names_path)
    box = combo(window, "backendCombo")
    assert box.currentData() == AUTO == window.app.backend
    assert box.currentIndex() == 0 and box.currentText() == "auto: futhark-c"  # tiny at batch 1
    assert window.status_labels["backend"].text() == "Backend: auto: futhark-c"
    window.findChild(QSpinBox, "batchSpin").setValue(8)
    assert window.app.settings.train.batch_size == 8 and box.currentText() == "auto: numpy"
    combo(window, "presetCombo").setCurrentText("s32")  # batch 1 again: the preset's
    assert window.app.settings.preset == "s32" and box.currentText() == "auto: futhark-multicore"
    assert "0.7 ms/step at s32 against futhark-c's 1.5 and numpy's 2" in box.itemData(0, 3)  # Qt.ToolTipRole


def test_a_remembered_backend_is_selected_and_auto_stays_listed(make_window, names_path, measured):
    window = make_window(names_path)  # the suite's settings remember numpy
    assert combo(window, "backendCombo").currentData() == "numpy" == window.app.backend
    assert auto_text(window) == "auto: futhark-c"
    combo(window, "backendCombo").setCurrentIndex(0)
    assert window.app.backend == AUTO
    window.close()
    again = make_window(None)
    assert combo(again, "backendCombo").currentData() == AUTO  # remembered in its turn


def test_the_command_line_writes_the_model_and_the_fields_follow(make_window, names_path, measured):
    window = make_window(names_path)
    apply_options(window, argparse.Namespace(preset="s32", backend="auto"))
    assert (window.app.settings.preset, window.app.backend) == ("s32", AUTO)
    assert combo(window, "presetCombo").currentText() == "s32"
    assert window.findChild(QSpinBox, "n_embdSpin").value() == get_preset("s32").model.n_embd
    assert combo(window, "backendCombo").currentText() == "auto: futhark-multicore"
    apply_options(window, argparse.Namespace(preset=None, backend="numpy"))
    assert combo(window, "backendCombo").currentData() == "numpy"


@needs_cc
def test_a_first_start_trains_on_numpy_while_its_choice_builds_and_says_so(
        make_window, names_path, measured, first_start, empty_cache, qtbot):
    window = make_window(names_path)
    assert window.app.choice().built is False
    window.findChild(QSpinBox, "stepsSpin").setValue(1_000_000)
    assert window.start_run()
    try:
        qtbot.waitUntil(lambda: window.state == "running" and window.loss_plot.series.n > 0, timeout=WAIT_MS)
        assert window.run.backend == "numpy" and window.app.build.backend == "futhark-c"
        assert combo(window, "backendCombo").currentData() == AUTO  # the run's backend does not replace auto
        assert window.statusBar().message() == ("Training on numpy while futhark-c builds in the background; "
                                                "the next run uses it")
        qtbot.waitUntil(lambda: "building futhark-c in the background (first use, about"
                        in window.progress_bar.format(), timeout=WAIT_MS)
        assert window.progress_bar.format().endswith(" s so far")
        assert "building futhark-c in the background" in combo(window, "backendCombo").itemData(0, 3)
        window.train_or_pause()  # auto's run resumes: Train means the run on show, not a new one
        qtbot.waitUntil(lambda: window.state == "paused", timeout=WAIT_MS)
        assert window.train_button.text() == "Resume"
    finally:
        window.app.build.cancel()
    window.stop()
    qtbot.waitUntil(lambda: window.state == "done", timeout=WAIT_MS)
    qtbot.waitUntil(lambda: window.app.build_message == "the build of futhark-c was cancelled", timeout=WAIT_MS)


@pytest.mark.futhark
@pytest.mark.slow
@needs_cc
def test_once_the_background_build_is_done_the_next_run_trains_on_it(
        make_window, names_path, measured, first_start, empty_cache, qtbot):
    window = make_window(names_path)
    window.findChild(QSpinBox, "stepsSpin").setValue(20)
    assert window.start_run()
    qtbot.waitUntil(lambda: window.state == "done", timeout=WAIT_MS)
    assert window.run.backend == "numpy" and window.loss_plot.series.n == 20
    qtbot.waitUntil(lambda: window.app.build_message.startswith("built futhark-c in "), timeout=BUILD_MS)
    assert window.statusBar().message().endswith(": the next run trains on it")
    assert window.app.choice().built and auto_text(window) == "auto: futhark-c"
    assert window.train_button.text() == "Train"  # the run is over: Train is a new run
    assert window.start_run()
    qtbot.waitUntil(lambda: window.state == "done" and window.run.backend == "futhark-c", timeout=WAIT_MS)
    assert window.app.build_status() == "" and "building" not in window.progress_bar.format()
    assert window.status_labels["backend"].text() == "Backend: futhark-c"


def test_the_plot_and_the_runs_tab_read_the_losses_from_the_models_record(make_window, names_path, qtbot):
    import numpy as np

    window = make_window(names_path)
    window.findChild(QSpinBox, "stepsSpin").setValue(300)
    assert window.start_run()
    qtbot.waitUntil(lambda: window.state == "done", timeout=WAIT_MS)
    record = window.app.runs.current
    assert record is window.run_list.runs[0] and record.steps == 300 == window.loss_plot.series.n
    plot = window.loss_plot.series
    assert plot.source is record and np.shares_memory(plot.losses, record.losses)  # one copy of the losses
    window.tabs.setCurrentWidget(window.run_list)  # the Runs tab draws its ticked runs when shown
    qtbot.waitUntil(lambda: id(record) in window.run_list.curves, timeout=WAIT_MS)
    listed = window.run_list._series[id(record)]
    assert listed.source is record and np.shares_memory(listed.losses, record.losses)
    shown = window.loss_plot.data()[1].copy()
    window.reset()  # the run ends: its record is compacted; the plot, cleared, holds nothing of it
    qtbot.waitUntil(lambda: window.state == "none", timeout=WAIT_MS)
    assert window.loss_plot.series.n == 0 and window.loss_plot.series.source is None
    np.testing.assert_array_equal(record.losses, shown.astype(np.float32))  # 300 steps: every one kept
