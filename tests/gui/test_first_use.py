"""What a new user meets first (issue 12, items 1-6): keys, the status bar,
names, the plot's legend and margins, the settings column, a run's summary."""
import math
import re
from pathlib import Path

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QImage, QPainter
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QLabel, QListWidget,
                               QProgressBar, QPushButton, QScrollArea, QSlider, QSpinBox, QSplitter)

import engine
from gui.run_control import run_summary
from test_window import TIMEOUT_MS, wait_state

STYLE = Path(__file__).resolve().parents[2] / "resources" / "style.qss"


# 1. keys ------------------------------------------------------------------------------
def test_run_keys_work_every_time_wherever_the_focus_is(make_window, names_path, qtbot):
    window = make_window(names_path)
    window.config_panel.steps_spin.setValue(1_000_000)
    window.activateWindow()
    names = window.findChild(QSpinBox, "sampleCountSpin")
    for target, state in [(window, "running"), (window, "paused"), (names, "running"), (window, "paused"),
                          (window, "running")]:
        qtbot.keyClick(target, Qt.Key_F5)
        wait_state(qtbot, window, state)
    qtbot.keyClick(window, Qt.Key_F5, Qt.ShiftModifier)  # Stop
    wait_state(qtbot, window, "done")
    samples = window.findChild(QListWidget, "samplesList")
    for round_ in range(2):
        qtbot.keyClick(names, Qt.Key_G, Qt.ControlModifier)  # Sample
        qtbot.waitUntil(lambda: window.sample_panel.info.text().startswith("10 names"), timeout=TIMEOUT_MS)
        assert samples.count() == 10
        window.sample_panel.clear()
    qtbot.keyClick(window, Qt.Key_R, Qt.ControlModifier)  # Reset
    wait_state(qtbot, window, "none")
    assert window.loss_plot.series.n == 0
    qtbot.keyClick(window, Qt.Key_F5)  # and F5 starts the next run
    wait_state(qtbot, window, "running")
    assert window.train_button.text() == "Pause"
    run_menu = [a.objectName() for a in window.findChild(QAction, "trainAction").associatedObjects()]
    assert run_menu  # the shortcut lives on the Run menu's action, not on the button


# 2. status bar -----------------------------------------------------------------------
def test_about_leaves_plain_text_in_the_status_bar(make_window, names_path):
    window = make_window(names_path)
    window.findChild(QAction, "aboutAction").trigger()
    assert "<h3>" in window.messages[-1][2]  # the box itself is rich text
    text = window.statusBar().currentMessage()
    assert text == "microgpt-gui" and "<" not in text


# 3. names -----------------------------------------------------------------------------
PROMISED_NAMES = [  # every objectName the tests, scripts or README rely on, with its real type
    (pg.PlotWidget, "lossPlot"), (QComboBox, "presetCombo"), (QComboBox, "backendCombo"),
    *[(QSpinBox, f"{name}Spin") for name in ("n_embd", "n_layer", "n_head", "block_size", "steps", "seed",
                                              "sampleCount", "sampleSeed")],
    (QDoubleSpinBox, "learningRateSpin"), (QDoubleSpinBox, "initStdSpin"),
    *[(QPushButton, f"{name}Button") for name in ("train", "stop", "reset", "sample", "copy", "openDataset")],
    (QListWidget, "samplesList"), (QProgressBar, "progressBar"), (QSlider, "smoothingSlider"),
    (QSlider, "temperatureSlider"), (QCheckBox, "logYCheck"), (QSplitter, "mainSplitter"),
    (QScrollArea, "settingsScroll"),
    *[(QLabel, name) for name in ("datasetPath", "datasetInfo", "paramsLabel", "configError", "sampleInfo",
                                  "plotReadout", "status_backend", "status_params", "status_step",
                                  "status_loss", "status_smoothed")],
    *[(QAction, f"{name}Action") for name in ("openDataset", "saveCheckpoint", "loadCheckpoint", "exportCsv",
                                              "exportPng", "quit", "about", "train", "stop", "reset", "sample")],
]


def test_every_promised_object_name_is_found_on_its_real_type(make_window, names_path):
    window = make_window(names_path)
    for cls, name in PROMISED_NAMES:
        found = window.findChildren(cls, name)
        assert len(found) == 1, f"{len(found)} {cls.__name__} named {name!r}"
    assert window.findChild(pg.PlotWidget, "lossPlot") is window.loss_plot.plot


# 4. legend ----------------------------------------------------------------------------
def test_the_uniform_line_is_named_in_the_legend(make_window, names_path):
    window = make_window(names_path)
    plot = window.loss_plot
    labels = {label.text: sample.item for sample, label in plot.legend.items}
    assert set(labels) == {"loss", "smoothed", "uniform guess, ln 27"}
    sample_pen = labels["uniform guess, ln 27"].opts["pen"]
    assert sample_pen.style() == plot.uniform_line.pen.style() == Qt.DashLine
    assert sample_pen.color() == plot.uniform_line.pen.color()
    assert plot.uniform_line.value() == pytest.approx(math.log(27))


@pytest.mark.parametrize("log_y", [False, True])
def test_an_empty_plot_shows_the_line_its_legend_names(make_window, names_path, qtbot, log_y):
    """Issue 27: the legend of an empty plot listed a line that was off its axes; after
    a run is reset too."""
    window = make_window(names_path)
    plot = window.loss_plot
    plot.set_log_y(log_y)

    def line_in_view():
        low, high = plot.plot.getPlotItem().vb.viewRange()[1]
        return low < plot.uniform_line.value() < high

    qtbot.wait(50)
    assert plot.series.n == 0 and plot.uniform_line.isVisible() and line_in_view()
    window.start_run()
    qtbot.waitUntil(lambda: window.state == "done", timeout=60_000)
    window.reset()
    qtbot.waitUntil(lambda: window.state == "none", timeout=60_000)
    qtbot.wait(50)
    assert plot.series.n == 0 and line_in_view()


# 5. the plot, the settings column, the status bar -----------------------------------------
def test_the_top_y_tick_label_is_inside_the_plot(make_window, names_path, qtbot):
    window = make_window(names_path)
    widget = window.loss_plot.plot
    item = widget.getPlotItem()
    item.vb.setYRange(0, 1, padding=0)  # a tick at the very top of the view
    qtbot.wait(50)
    axis = item.getAxis("left")
    image = QImage(10, 10, QImage.Format_ARGB32)
    painter = QPainter(image)
    try:
        _, _, texts = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    top = min(texts, key=lambda spec: spec[0].top())
    assert top[2] == "1.0"
    rect = widget.mapFromScene(axis.mapRectToScene(top[0])).boundingRect()
    assert rect.top() >= 0, f"the label {top[2]!r} starts {-rect.top()} px above the widget"


def test_a_long_dataset_path_is_elided_in_the_middle(make_window, names_path, tmp_path):
    folder = tmp_path.joinpath(*["a-rather-long-folder-name"] * 6)
    folder.mkdir(parents=True)
    data = folder / "my_names.txt"
    data.write_text(names_path.read_text())
    window = make_window(data)
    label = window.findChild(QLabel, "datasetPath")
    assert label.toolTip() == str(data) and label.path == str(data)
    assert "…" in label.text() and label.text().endswith("my_names.txt") and label.text().startswith("/")
    assert label.fontMetrics().horizontalAdvance(label.text()) <= label.width()


def test_params_are_counted_before_a_run(make_window, names_path):
    window = make_window(names_path)
    expected = engine.PRESETS["tiny"].model.num_params(27)
    assert window.findChild(QLabel, "status_params").text() == f"Params: {expected:,}"
    window.config_panel.fields["n_layer"].setValue(2)
    expected = engine.ModelConfig(16, 2, 4, 16).num_params(27)
    assert window.findChild(QLabel, "status_params").text() == f"Params: {expected:,}"


@pytest.fixture
def app_style(qapp):
    """The window's real style sheet, as `microgpt-gui` applies it."""
    before = qapp.styleSheet()
    qapp.setStyleSheet(STYLE.read_text(encoding="utf-8"))
    yield
    qapp.setStyleSheet(before)


def test_invalid_fields_are_tinted_and_keep_their_arrows(app_style, make_window, names_path, qtbot):
    window = make_window(names_path)
    spin = window.findChild(QSpinBox, "n_embdSpin")

    def arrows() -> np.ndarray:
        """The spin box's right-hand part (its arrow buttons) as grey levels."""
        qtbot.wait(20)  # let the layout settle
        image = spin.grab().toImage().convertToFormat(QImage.Format_Grayscale8)
        width, height = image.width(), image.height()
        pixels = np.frombuffer(image.constBits(), np.uint8).reshape(height, image.bytesPerLine())[:, :width]
        return pixels[:, width - 18:].astype(int)

    valid = arrows()
    spin.setValue(10)  # 10 is not divisible by n_head 4
    assert spin.property("invalid") is True
    invalid = arrows()
    assert (valid < 128).sum() > 10  # the arrows are drawn ...
    assert np.abs(invalid - valid).mean() < 8  # ... and stay when the field is marked
    tint = spin.lineEdit().grab().toImage().pixelColor(4, spin.lineEdit().height() // 2)
    assert tint.red() > tint.green() + 20  # marked by a red tint
    spin.setValue(16)
    assert np.abs(arrows() - valid).max() == 0


def test_a_damaged_installation_message_fits_and_the_dataset_box_has_all_of_it(make_window, qtbot, monkeypatch):
    reason = ("the packaged dataset /usr/lib/python3/site-packages/engine/datasets/names.txt has been "
              "changed (sha256 0123, expected 0a30); reinstall microgpt-gui, or choose a text file of your own")

    def damaged():
        raise engine.DatasetError(reason)

    monkeypatch.setattr(engine, "default_dataset_path", damaged)
    window = make_window(None)
    qtbot.waitUntil(lambda: bool(window.messages), timeout=TIMEOUT_MS)
    assert window.messages[-1][2] == reason
    assert reason in window.config_panel.dataset_info.text()
    status = window.statusBar()
    text = status.currentMessage()
    permanent = sum(label.sizeHint().width() for label in window.status_labels.values())
    assert status.fontMetrics().horizontalAdvance(text) < status.width() - permanent
    assert "Open dataset" in text


# 6. a run is seen and summed up -------------------------------------------------------------
def test_run_summary_reads_like_the_issue():
    assert run_summary(1000, 0.15) == "1,000 steps in 0.15 s (6,700 steps/s)"
    assert run_summary(300, 81.7) == "300 steps in 1:22 min (3.7 steps/s)"


def test_a_default_run_is_followed_from_the_start_and_summed_up(make_window, names_path, qtbot):
    window = make_window(names_path)
    assert window.config_panel.steps_spin.value() == engine.PRESETS["tiny"].train.num_steps == 1000
    first_view = []

    def on_redrawn():
        if window.loss_plot.series.n and not first_view:
            first_view.append((window.loss_plot.series.n, window.loss_plot.plot.getPlotItem().vb.viewRange()[0]))

    window.loss_plot.redrawn.connect(on_redrawn)
    window.findChild(QAction, "trainAction").trigger()
    wait_state(qtbot, window, "done")
    steps_then, (x_min, x_max) = first_view[0]
    assert x_min <= 0 and x_max >= 1000  # the whole run's length was on screen from the first redraw
    message = window.statusBar().currentMessage()
    match = re.match(r"1,000 steps in ([\d.]+) s \(([\d,.]+) steps/s\)\. Run ended", message)
    assert match, message
    seconds, rate = float(match[1]), float(match[2].replace(",", ""))
    assert rate == pytest.approx(1000 / seconds, rel=0.1)
