"""One set of limits (engine.config.FIELD_LIMITS) for what is accepted, saved and
loaded: every value at an edge of what the API (ModelConfig, TrainConfig) or the
command line accepts saves a checkpoint that loads, and one just outside is
refused, with a message naming the field or flag, by each of them and by the
checkpoint reader. (The window's fields: tests/gui/test_field_limits.py.)

Issue 27: a run with learning rate 10 or 10^4, or 10^10 steps, was accepted and
saved, and its checkpoint then refused ("train.learning_rate is 10000, outside
1e-06..1").
"""
from __future__ import annotations

import argparse
import math
from dataclasses import fields, replace

import numpy as np
import pytest

from engine import CheckpointError, ModelConfig, TrainConfig, load_checkpoint, open_backend, read_checkpoint
from engine.cli.args import build_parser, window_parser
from engine.cli.checks import DEMO_FLAGS, demo_configs
from engine.config import FIELD_LIMITS

BASE_MODEL = dict(n_embd=8, n_layer=1, n_head=2, block_size=8)
BASE_TRAIN = TrainConfig(num_steps=3, holdout=0)

# Edges a test cannot afford to train and save for real: those go through the
# checkpoint's own members instead (see test_the_edges_too_large_to_train_are_read).
TOO_LARGE = {("model.n_embd", "high"): "12 x 4096^2 parameters per layer: 2.4 GB with Adam's moments",
             ("train.holdout", "high"): "a run needs more than 10^7 documents"}


def edge(key: str, side: str):
    low, high = FIELD_LIMITS[key]
    return low if side == "low" else high


def beyond(key: str, side: str):
    """The nearest value outside the limit: one less or more, or the next float."""
    value = edge(key, side)
    if isinstance(value, int):
        return value - 1 if side == "low" else value + 1
    return math.nextafter(value, -math.inf if side == "low" else math.inf)


def configs_with(key: str, value) -> tuple[ModelConfig, TrainConfig]:
    """A small run with one field set to value (the model's head count follows n_embd)."""
    section, name = key.split(".")
    if section == "train":
        return ModelConfig(**BASE_MODEL), replace(BASE_TRAIN, **{name: value})
    shape = {**BASE_MODEL, name: value}
    if name == "n_embd":
        shape["n_head"] = 1
    if name == "n_head" and value >= 1:
        shape["n_embd"] = value
    return ModelConfig(**shape), BASE_TRAIN


def save_and_load(model, train, corpus, path):
    """Train a step, save, load: the loaded run's configs."""
    backend = open_backend("numpy", model, train, corpus)
    backend.train(1)
    backend.save(path)
    loaded = load_checkpoint(path)
    assert loaded.step == 1 and np.array_equal(loaded.get_state().params, backend.get_state().params)
    return loaded.model, loaded.train_config


EDGES = [(key, side) for key in FIELD_LIMITS for side in ("low", "high")]
AFFORDABLE = [e for e in EDGES if e not in TOO_LARGE]


def test_every_setting_has_its_limits_and_every_limit_a_setting():
    settings = {f"model.{f.name}" for f in fields(ModelConfig)} | {f"train.{f.name}" for f in fields(TrainConfig)}
    assert set(FIELD_LIMITS) == settings
    for key, (low, high) in FIELD_LIMITS.items():
        assert type(low) is type(high) and low < high, key
        if isinstance(low, int):  # the window's spin boxes hold 32-bit ints
            assert -2**31 <= low and high <= 2**31 - 1, key


# ---- the API ----------------------------------------------------------------

@pytest.mark.parametrize("key, side", AFFORDABLE)
def test_an_edge_value_saves_a_checkpoint_that_loads(key, side, small_corpus, tmp_path):
    model, train = configs_with(key, edge(key, side))
    assert save_and_load(model, train, small_corpus, tmp_path / "edge.npz") == (model, train)


@pytest.mark.parametrize("key, side", sorted(TOO_LARGE))
def test_the_edges_too_large_to_train_are_read(key, side, small_corpus, small_model, tmp_path):
    """The value written into a saved checkpoint's member: the reader takes the
    configuration (n_embd 4096 then fails on the parameters' size, as it must)."""
    path = tmp_path / "edge.npz"
    backend = open_backend("numpy", small_model, BASE_TRAIN, small_corpus)
    backend.train(1)
    backend.save(path)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays[key] = np.asarray(edge(key, side))
    np.savez(path, **arrays)
    if key == "model.n_embd":
        with pytest.raises(CheckpointError) as info:
            read_checkpoint(path)
        assert "'params' has" in str(info.value) and "invalid configuration" not in str(info.value)
    else:
        assert read_checkpoint(path).train.holdout == edge(key, side)


@pytest.mark.parametrize("key, side", EDGES)
def test_a_value_just_outside_is_refused_by_the_api_and_the_reader(key, side, small_corpus, small_model, tmp_path):
    name, value = key.split(".")[1], beyond(key, side)
    with pytest.raises(ValueError) as info:
        configs_with(key, value)
    words = "at least" if side == "low" else "at most"
    assert str(info.value).startswith(f"{name} must be {words} "), str(info.value)
    # the same value in a checkpoint: refused when read, in the same words
    path = tmp_path / "outside.npz"
    backend = open_backend("numpy", small_model, BASE_TRAIN, small_corpus)
    backend.train(1)
    backend.save(path)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays[key] = np.asarray(value)
    np.savez(path, **arrays)
    with pytest.raises(CheckpointError) as refused:
        read_checkpoint(path)
    assert str(refused.value) == f"{path} holds an invalid configuration: {info.value}"


@pytest.mark.parametrize("model, train, message", [
    (dict(block_size=10**12), {}, "block_size must be at most 4,096, got 1,000,000,000,000"),
    ({}, dict(init_std=1e19), "init_std must be at most 1, got 1e+19"),
    ({}, dict(learning_rate=10), "learning_rate must be at most 1, got 10"),
    ({}, dict(learning_rate=1e4), "learning_rate must be at most 1, got 10000"),
    ({}, dict(num_steps=10**10), "num_steps must be at most 10,000,000, got 10,000,000,000"),
])
def test_the_issues_values_are_refused_before_a_run(model, train, message):
    with pytest.raises(ValueError) as info:
        ModelConfig(**{**BASE_MODEL, **model}), TrainConfig(**train)
    assert str(info.value) == message


ISSUE_CALLS = """
import sys
sys.path.insert(0, sys.argv[1])
import engine
corpus = engine.Corpus.from_lines(["anna", "bob", "carla"])
for shape, train in [(dict(block_size=10**12), {}), ({}, dict(init_std=1e19))]:
    try:
        engine.open_backend("numpy", engine.ModelConfig(**shape), engine.TrainConfig(**train), corpus)
    except ValueError as exc:
        print(type(exc).__name__, exc)
"""


def test_the_issues_raw_errors_are_value_errors_in_a_real_process(tmp_path):
    """block_size 10^12 through the API was a raw OverflowError (Python integer out of
    bounds for int32), init std 1e19 a NumPy RuntimeWarning on stderr."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", ISSUE_CALLS, str(root)], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines() == ["ValueError block_size must be at most 4,096, got 1,000,000,000,000",
                                          "ValueError init_std must be at most 1, got 1e+19"]


# ---- the command line ---------------------------------------------------------

FLAGS = {f"train.{name}": flag for name, flag in DEMO_FLAGS.items() if f"train.{name}" in FIELD_LIMITS}


def demo_args(flag: str, value) -> argparse.Namespace:
    return build_parser().parse_args(["demo", "--preset", "tiny", "--holdout", "0", flag, str(value)])


def test_every_demo_flag_of_a_setting_is_checked_here():
    assert set(FLAGS.values()) == {"--steps", "--lr", "--init-std", "--seed", "--warmup-steps", "--batch",
                                   "--holdout"}


@pytest.mark.parametrize("key, side", [(k, s) for k in FLAGS for s in ("low", "high")])
def test_a_demo_flag_at_its_edge_saves_a_checkpoint_that_loads(key, side, small_corpus, tmp_path):
    value = edge(key, side)
    model, train = demo_configs(demo_args(FLAGS[key], value))
    assert getattr(train, key.split(".")[1]) == value
    if (key, side) in TOO_LARGE:
        return  # its configuration is the API's, read above
    assert save_and_load(model, train, small_corpus, tmp_path / "demo.npz") == (model, train)


@pytest.mark.parametrize("key, side", [(k, s) for k in FLAGS for s in ("low", "high")])
def test_a_demo_flag_just_outside_is_one_line(key, side, capsys):
    value = beyond(key, side)
    with pytest.raises(SystemExit) as info:
        demo_args(FLAGS[key], repr(value) if isinstance(value, float) else value)
    assert info.value.code == 2
    words = "at least" if side == "low" else "at most"
    err = capsys.readouterr().err
    assert err.startswith(f"error: {FLAGS[key]} must be {words} ") and err.count("\n") == 1, err


@pytest.mark.parametrize("argv, parse", [
    (["--autorun-steps"], lambda argv: window_parser().parse_args(argv).autorun_steps),
    (["bench", "--to-loss", "2", "--run-steps"], lambda argv: build_parser().parse_args(argv).run_steps),
])
def test_the_other_step_counts_take_the_run_limits(argv, parse, capsys):
    low, high = FIELD_LIMITS["train.num_steps"]
    assert parse([*argv, str(low)]) == low and parse([*argv, str(high)]) == high
    with pytest.raises(SystemExit):
        parse([*argv, str(high + 1)])
    assert capsys.readouterr().err.strip().endswith(f"must be at most {high:,}, got {high + 1:,}")
