"""What the plots look like, checked from pyqtgraph's own drawing instructions:
every tick label lies inside its widget (none cut in half at the top or
right), the empty attention plot has no stray axes, the character map's
labels do not cover each other, and the Runs tab's wording and table size."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6.QtCore import QRectF
from PySide6.QtGui import QImage, QPainter

from engine.model import introspect as ins
from engine.bench.measure import BenchResult
from gui.attention_view import AttentionPanel
from gui.char_map import ANCHORS, CharMapPanel, label_box, place_labels
from gui.inspect_hub import InspectHub
from gui.loss_plot import LossPlot
from gui.next_char_panel import NextCharPanel
from gui.run_list import RunListPanel
from gui.scaling_study import ScalingStudyDialog


def drawn_tick_labels(plot: pg.PlotWidget) -> list[tuple[str, QRectF]]:
    """(text, rectangle in the widget's pixels) of every tick label the plot's axes draw."""
    image = QImage(8, 8, QImage.Format_ARGB32)
    painter = QPainter(image)
    out = []
    try:
        for axis in (i for i in plot.scene().items() if isinstance(i, pg.AxisItem) and i.isVisible()):
            specs = axis.generateDrawSpecs(painter)
            for rect, _flags, text in (specs[2] if specs else []):
                out.append((text, plot.mapFromScene(axis.mapRectToScene(rect)).boundingRect()))
    finally:
        painter.end()
    return out


def assert_tick_labels_inside(plot: pg.PlotWidget) -> None:
    labels = drawn_tick_labels(plot)
    assert labels
    area = plot.viewport().rect()
    outside = [(text, r.getRect()) for text, r in labels if not area.contains(r)]
    assert not outside, f"tick labels cut by the widget's edge {area.getRect()}: {outside}"


@pytest.fixture
def hub():
    hub = InspectHub()
    yield hub
    hub.close()


def shown(qtbot, widget, size=(700, 500)):
    qtbot.addWidget(widget)
    widget.resize(*size)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def settle(qtbot, plot: pg.PlotWidget, y_range, x_range=None) -> None:
    """Range the view to end exactly on a tick at the top (the worst case), then lay out."""
    view = plot.getPlotItem().getViewBox()
    view.setRange(xRange=x_range, yRange=y_range, padding=0)
    qtbot.wait(50)


def test_the_loss_plots_top_and_right_tick_labels_are_whole(qtbot):
    plot = shown(qtbot, LossPlot())
    plot.append(np.linspace(3.5, 2.0, 1000), 0)
    plot.flush()
    settle(qtbot, plot.plot, (2.0, 3.5), (0, 1000))
    assert_tick_labels_inside(plot.plot)


def test_the_next_character_plots_top_label_is_whole(qtbot, hub):
    panel = shown(qtbot, NextCharPanel(hub), (820, 600))
    settle(qtbot, panel.plot, (0, 0.2), (-0.6, 26.6))
    assert "0.20" in [text for text, _ in drawn_tick_labels(panel.plot)]
    assert_tick_labels_inside(panel.plot)


def test_the_attention_colour_bars_top_label_is_whole_and_the_empty_plot_has_no_axes(qtbot, hub):
    panel = shown(qtbot, AttentionPanel(hub), (640, 600))
    labels = drawn_tick_labels(panel.plot)
    # the colour bar's 0 .. 1.0 only: no -600 .. 600, no "(x0.001)" on an empty plot
    assert sorted(text for text, _ in labels) == ["0", "0.2", "0.4", "0.6", "0.8", "1.0"]
    axes = panel.plot.getPlotItem()
    assert all("0.001" not in axes.getAxis(side).labelString() for side in ("left", "bottom"))
    assert_tick_labels_inside(panel.plot)


def test_the_runs_and_scaling_plots_top_labels_are_whole(qtbot):
    runs = shown(qtbot, RunListPanel(), (820, 560))
    settle(qtbot, runs.plot, (2.0, 3.5), (0, 1000))
    assert_tick_labels_inside(runs.plot)
    study = ScalingStudyDialog(availability=lambda names: {n: (True, "") for n in names}, backends=["numpy"],
                               presets=["tiny"])
    shown(qtbot, study, (1160, 600))
    study.add_result(BenchResult("numpy", "tiny", "ok", params=4192, ms_per_step=0.2, steps_per_s=5000.0))
    study.add_result(BenchResult("numpy", "s32", "ok", params=27328, ms_per_step=1.0, steps_per_s=1000.0))
    settle(qtbot, study.plot, (np.log10(0.2), 0.0), (np.log10(4192), np.log10(27328)))
    assert_tick_labels_inside(study.plot)


def test_the_runs_tab_names_its_time_axis_as_the_axis_does_and_shows_six_runs(qtbot):
    panel = shown(qtbot, RunListPanel(), (820, 560))
    panel.set_x_axis("seconds")
    axis_label = panel.plot.getPlotItem().getAxis("bottom").labelString()
    assert panel.x_axis_combo.currentText() == "training time" and "training time" in axis_label
    assert panel.table.viewport().height() >= 6 * panel.table.verticalHeader().defaultSectionSize()


def test_labels_take_the_side_where_they_cover_nothing():
    """Three points a few px apart (the vowels 'i', 'a', 'e' late in training) get labels
    that cover neither each other nor the other points; a lone point keeps the first side."""
    points = np.array([[100.0, 100.0], [112.0, 102.0], [108.0, 112.0], [400.0, 300.0]])
    sizes = np.array([[12.0, 22.0]] * 4)
    anchors = place_labels(points, sizes, [0, 1, 2, 3])
    assert anchors[3] == ANCHORS[0] and len(set(anchors[:3])) == 3
    boxes = [QRectF(l, t, r - l, b - t) for l, t, r, b in (label_box(*z) for z in zip(points, sizes, anchors))]
    assert not any(a.intersects(b) for k, a in enumerate(boxes) for b in boxes[k + 1:])
    for k, box in enumerate(boxes):
        assert not any(box.contains(*p) for j, p in enumerate(points) if j != k)


def test_the_character_maps_labels_do_not_overlap(qtbot, hub):
    panel = shown(qtbot, CharMapPanel(hub), (700, 600))
    labels = tuple("abcdefghijklmnopqrstuvwxyz")
    points = np.random.default_rng(0).normal(0, 0.5, (26, 2))
    points[labels.index("i")] = (0.50, 0.00)  # where they overlapped in docs/char_map.png
    points[labels.index("a")] = (0.53, 0.01)
    points[labels.index("e")] = (0.52, -0.03)
    m = ins.CharMap(labels, points, np.array([0.4, 0.2]), 1000, np.zeros((26, 4)), np.zeros((0, 26, 2)))
    panel._on_result("charmap", m)
    qtbot.wait(100)
    rects = {label.toPlainText(): label.sceneBoundingRect() for label in panel.labels}
    vowels = [rects[c] for c in "iae"]
    assert not any(a.intersects(b) for k, a in enumerate(vowels) for b in vowels[k + 1:])


LONG = ("/home/someone/a/very/long/path/to/checkpoints/run-2026-12-01/microgpt-s128.ckpt is not a usable "
        "checkpoint (ValueError: the parameter array wte has 1234 rows where the model needs 27)")


def test_a_long_status_message_stops_short_of_the_fields_on_the_right(make_window, names_path, qtbot):
    window = make_window(names_path)
    window.resize(1000, 700)
    qtbot.wait(50)
    window.show_message("error", "Cannot load this checkpoint", LONG)
    bar = window.statusBar()
    text = bar.currentMessage()
    first_field = min(label.x() for label in window.status_labels.values())
    assert text.endswith("…") and LONG.startswith(text[:-1]) and bar.toolTip() == LONG
    assert 6 + bar.fontMetrics().horizontalAdvance(text) < first_field - 8


def test_a_status_message_ends_at_a_word_and_is_elided_again_when_its_room_changes(make_window, names_path, qtbot):
    """Issue 27: messages were cut off mid-word, under the permanent fields, when the
    fields grew or the window narrowed after the message was shown."""
    window = make_window(names_path)
    window.resize(1400, 700)
    qtbot.wait(50)
    bar = window.statusBar()
    text = "Run ended: you can sample, save a checkpoint, continue to more steps or train again"
    bar.showMessage(text, 10_000)
    assert bar.currentMessage() == text and bar.message() == text

    def fits():
        first_field = min(label.x() for label in window.status_labels.values() if label.isVisible())
        return 6 + bar.fontMetrics().horizontalAdvance(bar.currentMessage()) < first_field

    window.status_labels["loss"].setText("Loss " + "9" * 60)  # a field grows
    qtbot.waitUntil(lambda: bar.currentMessage() != text, timeout=2000)
    shown = bar.currentMessage()
    assert fits() and shown.endswith("…") and text.startswith(shown[:-1])
    assert text[len(shown) - 1] in " ,:"  # at the end of a word
    assert bar.message() == bar.toolTip() == text
    window.status_labels["loss"].setText("Loss 2.0")  # room again: the whole message
    qtbot.waitUntil(lambda: bar.currentMessage() == text, timeout=2000)

    # The window narrowed: a message that fits the wide window's room but not the
    # narrowest window's (the window's minimum width and the font decide both rooms).
    wide_room = bar.message_room()
    window.resize(window.minimumSizeHint().width(), 700)
    qtbot.waitUntil(lambda: bar.message_room() < wide_room, timeout=2000)
    narrow_room = bar.message_room()
    window.resize(1400, 700)
    qtbot.waitUntil(lambda: bar.message_room() == wide_room, timeout=2000)
    longer = text
    while bar.fontMetrics().horizontalAdvance(longer) <= narrow_room:
        longer += " and again"
    assert bar.fontMetrics().horizontalAdvance(longer) < wide_room
    bar.showMessage(longer, 10_000)
    assert bar.currentMessage() == longer
    window.resize(window.minimumSizeHint().width(), 700)
    qtbot.waitUntil(lambda: bar.currentMessage() != longer, timeout=2000)
    assert fits() and bar.currentMessage().endswith("…") and bar.message() == longer


def test_a_messages_status_line_goes_when_its_box_is_closed(make_window, names_path, qtbot):
    from PySide6.QtWidgets import QMessageBox

    from gui.dialogs import show_message_box

    window = make_window(names_path)
    window.message_hook = show_message_box  # the real, non-modal box
    window.show_message("error", "Export failed", "could not write /nowhere/loss.csv: Permission denied")
    assert window.statusBar().currentMessage().startswith("could not write")
    box = next(b for b in window.findChildren(QMessageBox) if b.isVisible())
    box.button(QMessageBox.Ok).click()
    qtbot.waitUntil(lambda: window.statusBar().currentMessage() == "", timeout=2000)

    window.show_message("error", "Export failed", "first")
    first = next(b for b in window.findChildren(QMessageBox) if b.isVisible())
    window.statusBar().showMessage("Loss exported to /tmp/x.csv", 10000)  # a newer line
    first.button(QMessageBox.Ok).click()
    qtbot.wait(50)
    assert window.statusBar().currentMessage() == "Loss exported to /tmp/x.csv"  # not someone else's to clear


def test_step_numbers_have_thousands_separators_everywhere(qtbot):
    from gui.sample_panel import SamplePanel

    panel = SamplePanel()
    qtbot.addWidget(panel)
    panel.show_samples(["emma", "ava"], 30000)
    assert panel.info.text() == "2 names from the parameters after step 30,000"
