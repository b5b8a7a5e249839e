"""engine.config: validation of ModelConfig / TrainConfig and the presets."""
from __future__ import annotations

import math

import pytest

from engine import PRESETS, ModelConfig, TrainConfig, get_preset, num_params

NAMES_VOCAB = 27  # 26 letters + bos, as in microgpt on names.txt


def architecture_param_count(c: int, n_layer: int, block_size: int, vocab: int) -> int:
    """Count from the architecture: wte (V,C), wpe (B,C), lm_head (V,C), and per
    layer wq, wk, wv, wo (C,C), fc1 (4C,C), fc2 (C,4C)."""
    per_layer = 4 * (c * c) + (4 * c) * c + c * (4 * c)
    return vocab * c + block_size * c + vocab * c + n_layer * per_layer


def assert_refused_naming(config_class, kwargs: dict, words: list[str]) -> None:
    """config_class(**kwargs) raises a ValueError whose message holds every word."""
    with pytest.raises(ValueError) as info:
        config_class(**kwargs)
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} missing from {message!r}"


# ---- invalid model configs --------------------------------------------------

@pytest.mark.parametrize("kwargs, words", [
    (dict(n_embd=16, n_head=3), ["n_embd", "16", "divisible", "n_head", "3"]),
    (dict(n_embd=10, n_head=4), ["n_embd", "divisible", "n_head"]),
    (dict(n_embd=0), ["n_embd", "at least 1"]),
    (dict(n_embd=-8), ["n_embd", "-8"]),
    (dict(n_layer=0), ["n_layer", "at least 1"]),
    (dict(n_head=0), ["n_head", "at least 1"]),
    (dict(block_size=1), ["block_size", "at least 2"]),
    (dict(block_size=0), ["block_size"]),
    (dict(n_embd=16.0), ["n_embd", "whole number"]),
    (dict(n_layer="2"), ["n_layer", "whole number"]),
    (dict(n_head=True), ["n_head", "whole number"]),
    (dict(block_size=None), ["block_size", "whole number"]),
    (dict(block_size=10**12), ["block_size must be at most 4,096, got 1,000,000,000,000"]),
    (dict(n_embd=8192, n_head=8), ["n_embd must be at most 4,096, got 8,192"]),
    (dict(n_layer=10**8), ["n_layer must be at most 96, got 100,000,000"]),
])
def test_invalid_model_config_raises_value_error_naming_the_field(kwargs, words):
    assert_refused_naming(ModelConfig, kwargs, words)


@pytest.mark.parametrize("kwargs, words", [
    (dict(num_steps=0), ["num_steps", "at least 1"]),
    (dict(num_steps=-5), ["num_steps"]),
    (dict(num_steps=10.0), ["num_steps", "whole number"]),
    (dict(num_steps=True), ["num_steps", "whole number"]),
    (dict(num_steps=10**10), ["num_steps must be at most 10,000,000, got 10,000,000,000"]),
    (dict(learning_rate=0.0), ["learning_rate must be at least 1e-06, got 0"]),
    (dict(learning_rate=-1e-3), ["learning_rate", "at least"]),
    (dict(learning_rate=float("nan")), ["learning_rate", "finite number", "nan"]),
    (dict(learning_rate="0.01"), ["learning_rate", "number", "'0.01'"]),
    (dict(learning_rate=10), ["learning_rate must be at most 1, got 10"]),  # issue 27: saved, then not loaded
    (dict(learning_rate=1e4), ["learning_rate must be at most 1, got 10000"]),
    (dict(init_std=0.0), ["init_std", "at least 0.0001"]),
    (dict(init_std=1e19), ["init_std must be at most 1, got 1e+19"]),  # issue 27: an overflow warning
    (dict(eps=0.0), ["eps", "at least 1e-30"]),
    (dict(beta1=1.0), ["beta1 must be at most 0.999999, got 1"]),
    (dict(beta1=-0.1), ["beta1 must be at least 0, got -0.1"]),
    (dict(beta2=1.5), ["beta2", "at most 0.999999"]),
    (dict(beta2=float("nan")), ["beta2", "finite"]),
    (dict(seed=-1), ["seed must be at least 0, got -1"]),
    (dict(seed=1.5), ["seed", "whole number"]),
    (dict(seed=2**31), ["seed must be at most 2,147,483,647, got 2,147,483,648"]),
    (dict(warmup_steps=-1), ["warmup_steps must be at least 0, got -1"]),
    (dict(warmup_steps=2.5), ["warmup_steps", "whole number", "2.5"]),
    (dict(warmup_steps=True), ["warmup_steps", "whole number"]),
    (dict(warmup_steps="10"), ["warmup_steps", "whole number", "'10'"]),
    (dict(warmup_steps=10**12 + 1), ["warmup_steps must be at most 10,000,000, got 1,000,000,000,001"]),
    (dict(batch_size=4097), ["batch_size must be at most 4,096, got 4,097"]),
    (dict(holdout=-1), ["holdout must be at least 0, got -1"]),
    (dict(holdout=10**7 + 1), ["holdout must be at most 10,000,000"]),
])
def test_invalid_train_config_raises_value_error_naming_the_field(kwargs, words):
    assert_refused_naming(TrainConfig, kwargs, words)


def test_num_steps_is_capped():
    from engine.config import MAX_NUM_STEPS

    assert TrainConfig(num_steps=MAX_NUM_STEPS).num_steps == MAX_NUM_STEPS
    with pytest.raises(ValueError, match=r"num_steps must be at most 10,000,000") as info:
        TrainConfig(num_steps=MAX_NUM_STEPS + 1)
    assert f"{MAX_NUM_STEPS + 1:,}" in str(info.value)


@pytest.mark.parametrize("name", ["learning_rate", "init_std", "eps"])
def test_infinite_positive_values_are_rejected(name):
    # inf passes a plain "> 0" check but turns every parameter into inf/NaN.
    with pytest.raises(ValueError, match=name):
        TrainConfig(**{name: float("inf")})


def test_valid_edge_values_are_accepted():
    ModelConfig(n_embd=1, n_layer=1, n_head=1, block_size=2)
    TrainConfig(num_steps=1, beta1=0.0, beta2=0.0, seed=0)


def test_lr_schedule_is_microgpts_linear_decay():
    """Without warm-up (the default) the rate is microgpt's expression, bit for
    bit, so runs are the same as before warm-up existed."""
    tc = TrainConfig(num_steps=200, learning_rate=0.01)
    assert tc.warmup_steps == 0
    for step in range(200):
        assert tc.lr_at(step) == 0.01 * (1 - step / 200)


def test_warmup_ramps_linearly_then_the_decay_takes_over():
    tc = TrainConfig(num_steps=100, learning_rate=0.5, warmup_steps=8)
    decay = lambda step: 1 - step / 100  # noqa: E731
    assert tc.lr_at(0) == pytest.approx(0.5 / 8 * decay(0), rel=1e-15)
    assert tc.lr_at(3) == pytest.approx(0.5 * 4 / 8 * decay(3), rel=1e-15)
    for step in (7, 8, 50, 99):  # full rate from step warmup_steps - 1 on
        assert tc.lr_at(step) == pytest.approx(0.5 * decay(step), rel=1e-15)
    ramp = [tc.lr_at(step) for step in range(8)]
    assert ramp == sorted(ramp) and len(set(ramp)) == 8
    assert TrainConfig(num_steps=100, warmup_steps=1).lr_at(0) == TrainConfig(num_steps=100).lr_at(0)


def test_a_warmup_longer_than_the_run_never_reaches_the_full_rate():
    tc = TrainConfig(num_steps=10, learning_rate=1.0, warmup_steps=40)
    assert max(tc.lr_at(step) for step in range(10)) < 10 / 40
    assert tc.lr_factor(4) == pytest.approx(5 / 40 * (1 - 4 / 10), rel=1e-15)


# ---- presets ----------------------------------------------------------------

PRESET_SHAPES = {  # name: (n_embd, n_layer, n_head, block_size), from issue 2
    "tiny": (16, 1, 4, 16),
    "s32": (32, 2, 4, 32),
    "s64": (64, 3, 4, 64),
    "s128": (128, 4, 4, 128),
    "s256": (256, 6, 8, 256),
    "gpt2-small": (768, 12, 12, 1024),
    "learn": (32, 2, 4, 16),  # issue 18: the preset for learning, 32 names per step
}


def test_learn_is_listed_first_and_tiny_stays_the_default():
    """learn, the preset for learning, was last in every list (issue 27)."""
    from engine.config import DEFAULT_PRESET

    assert list(PRESETS) == ["learn", "tiny", "s32", "s64", "s128", "s256", "gpt2-small"]
    assert DEFAULT_PRESET == "tiny"


def test_presets_are_exactly_the_issues_list():
    assert set(PRESETS) == set(PRESET_SHAPES)


@pytest.mark.parametrize("name", list(PRESET_SHAPES))
def test_preset_shapes_and_param_counts(name):
    preset = get_preset(name)
    m = preset.model
    assert (m.n_embd, m.n_layer, m.n_head, m.block_size) == PRESET_SHAPES[name]
    expected = architecture_param_count(m.n_embd, m.n_layer, m.block_size, NAMES_VOCAB)
    assert m.num_params(NAMES_VOCAB) == expected
    assert num_params(m, NAMES_VOCAB) == expected
    # every preset's defaults are themselves valid configs
    assert preset.train.num_steps >= 1 and 0 < preset.train.learning_rate
    assert math.isfinite(preset.train.init_std) and preset.train.init_std > 0


def test_named_param_counts_from_the_issue():
    count = lambda name: architecture_param_count(  # noqa: E731
        *(PRESET_SHAPES[name][i] for i in (0, 1, 3)), NAMES_VOCAB)
    assert count("tiny") == 4192
    assert PRESETS["tiny"].model.num_params(NAMES_VOCAB) == 4192
    assert PRESETS["s128"].model.num_params(NAMES_VOCAB) == pytest.approx(810_000, rel=0.005)
    assert PRESETS["gpt2-small"].model.num_params(NAMES_VOCAB) == pytest.approx(85.8e6, rel=0.001)
    assert count("s128") == PRESETS["s128"].model.num_params(NAMES_VOCAB)


def test_tiny_keeps_microgpts_hyperparameters():
    tc = PRESETS["tiny"].train
    assert (tc.learning_rate, tc.init_std, tc.beta1, tc.beta2, tc.eps) == (0.01, 0.08, 0.85, 0.99, 1e-8)
    assert tc.warmup_steps == 0  # microgpt's schedule: the full rate from the first step


def test_larger_presets_use_smaller_steps_than_microgpt():
    # microgpt's lr 0.01 / std 0.08 diverge on the wider networks (issue 2).
    for name in ("s64", "s128", "s256", "gpt2-small"):
        tc = PRESETS[name].train
        assert tc.learning_rate < 0.01 and tc.init_std < 0.08, name


def test_unknown_preset_lists_the_choices():
    with pytest.raises(ValueError) as info:
        get_preset("huge")
    assert "huge" in str(info.value) and "tiny" in str(info.value) and "gpt2-small" in str(info.value)


def test_with_steps_changes_only_num_steps():
    p = PRESETS["s32"].with_steps(7)
    assert p.train.num_steps == 7 and p.model == PRESETS["s32"].model
    assert p.train.learning_rate == PRESETS["s32"].train.learning_rate
