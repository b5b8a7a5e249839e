"""The window's settings fields hold exactly engine.config.FIELD_LIMITS: every
value at a field's edge makes configs that save a checkpoint that loads, and a
field cannot hold a value outside (it keeps its edge). The API's and the command
line's side: tests/test_limits.py."""
from __future__ import annotations

import pytest

import engine
from engine.config import FIELD_LIMITS
from gui.config_panel import AUTO_HOLDOUT, ConfigPanel

# Too large to train and save in a test (tests/test_limits.py reads their configurations).
TOO_LARGE = {("n_embd", "high"), ("holdout", "high")}


def make_panel(qtbot) -> ConfigPanel:
    panel = ConfigPanel()
    qtbot.addWidget(panel)
    panel.apply_preset("tiny")
    panel.holdout_spin.setValue(0)
    return panel


def spins(panel: ConfigPanel) -> dict:
    return {name: spin for name, spin in panel._named_spins()}


def key_of(name: str) -> str:
    return ("model." if name in engine.ModelConfig.__dataclass_fields__ else "train.") + name


def test_every_field_has_the_engines_range(qtbot):
    panel = make_panel(qtbot)
    for name, spin in spins(panel).items():
        low, high = FIELD_LIMITS[key_of(name)]
        if name == "holdout":
            low = AUTO_HOLDOUT  # the field's "auto" below the engine's 0
        assert (spin.minimum(), spin.maximum()) == (low, high), name


@pytest.mark.parametrize("side", ["low", "high"])
@pytest.mark.parametrize("name", ["n_embd", "n_layer", "n_head", "block_size", "num_steps", "learning_rate",
                                  "init_std", "seed", "warmup_steps", "batch_size", "holdout"])
def test_a_field_at_its_edge_saves_a_checkpoint_that_loads(qtbot, small_corpus, tmp_path, name, side):
    panel = make_panel(qtbot)
    fields = spins(panel)
    low, high = FIELD_LIMITS[key_of(name)]
    value = low if side == "low" else high
    if name == "n_embd":
        fields["n_head"].setValue(1)
    fields[name].setValue(value)
    if name == "n_head":
        fields["n_embd"].setValue(value)
    outside = value + (-1 if side == "low" else 1)
    if name == "holdout" and side == "low":
        outside = AUTO_HOLDOUT - 1  # -1 is the field's "auto" (the engine's default share)
    if outside <= 2**31 - 1:  # the seed's edge is a spin box's own: nothing beyond it can be set
        fields[name].setValue(outside)  # beyond: the field keeps its edge
        assert fields[name].value() == (AUTO_HOLDOUT if name == "holdout" and side == "low" else value)
        fields[name].setValue(value)
    model, train = panel.model_config(), panel.train_config()  # a double field's rounding stays inside
    assert panel.problem() == ""
    if (name, side) in TOO_LARGE:
        return
    backend = engine.open_backend("numpy", model, train, small_corpus)
    backend.train(1)
    backend.save(tmp_path / "edge.npz")
    loaded = engine.load_checkpoint(tmp_path / "edge.npz")
    assert (loaded.model, loaded.train_config) == (model, train)
