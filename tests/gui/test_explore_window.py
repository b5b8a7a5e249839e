"""The explore tabs inside the real window: snapshots from the training worker
reach the panels only while one is on screen, prefix samples, attention from a
sample, the run list filled from the runs, Tools > Scaling study. Each checked
against an independent engine run of the same configuration."""
import math

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLineEdit, QListWidget, QPushButton, QSplitter, QTabWidget

import engine
from engine import backends as registry
from engine.model import introspect as ins
from gui.run_list import COLUMNS

from test_window import (TIMEOUT_MS, click, reference_backend, reference_losses, set_steps, train_to_end,
                         wait_state, widget)


def trained_backend(corpus, steps):
    """A NumPy backend trained through the window's run of `steps` steps."""
    backend = reference_backend(corpus, steps)
    backend.train(steps)
    return backend


def show_tab(window, title):
    tabs = widget(window, QTabWidget, "mainTabs")
    index = next(i for i in range(tabs.count()) if tabs.tabText(i).replace("&", "") == title)
    tabs.setCurrentIndex(index)
    return tabs.widget(index)


def test_no_snapshots_while_only_training_is_shown_then_one_when_a_panel_appears(
        make_window, names_path, names_corpus, qtbot):
    window = make_window(names_path)
    seen = []
    window.inspect_hub.snapshotChanged.connect(seen.append)
    train_to_end(qtbot, window, 300)
    assert window.inspect_hub.snapshot is None and not [s for s in seen if s is not None]
    panel = show_tab(window, "Next character")
    qtbot.waitUntil(lambda: window.inspect_hub.snapshot is not None, timeout=TIMEOUT_MS)
    snapshot = window.inspect_hub.snapshot
    assert snapshot.step == 300
    expected = trained_backend(names_corpus, 300).get_state().params
    np.testing.assert_array_equal(snapshot.flat, expected)
    # the bars are the model's distribution after the empty prefix, from those parameters
    qtbot.waitUntil(lambda: panel.distribution is not None, timeout=TIMEOUT_MS)
    reference = ins.next_char(ins.Snapshot(expected, engine.PRESETS["tiny"].model, names_corpus.chars, 300),
                              "", panel.temperature)
    np.testing.assert_allclose(panel.distribution.probs, reference.probs, rtol=1e-6)


def test_snapshots_follow_training_while_a_panel_is_shown(make_window, names_path, names_corpus, qtbot):
    window = make_window(names_path)
    show_tab(window, "Character map")
    steps = []
    window.inspect_hub.snapshotChanged.connect(lambda s: steps.append(s.step) if s is not None else None)
    train_to_end(qtbot, window, 3000)
    qtbot.waitUntil(lambda: steps and steps[-1] == 3000, timeout=TIMEOUT_MS)
    assert len(steps) >= 2 and steps == sorted(steps)  # several, during the run, in order
    assert steps[0] < 3000
    np.testing.assert_array_equal(window.inspect_hub.snapshot.flat,
                                  trained_backend(names_corpus, 3000).get_state().params)
    click(qtbot, window, "resetButton")
    wait_state(qtbot, window, "none")
    assert window.inspect_hub.snapshot is None  # Reset: the panels forget the model


def test_prefix_samples_come_from_the_run_and_start_with_the_prefix(make_window, names_path, names_corpus, qtbot):
    window = make_window(names_path)
    train_to_end(qtbot, window, 200)
    panel = show_tab(window, "Next character")
    qtbot.waitUntil(lambda: window.inspect_hub.snapshot is not None, timeout=TIMEOUT_MS)
    widget(window, QLineEdit, "prefixEdit").setText("em")
    seed, count, temperature = panel.seed_spin.value(), panel.count_spin.value(), panel.temperature
    click(qtbot, window, "prefixSampleButton")
    listing = widget(window, QListWidget, "prefixSamplesList")
    qtbot.waitUntil(lambda: listing.count() == count, timeout=TIMEOUT_MS)
    names = [listing.item(i).data(Qt.UserRole) for i in range(listing.count())]
    expected = trained_backend(names_corpus, 200).sample(count, temperature, seed, prefix="em")
    assert names == expected and all(name.startswith("em") for name in names)
    assert window.sample_panel.names() == []  # the Training tab's samples are left alone


def test_a_sample_opens_in_the_attention_tab(make_window, names_path, qtbot):
    window = make_window(names_path)
    train_to_end(qtbot, window, 100)
    click(qtbot, window, "sampleButton")
    samples = widget(window, QListWidget, "samplesList")
    qtbot.waitUntil(lambda: samples.count() > 0, timeout=TIMEOUT_MS)
    name = next(samples.item(i).text() for i in range(samples.count()) if samples.item(i).text())
    row = [samples.item(i).text() for i in range(samples.count())].index(name)
    samples.setCurrentRow(row)
    qtbot.keyClick(samples, Qt.Key_Return)  # activates the item, as a double-click does
    assert window.tabs.currentWidget() is window.attention_panel
    assert widget(window, QLineEdit, "attentionNameEdit").text() == name
    qtbot.waitUntil(lambda: window.attention_panel.attention is not None, timeout=TIMEOUT_MS)
    assert window.attention_panel.attention.text == name


def test_the_run_list_holds_every_run_with_its_losses_and_status(
        make_window, names_path, names_corpus, qtbot, tmp_path):
    window = make_window(names_path)
    train_to_end(qtbot, window, 200)
    click(qtbot, window, "resetButton")  # else more Steps would continue this run (test_run_lifecycle)
    wait_state(qtbot, window, "none")
    set_steps(window, 1_000_000)
    click(qtbot, window, "trainButton")
    qtbot.waitUntil(lambda: window.loss_plot.series.n >= 50, timeout=TIMEOUT_MS)
    click(qtbot, window, "stopButton")
    wait_state(qtbot, window, "done")
    path = tmp_path / "run.npz"
    window.save_checkpoint(str(path))
    qtbot.waitUntil(path.exists, timeout=TIMEOUT_MS)
    stopped_at = window.session.worker.step
    window.load_checkpoint(str(path))
    wait_state(qtbot, window, "ready")

    runs = window.run_list.runs  # the checkpoint of run 2, loaded, continues run 2's row
    assert [r.status for r in runs] == ["finished", "loaded"]
    assert [r.steps for r in runs] == [200, stopped_at]
    np.testing.assert_array_equal(runs[0].losses, reference_losses(names_corpus, 200))
    np.testing.assert_array_equal(runs[1].losses, reference_losses(names_corpus, 1_000_000, first=stopped_at))
    assert math.isfinite(runs[0].ms_per_step) and runs[0].ms_per_step > 0  # timed chunk by chunk
    assert math.isfinite(runs[1].ms_per_step)  # timed as it trained here, before the save
    table = window.run_list.table
    show_tab(window, "Runs")
    qtbot.waitUntil(lambda: [table.item(row, COLUMNS.index("Status")).text() for row in range(table.rowCount())]
                    == ["finished", "loaded"], timeout=TIMEOUT_MS)
    assert table.item(0, COLUMNS.index("Steps")).text() == "200"
    assert len(window.run_list.curves) == 2  # every run overlaid
    # the Runs tab's smoothing is the loss plot's
    window.loss_plot.smoothing_slider.setValue(600)
    assert window.run_list.smoothing == 0.6


def test_a_diverged_run_is_listed_as_diverged(make_window, names_path, qtbot, monkeypatch):
    from engine.backends.numpy_backend import NumpyBackend

    class DivergingBackend(NumpyBackend):
        name = "diverging"

        def _train_steps(self, k):
            losses = super()._train_steps(k)
            return np.append(losses[:-1], np.float32(np.nan)).astype(np.float32) if self._step >= 20 else losses

    monkeypatch.setitem(registry._REGISTRY, "diverging",
                        (lambda: (True, "test backend"), lambda m, t, c, p: DivergingBackend(m, t, c, p)))
    window = make_window(names_path)
    assert window.config_panel.select_backend("diverging")
    train_to_end(qtbot, window, 500)
    qtbot.waitUntil(lambda: any(kind == "error" for kind, *_ in window.messages), timeout=TIMEOUT_MS)
    assert window.run_list.runs[-1].status == "diverged"


def test_view_shortcuts_and_the_scaling_study_menu(make_window, names_path, qtbot):
    window = make_window(names_path)
    for key, page in [(Qt.Key_3, window.attention_panel), (Qt.Key_5, window.run_list),
                      (Qt.Key_1, widget(window, QSplitter, "trainingPage"))]:
        qtbot.keyClick(window, key, Qt.ControlModifier)
        assert window.tabs.currentWidget() is page
    action = next(a for a in window.findChildren(type(window.save_action)) if a.objectName() == "scalingStudyAction")
    action.trigger()
    dialog = window.scaling_dialog
    assert dialog is not None and dialog.isVisible() and dialog.measure is not None
    assert widget(dialog, QPushButton, "scalingRunButton").isEnabled()
    window.close()  # closes the study with the window
    qtbot.waitUntil(lambda: not dialog.isVisible(), timeout=TIMEOUT_MS)


def test_the_tab_is_remembered(make_window, names_path, qtbot):
    window = make_window(names_path)
    show_tab(window, "Runs")
    window.close()
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=TIMEOUT_MS)
    again = make_window(names_path)
    assert again.tabs.currentWidget() is again.run_list
