"""The inspect panels (pytest-qt): each shows engine.model.introspect's results for the
snapshot it was given, computed off the GUI thread, and nothing else."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPointF, Qt

import engine
from engine.model import introspect as ins
from gui.attention_view import AttentionPanel
from gui.char_map import CharMapPanel, VOWEL_COLOR, OTHER_COLOR
from gui.inspect_hub import InspectHub
from gui.next_char_panel import COMPLETIONS_DELAY_MS, NextCharPanel


@pytest.fixture(scope="module")
def backend(small_corpus):
    model = engine.ModelConfig(n_embd=8, n_layer=2, n_head=2, block_size=8)
    train = engine.TrainConfig(num_steps=200, learning_rate=0.02, init_std=0.3, seed=7)
    backend = engine.open_backend("numpy", model, train, small_corpus)
    backend.train(60)
    yield backend
    backend.close()


@pytest.fixture
def snap(backend):
    return ins.Snapshot.from_backend(backend)


@pytest.fixture
def hub(qtbot):
    hub = InspectHub()
    yield hub
    assert hub.close()


def show(qtbot, panel):
    qtbot.addWidget(panel)
    panel.resize(700, 500)
    panel.show()
    qtbot.waitExposed(panel)
    return panel


def test_next_char_bars_show_the_engines_distribution(qtbot, hub, snap, backend):
    panel = show(qtbot, NextCharPanel(hub))
    hub.set_snapshot(snap)
    with qtbot.waitSignal(panel.distributionShown, check_params_cb=lambda d: d.prefix == "em", timeout=5000):
        qtbot.keyClicks(panel.prefix_edit, "em")
    want = ins.next_char(snap, "em", panel.temperature)
    labels, heights = panel.bar_heights()
    assert labels == [want.labels[i] for i in want.ranked()] and "end" in labels
    np.testing.assert_allclose(heights, want.probs[want.ranked()])
    assert all(a >= b for a, b in zip(heights, heights[1:]))

    panel.sort_check.setChecked(False)  # alphabetical: the vocabulary's order, then end
    labels, heights = panel.bar_heights()
    assert labels == [*backend.corpus.chars, "end"]
    np.testing.assert_allclose(heights, want.probs)

    with qtbot.waitSignal(panel.distributionShown, check_params_cb=lambda d: d.temperature == 1.5, timeout=5000):
        panel.set_temperature(1.5)
    np.testing.assert_allclose(panel.bar_heights()[1], ins.next_char(snap, "em", 1.5).probs)


def test_completions_list_the_engines_beam_search(qtbot, hub, snap):
    panel = show(qtbot, NextCharPanel(hub))
    hub.set_snapshot(snap)
    panel.width_spin.setValue(4)
    with qtbot.waitSignal(panel.completionsShown, check_params_cb=lambda c: c and c[0].text.startswith("a")
                          and len(c) == 4, timeout=5000):
        panel.set_prefix("a")
    want = ins.complete(snap, "a", 4, panel.temperature)
    items = [panel.completions_list.item(i) for i in range(panel.completions_list.count())]
    assert [item.data(Qt.UserRole) for item in items] == [c.text for c in want]
    for item, c in zip(items, want):
        assert f"{100 * c.prob:.3f}%" in item.text()
    with qtbot.waitSignal(panel.nameActivated) as activated:
        panel.completions_list.itemActivated.emit(items[1])
    assert activated.args == [want[1].text]
    with qtbot.waitSignal(panel.completionsShown, check_params_cb=lambda c: len(c) == 7, timeout=5000):
        panel.width_spin.setValue(7)  # a wider beam: searched again once the spinning pauses
    assert [c.text for c in panel.completions] == [c.text for c in ins.complete(snap, "a", 7, panel.temperature)]
    assert panel._completions_timer.interval() == COMPLETIONS_DELAY_MS


def test_sample_from_the_prefix_asks_with_the_panels_settings(qtbot, hub, snap, backend):
    panel = show(qtbot, NextCharPanel(hub))
    assert not panel.sample_button.isEnabled()  # no model yet
    hub.set_snapshot(snap)
    panel.set_prefix("ma")
    panel.set_temperature(0.8)
    panel.count_spin.setValue(5)
    panel.seed_spin.setValue(3)
    with qtbot.waitSignal(panel.sampleRequested) as request:
        qtbot.mouseClick(panel.sample_button, Qt.LeftButton)
    assert request.args == ["ma", 5, 0.8, 3]
    assert panel.seed_spin.value() == 4  # the next click draws other names
    prefix, n, temperature, seed = request.args
    names = backend.sample(n, temperature, seed, prefix=prefix)  # what the window will do with it
    panel.show_samples(names, backend.step)
    shown = [panel.samples_list.item(i).text() for i in range(panel.samples_list.count())]
    assert shown == names and all(name.startswith("ma") for name in shown)


def test_a_character_outside_the_vocabulary_is_explained(qtbot, hub, snap):
    panel = show(qtbot, NextCharPanel(hub))
    hub.set_snapshot(snap)
    with qtbot.waitSignal(hub.failed, timeout=5000):
        panel.set_prefix("e#")
    qtbot.waitUntil(lambda: "'#' is not in the vocabulary" in panel.info.text())


def test_a_new_snapshot_refreshes_the_bars_and_reset_clears_them(qtbot, hub, snap, backend):
    panel = show(qtbot, NextCharPanel(hub))
    hub.set_snapshot(snap)
    with qtbot.waitSignal(panel.distributionShown, check_params_cb=lambda d: d.prefix == "l", timeout=5000):
        panel.set_prefix("l")
    later = engine.open_backend("numpy", backend.model, backend.train_config, backend.corpus)
    later.set_state(backend.get_state())
    later.train(40)
    newer = ins.Snapshot.from_backend(later)
    later.close()
    with qtbot.waitSignal(panel.distributionShown, check_params_cb=lambda d: d.step == 100, timeout=5000):
        hub.set_snapshot(newer)
    np.testing.assert_allclose(panel.bar_heights()[1], ins.next_char(newer, "l", panel.temperature).probs[
        ins.next_char(newer, "l", panel.temperature).ranked()])
    # the completions follow too: at most once a second, but the newest parameters always get their turn
    qtbot.waitUntil(lambda: panel.completions_step == 100, timeout=5000)
    assert [c.text for c in panel.completions] == [c.text for c in ins.complete(newer, "l", 5, panel.temperature)]
    hub.set_snapshot(None)
    assert panel.bar_heights()[1].size == 0 and not panel.sample_button.isEnabled()


def test_attention_view_shows_the_chosen_layer_and_head(qtbot, hub, snap):
    panel = show(qtbot, AttentionPanel(hub))
    hub.set_snapshot(snap)
    assert [panel.layer_combo.itemText(i) for i in range(2)] == ["layer 1", "layer 2"]
    with qtbot.waitSignal(panel.mapsShown, check_params_cb=lambda a: a.text == "emma", timeout=5000):
        panel.set_text("emma")
    want = ins.attention(snap, "emma").maps
    for layer, head in ((0, 0), (1, 1), (1, 0)):
        panel.select(layer, head)
        shown = panel.image.image
        assert shown.shape == (5, 5)
        lower = np.tril_indices(5)
        np.testing.assert_allclose(shown[lower], want[layer, head][lower])
        assert np.isnan(shown[np.triu_indices(5, 1)]).all()  # drawn blank
    panel.set_text("")  # nothing to show, and says so
    assert panel.shown_matrix() is None and "Type a name" in panel.info.text()
    with qtbot.waitSignal(panel.mapsShown, timeout=5000):
        panel.set_text("emma")
    ticks = panel.plot.getPlotItem().getAxis("bottom")._tickLevels[0]
    assert [label for _, label in ticks] == ["start", "e", "m", "m", "a"]

    view = panel.plot.getPlotItem().vb  # hover over row 3 ('m'), column 1 ('e')
    panel._on_mouse_moved(view.mapViewToScene(QPointF(1.5, 3.5)))
    assert f"{want[1, 0, 3, 1]:.3f}" in panel.readout.text() and "'m' (position 3)" in panel.readout.text()
    panel._on_mouse_moved(view.mapViewToScene(QPointF(4.5, 1.5)))
    assert "cannot see" in panel.readout.text()


def test_char_map_has_one_labelled_point_per_character_and_marks_vowels(qtbot, hub, snap, backend):
    panel = show(qtbot, CharMapPanel(hub))
    with qtbot.waitSignal(panel.mapShown, timeout=5000):
        hub.set_snapshot(snap)
    chars = backend.corpus.chars
    want = ins.char_map(snap)
    xs, ys = panel.scatter.getData()
    assert len(xs) == len(chars) == len(panel.labels)
    np.testing.assert_allclose(np.column_stack([xs, ys]), want.points)
    assert [label.toPlainText() for label in panel.labels] == chars
    for label, (x, y) in zip(panel.labels, want.points):
        assert (label.pos().x(), label.pos().y()) == pytest.approx((x, y))
    colors = [point.brush().color().getRgb()[:3] for point in panel.scatter.points()]
    assert colors == [VOWEL_COLOR if ch in "aeiou" else OTHER_COLOR for ch in chars]
    assert "Vowels" in panel.info.text()

    later = engine.open_backend("numpy", backend.model, backend.train_config, backend.corpus)
    later.set_state(backend.get_state())
    later.train(20)
    with qtbot.waitSignal(panel.mapShown, timeout=5000):
        hub.set_snapshot(ins.Snapshot.from_backend(later))
    later.close()
    assert len(panel.history) == 1 and len(panel.trail_curves) == len(chars)  # where each point came from
    trail_x, trail_y = panel.trail_curves[0].getData()  # from the earlier embedding to today's point
    np.testing.assert_allclose([trail_x[0], trail_y[0]], panel.char_map.trails[0, 0])
    np.testing.assert_allclose([trail_x[-1], trail_y[-1]], panel.char_map.points[0])
    panel.trails_check.setChecked(False)
    assert not panel.trail_curves
    panel.trails_check.setChecked(True)
    panel.clear_trails_button.click()
    assert not panel.trail_curves and not panel.history


def test_hidden_panels_wait_until_shown_and_the_hub_knows(qtbot, hub, snap):
    panel = CharMapPanel(hub)
    qtbot.addWidget(panel)
    assert not hub.wants_snapshots
    hub.set_snapshot(snap)
    assert panel.char_map is None and not hub.is_busy()  # nothing computed while hidden
    with qtbot.waitSignal(panel.mapShown, timeout=5000):
        panel.show()
    assert hub.wants_snapshots


def test_every_control_has_an_object_name_and_a_tooltip(qtbot, hub):
    from PySide6.QtWidgets import (QAbstractButton, QAbstractSpinBox, QComboBox, QLineEdit, QListWidget,
                                   QTableWidget)
    import pyqtgraph as pg
    from gui.run_list import RunListPanel
    from gui.scaling_study import ScalingStudyDialog

    study = ScalingStudyDialog(availability=lambda names: {n: (True, "") for n in names}, backends=["numpy"])
    study.plot  # built after the first paint otherwise (test_scaling_study.py)
    panels = [NextCharPanel(hub), AttentionPanel(hub), CharMapPanel(hub), RunListPanel(), study]
    names = set()
    for panel in panels:
        qtbot.addWidget(panel)
        for kind in (QAbstractButton, QAbstractSpinBox, QComboBox, QLineEdit, QListWidget, QTableWidget,
                     pg.PlotWidget):
            for control in panel.findChildren(kind):
                if isinstance(control.parent(), (QAbstractSpinBox, QComboBox, QLineEdit, QTableWidget)):
                    continue  # a spin box's own line edit, a line edit's clear button, a table's corner
                assert control.objectName(), control
                assert control.toolTip(), control.objectName()
                names.add(control.objectName())
    assert {"prefixEdit", "nextCharPlot", "completionsList", "beamWidthSpin", "prefixSampleButton",
            "attentionView", "attentionLayerCombo", "attentionHeadCombo", "charMapPlot", "runList",
            "runOverlayPlot", "runXAxisCombo", "scalingPlot", "scalingTable", "scalingRunButton",
            "scalingCancelButton"} <= names
