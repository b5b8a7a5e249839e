"""The settings column's training fields, on the panel alone: the warm-up field."""
from __future__ import annotations

from PySide6.QtCore import QSettings

import engine
from gui.config_panel import ConfigPanel


def make_panel(qtbot) -> ConfigPanel:
    panel = ConfigPanel()
    qtbot.addWidget(panel)
    return panel


def test_warmup_follows_the_preset_and_reaches_the_train_config(qtbot):
    panel = make_panel(qtbot)
    assert panel.preset_combo.currentText() == "tiny"
    assert panel.warmup_spin.value() == 0 and panel.warmup_spin.text() == "none"
    assert panel.train_config() == engine.PRESETS["tiny"].train  # microgpt's, warm-up included
    panel.preset_combo.setCurrentText("gpt2-small")
    assert panel.warmup_spin.value() == engine.PRESETS["gpt2-small"].train.warmup_steps > 0
    assert panel.train_config() == engine.PRESETS["gpt2-small"].train
    panel.warmup_spin.setValue(1234)
    assert panel.warmup_spin.text() == "1,234" and panel.train_config().warmup_steps == 1234


def test_a_loaded_runs_warmup_is_shown(qtbot):
    panel = make_panel(qtbot)
    train = engine.TrainConfig(num_steps=500, warmup_steps=25)
    panel.set_configs(engine.ModelConfig(), train)
    assert panel.warmup_spin.value() == 25 and panel.train_config() == train


def test_the_longest_warmup_fits_the_field(qtbot):
    """A checkpoint held up to 10^12 warm-up steps, past a spin box's int range; it
    holds at most engine.config's limit now, and the field shows that."""
    panel = make_panel(qtbot)
    most = engine.config.FIELD_LIMITS["train.warmup_steps"][1]
    panel.set_configs(engine.ModelConfig(), engine.TrainConfig(num_steps=500, warmup_steps=most))
    assert panel.warmup_spin.value() == most


def test_the_warmup_persists_in_the_settings(qtbot, tmp_path):
    settings = QSettings(str(tmp_path / "panel.ini"), QSettings.IniFormat)
    panel = make_panel(qtbot)
    panel.warmup_spin.setValue(40)
    panel.save_settings(settings)
    again = make_panel(qtbot)
    again.restore_settings(settings)
    assert again.train_config().warmup_steps == 40


def test_learn_is_listed_first_and_tiny_selected(qtbot):
    """learn, the preset for learning, was last in the combo (issue 27); a first start
    still selects microgpt's tiny."""
    panel = make_panel(qtbot)
    combo = panel.preset_combo
    assert [combo.itemText(i) for i in range(combo.count())] == list(engine.PRESETS)
    assert combo.itemText(0) == "learn" and combo.currentText() == "tiny"
    assert panel.model_config() == engine.PRESETS["tiny"].model
