"""engine.checkpoint: resume equals an uninterrupted run; atomic writes; every
kind of bad file is a CheckpointError that says what is wrong."""
from __future__ import annotations

import io
import os
import zipfile

import numpy as np
import pytest

from engine import (CheckpointError, TrainConfig, load_checkpoint, open_backend,
                    read_checkpoint, save_checkpoint)

TRAIN = TrainConfig(num_steps=30, learning_rate=0.02, seed=9)


@pytest.fixture
def run(small_corpus, small_model):
    """A backend trained for 6 steps."""
    b = open_backend("numpy", small_model, TRAIN, small_corpus)
    b.train(6)
    return b


@pytest.fixture
def saved(run, tmp_path):
    path = tmp_path / "run.npz"
    run.save(path)
    return path


def test_resume_gives_the_same_next_losses(run, saved, small_corpus, small_model):
    uninterrupted = open_backend("numpy", small_model, TRAIN, small_corpus)
    expected = uninterrupted.train(16)
    resumed = load_checkpoint(saved, backend="numpy")
    assert resumed.step == 6
    assert np.array_equal(resumed.loss_history, expected[:6])
    assert np.array_equal(resumed.train(10), expected[6:])
    assert np.array_equal(resumed.get_state().params, uninterrupted.get_state().params)
    assert np.array_equal(resumed.loss_history, expected)


def test_checkpoint_holds_configs_vocab_docs_and_moments(run, saved, small_corpus, small_model):
    ck = read_checkpoint(saved)
    assert ck.model == small_model and ck.train == TRAIN and ck.step == 6 and ck.backend == "numpy"
    assert ck.corpus.docs == small_corpus.docs and ck.corpus.chars == small_corpus.chars
    state = run.get_state()
    for name in ("params", "m", "v"):
        assert np.array_equal(getattr(ck, name), getattr(state, name)), name
    assert np.any(ck.m != 0) and np.any(ck.v != 0)  # Adam moments are really saved
    assert np.array_equal(ck.losses, run.loss_history)


def test_load_checkpoint_can_extend_the_run(saved):
    resumed = load_checkpoint(saved, num_steps=60)
    assert resumed.train_config.num_steps == 60 and resumed.step == 6
    with pytest.raises(ValueError, match="below"):
        load_checkpoint(saved, num_steps=5)


def test_save_at_step_zero_and_at_the_end(small_corpus, small_model, tmp_path):
    b = open_backend("numpy", small_model, TrainConfig(num_steps=3), small_corpus)
    b.save(tmp_path / "zero.npz")
    assert load_checkpoint(tmp_path / "zero.npz").step == 0
    b.train(3)
    b.save(tmp_path / "end.npz")
    done = load_checkpoint(tmp_path / "end.npz")
    assert done.step == 3 and done.finished and len(done.train(1)) == 0


# ---- atomic write -------------------------------------------------------------------

def test_save_leaves_no_temp_files(run, tmp_path):
    folder = tmp_path / "ck"
    save_checkpoint(folder / "a.npz", run)  # creates the folder
    run.save(folder / "a.npz")  # overwrite
    assert sorted(os.listdir(folder)) == ["a.npz"]


def test_existing_file_is_replaced_whole(run, tmp_path):
    path = tmp_path / "run.npz"
    path.write_bytes(os.urandom(1 << 20))  # larger than the checkpoint
    run.save(path)
    fresh = tmp_path / "fresh.npz"
    run.save(fresh)
    assert path.read_bytes() == fresh.read_bytes()
    assert read_checkpoint(path).step == 6


def test_failed_save_keeps_the_old_file(run, tmp_path, monkeypatch):
    path = tmp_path / "run.npz"
    run.save(path)
    old = path.read_bytes()
    run.train(2)

    def broken_savez(file, **arrays):
        file.write(b"PK partial")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken_savez)
    with pytest.raises(OSError, match="disk full"):
        run.save(path)
    assert path.read_bytes() == old
    assert sorted(os.listdir(tmp_path)) == ["run.npz"]


# ---- bad files ---------------------------------------------------------------------

def contents(path) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def write_npz(path, arrays: dict):
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nope.npz")


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.1])
def test_truncated_file(saved, keep):
    data = saved.read_bytes()
    saved.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(saved)
    assert "truncated or corrupt" in str(info.value) and str(saved) in str(info.value)


@pytest.mark.parametrize("size", [0, 17, 5000])
def test_random_bytes(tmp_path, size):
    path = tmp_path / "noise.npz"
    path.write_bytes(np.random.default_rng(size).bytes(size))
    with pytest.raises(CheckpointError, match="not a readable"):
        load_checkpoint(path)


@pytest.mark.parametrize("where", [0, 200], ids=["npy-header", "array-data"])
def test_corrupted_member_inside_the_zip(saved, where):
    data = bytearray(saved.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as z:
        info = z.getinfo("params.npy")
    local = info.header_offset  # the local header's own name/extra lengths locate the data
    name_len, extra_len = (int.from_bytes(data[local + i : local + i + 2], "little") for i in (26, 28))
    start = local + 30 + name_len + extra_len + where
    data[start : start + 8] = bytes(b ^ 0xFF for b in data[start : start + 8])
    saved.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(saved)


@pytest.mark.parametrize("key", ["m", "params", "docs", "chars", "model.n_embd", "train.seed",
                                 "step", "format_version"])
def test_missing_key_is_named(saved, key):
    arrays = contents(saved)
    del arrays[key]
    write_npz(saved, arrays)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(saved)
    assert f"'{key}'" in str(info.value)


def test_a_plain_npz_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "other.npz"
    write_npz(path, {"weights": np.zeros(3)})
    with pytest.raises(CheckpointError, match="not a microgpt-gui checkpoint"):
        load_checkpoint(path)


def test_mismatched_parameter_count(saved, small_model):
    arrays = contents(saved)
    arrays["params"] = arrays["params"][:-1]
    write_npz(saved, arrays)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(saved)
    message = str(info.value)
    assert "'params'" in message and "parameters" in message
    n = small_model.num_params(len(str(arrays["chars"])) + 1)  # vocabulary = chars + bos
    assert str(n - 1) in message and str(n) in message


def test_model_config_that_does_not_match_the_arrays(saved):
    arrays = contents(saved)
    arrays["model.n_layer"] = np.asarray(3)  # arrays are for 2 layers
    write_npz(saved, arrays)
    with pytest.raises(CheckpointError, match="parameters"):
        load_checkpoint(saved)


def test_invalid_config_inside(saved):
    arrays = contents(saved)
    arrays["model.n_head"] = np.asarray(3)  # 8 is not divisible by 3
    write_npz(saved, arrays)
    with pytest.raises(CheckpointError, match="divisible"):
        load_checkpoint(saved)


def test_step_and_history_must_agree(saved):
    arrays = contents(saved)
    arrays["step"] = np.asarray(7)  # history has 6 losses
    write_npz(saved, arrays)
    with pytest.raises(CheckpointError, match="step 7"):
        load_checkpoint(saved)


def test_wrong_dtype_is_rejected(saved):
    arrays = contents(saved)
    arrays["v"] = arrays["v"].astype(np.float64)
    write_npz(saved, arrays)
    with pytest.raises(CheckpointError, match="'v'.*float32"):
        load_checkpoint(saved)


def test_newer_format_version(saved):
    arrays = contents(saved)
    arrays["format_version"] = np.asarray(99)
    write_npz(saved, arrays)
    with pytest.raises(CheckpointError, match="format 99"):
        load_checkpoint(saved)
