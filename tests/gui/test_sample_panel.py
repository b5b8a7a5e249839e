"""The Samples panel's Max length box: "auto" asks for the engine's default,
a number cuts the names there, and the box stops at the opened model's
block_size. Checked against engine runs of the same configuration."""
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QListWidget, QPushButton, QSpinBox

import engine
from gui.sample_panel import SamplePanel

TIMEOUT_MS = 60_000


def test_auto_and_a_number_are_what_the_request_carries(qtbot):
    panel = SamplePanel()
    qtbot.addWidget(panel)
    box = panel.findChild(QSpinBox, "sampleMaxLengthSpin")
    assert box.text() == "auto" and panel.max_length is None
    with qtbot.waitSignal(panel.sampleRequested) as request:
        panel.request()
    assert request.args[3] is None
    box.setValue(7)
    with qtbot.waitSignal(panel.sampleRequested) as request:
        panel.request()
    assert request.args[3] == 7 == panel.max_length
    panel.set_block_size(5)  # a model with shorter names: the choice comes down to it
    assert box.maximum() == 5 and panel.max_length == 5
    box.setValue(0)
    assert box.text() == "auto" and panel.max_length is None


@pytest.mark.parametrize("max_length", [0, 3])
def test_the_window_samples_names_of_at_most_max_length(make_window, names_path, names_corpus, qtbot,
                                                        max_length):
    window = make_window(names_path)

    def widget(cls, name):
        return window.findChild(cls, name)

    widget(QSpinBox, "stepsSpin").setValue(5)
    qtbot.mouseClick(widget(QPushButton, "trainButton"), Qt.LeftButton)
    qtbot.waitUntil(lambda: window.state == "done", timeout=TIMEOUT_MS)
    box = widget(QSpinBox, "sampleMaxLengthSpin")
    assert box.maximum() == 16  # tiny's block_size
    box.setValue(max_length)
    widget(QSpinBox, "sampleCountSpin").setValue(30)
    window.sample_panel.set_temperature(2.0)  # an almost untrained model at 2.0: long names
    samples = widget(QListWidget, "samplesList")
    qtbot.mouseClick(widget(QPushButton, "sampleButton"), Qt.LeftButton)
    qtbot.waitUntil(lambda: samples.count() == 30, timeout=TIMEOUT_MS)
    names = window.sample_panel.names()
    # the same run straight through the engine
    preset = engine.PRESETS["tiny"]
    train = engine.TrainConfig(num_steps=5, learning_rate=preset.train.learning_rate,
                               init_std=preset.train.init_std, seed=preset.train.seed)
    backend = engine.open_backend("numpy", preset.model, train, names_corpus)
    backend.train(5)
    assert names == backend.sample(30, 2.0, 0, max_length=max_length or None)
    # auto: names.txt's longest name (15) + 5, capped at block_size 16, as microgpt samples
    assert max(map(len, names)) == (max_length or 16)


def test_copy_is_enabled_only_with_names(qtbot):
    """Issue 27: Copy was enabled with no names."""
    panel = SamplePanel()
    qtbot.addWidget(panel)
    assert not panel.copy_button.isEnabled()
    panel.show_samples(["emma", "ava"], 10)
    assert panel.copy_button.isEnabled()
    panel.clear()
    assert not panel.copy_button.isEnabled()
