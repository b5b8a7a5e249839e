"""engine.training.checkpoint's reading of bad files: every kind of damaged, foreign or
unusable file is a CheckpointError that says what is wrong, found before
anything large is decompressed."""
from __future__ import annotations

import io
import os
import zipfile
from dataclasses import replace

import numpy as np
import pytest

from engine import CheckpointError, load_checkpoint, read_checkpoint
from fifo_support import fifo_refusal


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


def test_corrupted_last_bytes_of_the_data_are_refused(saved):
    """The CRC covers a member's data to its last byte (the data of a stored member
    is read straight from the file, not through zipfile's reader)."""
    data = bytearray(saved.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as z:
        info = z.getinfo("v.npy")
    local = info.header_offset
    name_len, extra_len = (int.from_bytes(data[local + i : local + i + 2], "little") for i in (26, 28))
    end = local + 30 + name_len + extra_len + info.compress_size
    data[end - 1] ^= 0x01
    saved.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="truncated or corrupt.*Bad CRC-32 for file 'v.npy'"):
        load_checkpoint(saved)


def central_directory_entry(data: bytes, name: str) -> int:
    """Where the zip's central directory entry for name begins."""
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        name_len = int.from_bytes(data[at + 28 : at + 30], "little")
        if data[at + 46 : at + 46 + name_len] == name.encode():
            return at
        at = data.find(b"PK\x01\x02", at + 4)
    raise AssertionError(f"{name} is not in the central directory")


def test_a_stored_member_whose_sizes_disagree_is_refused(saved):
    """The central directory says params.npy stores 4 bytes fewer than it holds:
    zipfile would stop there; the data read straight from the file must not
    run on into the next member."""
    data = bytearray(saved.read_bytes())
    at = central_directory_entry(bytes(data), "params.npy") + 20  # compressed size
    stored = int.from_bytes(data[at : at + 4], "little")
    data[at : at + 4] = (stored - 4).to_bytes(4, "little")
    saved.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="'params' is damaged: its zip entry stores"):
        load_checkpoint(saved)


def test_a_compressed_checkpoint_reads_the_same_and_its_damage_is_found(saved, tmp_path):
    """np.savez_compressed's members are deflated: read through zipfile, checked the same."""
    arrays = contents(saved)
    packed = tmp_path / "packed.npz"
    np.savez_compressed(packed, **arrays)
    with zipfile.ZipFile(packed) as z:
        assert z.getinfo("params.npy").compress_type == zipfile.ZIP_DEFLATED
    ck, expected = read_checkpoint(packed), read_checkpoint(saved)
    for name in ("params", "m", "v", "losses"):
        assert np.array_equal(getattr(ck, name), getattr(expected, name)), name
    assert ck.corpus.docs == expected.corpus.docs and ck.model == expected.model
    data = bytearray(packed.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as z:
        info = z.getinfo("params.npy")
    local = info.header_offset
    name_len, extra_len = (int.from_bytes(data[local + i : local + i + 2], "little") for i in (26, 28))
    middle = local + 30 + name_len + extra_len + info.compress_size // 2
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    packed.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        read_checkpoint(packed)


@pytest.mark.parametrize("key", ["m", "params", "docs", "chars", "model.n_embd", "train.seed",
                                 "step", "format_version"])
def test_missing_key_is_named(saved, key):
    arrays = contents(saved)
    del arrays[key]
    write_npz(saved, arrays)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(saved)
    assert f"'{key}'" in str(info.value)


def test_a_checkpoint_from_before_warmup_existed_loads_without_one(saved, small_corpus, small_model, tmp_path):
    from checkpoint_support import TRAIN, as_format_1
    from engine import open_backend

    old = as_format_1(saved, tmp_path / "old.npz")
    assert "train.warmup_steps" not in contents(old)
    resumed = load_checkpoint(old)
    assert resumed.train_config == replace(TRAIN, holdout=0) and resumed.train_config.warmup_steps == 0
    expected = open_backend("numpy", small_model, TRAIN, small_corpus).train(10)
    assert np.array_equal(resumed.train(4), expected[6:])


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


def test_a_negative_warmup_inside_is_named(saved):
    arrays = contents(saved)
    arrays["train.warmup_steps"] = np.asarray(-3)
    write_npz(saved, arrays)
    with pytest.raises(CheckpointError, match=r"invalid configuration: warmup_steps .*-3"):
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


# ---- fields of the wrong kind, unusable values ------------------------------------

def test_a_npy_file_renamed_npz(tmp_path):
    path = tmp_path / "weights.npz"
    with open(path, "wb") as f:
        np.save(f, np.zeros(10, dtype=np.float32))
    with pytest.raises(CheckpointError, match=r"single NumPy array \(\.npy\)"):
        load_checkpoint(path)


@pytest.mark.parametrize("key, value", [
    ("step", np.array([6, 6])), ("format_version", np.array([1])),
    ("model.n_embd", np.str_("8")), ("train.num_steps", np.str_("30")),
    ("train.learning_rate", np.str_("0.02")), ("train.seed", np.float64(9.0)),
    ("model.n_layer", np.bool_(True)), ("train.beta1", np.array([0.85, 0.85])),
    ("chars", np.array(list("abc"))), ("docs", np.int64(3)), ("backend", np.bytes_(b"numpy")),
])
def test_scalar_fields_of_the_wrong_kind_are_named(saved, key, value):
    arrays = contents(saved)
    arrays[key] = value
    write_npz(saved, arrays)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(saved)
    assert f"'{key}' must be" in str(info.value)


@pytest.mark.parametrize("key, bad", [("params", np.nan), ("m", np.inf), ("v", -np.inf),
                                      ("losses", np.nan), ("params", -np.inf)])
def test_nan_or_infinite_values_are_named(saved, key, bad):
    arrays = contents(saved)
    arrays[key] = arrays[key].copy()
    arrays[key][[0, -1]] = bad
    write_npz(saved, arrays)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(saved)
    assert f"'{key}' holds 2 NaN or infinite values" in str(info.value)


def test_negative_second_moments_are_named(saved):
    arrays = contents(saved)
    arrays["v"] = arrays["v"].copy()
    arrays["v"][3] = -1e-6
    write_npz(saved, arrays)
    with pytest.raises(CheckpointError, match="'v' holds 1 negative value"):
        load_checkpoint(saved)


@pytest.mark.parametrize("steps", [10**15, 2**63 - 1])
def test_an_absurd_num_steps_is_named(saved, steps):
    arrays = contents(saved)
    arrays["train.num_steps"] = np.asarray(steps)
    write_npz(saved, arrays)
    with pytest.raises(CheckpointError, match="num_steps must be at most"):
        load_checkpoint(saved)


@pytest.mark.parametrize("key, value, shown", [
    ("train.num_steps", 10**12, "num_steps must be at most 10,000,000, got 1,000,000,000,000"),
    ("train.num_steps", 10**10, "num_steps must be at most 10,000,000, got 10,000,000,000"),
    ("train.seed", 2**40, "seed must be at most 2,147,483,647, got 1,099,511,627,776"),
    ("model.n_layer", 97, "n_layer must be at most 96, got 97"),
    ("train.learning_rate", 2.0, "learning_rate must be at most 1, got 2"),
    ("train.learning_rate", 1e4, "learning_rate must be at most 1, got 10000"),
    ("train.beta2", 0.9999999, "beta2 must be at most 0.999999, got 0.9999999"),
])
def test_a_value_beyond_the_limits_is_refused(saved, key, value, shown):
    """10^12 steps overflowed the window's Steps field (a 32-bit int): a checkpoint
    outside engine.config.FIELD_LIMITS is refused when read, in the words a new
    run's configuration is refused in."""
    from engine.config import FIELD_LIMITS

    low, high = FIELD_LIMITS[key]
    assert not low <= value <= high  # the case is beyond the limit it names
    arrays = contents(saved)
    arrays[key] = np.asarray(value)
    write_npz(saved, arrays)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(saved)
    assert str(info.value) == f"{saved} holds an invalid configuration: {shown}"


@pytest.mark.parametrize("docs, problem", [("", "it holds no documents"),
                                           ("emma\n\nava", "document 2 of 3 is empty")])
def test_a_checkpoint_without_documents_is_refused(saved, docs, problem):
    arrays = contents(saved)
    arrays["docs"] = np.str_(docs)
    write_npz(saved, arrays)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(saved)
    assert str(info.value) == f"{saved}: its dataset ('docs') is unusable: {problem}"


# ---- sizes checked before decompressing ----------------------------------------------

@pytest.fixture
def zip_opens(monkeypatch):
    """Names of the members read_checkpoint decompresses (ZipFile.open calls)."""
    opened = []
    real_open = zipfile.ZipFile.open

    def recording_open(self, name, *args, **kwargs):
        opened.append(getattr(name, "filename", name))
        return real_open(self, name, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", recording_open)
    return opened


def test_an_unknown_member_is_refused_before_anything_is_decompressed(saved, zip_opens):
    """A small file with a large compressed member (there: 2 GB of zeros in 2.2 MB)."""
    with zipfile.ZipFile(saved, "a", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open("payload.npy", "w", force_zip64=True) as member:
            block = bytes(1 << 20)
            for _ in range(64):
                member.write(block)
    assert saved.stat().st_size < 2**20
    zip_opens.clear()
    with pytest.raises(CheckpointError, match="unexpected member 'payload.npy'"):
        load_checkpoint(saved)
    assert zip_opens == []


def test_an_oversized_member_is_refused_before_it_is_decompressed(saved, zip_opens):
    arrays = contents(saved)
    arrays["m"] = np.zeros(50 * len(arrays["m"]), dtype=np.float32)
    write_npz(saved, arrays)
    zip_opens.clear()
    with pytest.raises(CheckpointError, match="'m' declares .* more than a 1-D float32 array of"):
        load_checkpoint(saved)
    assert "m.npy" not in zip_opens and "params.npy" in zip_opens


def test_a_header_that_claims_more_data_than_the_member_holds(saved):
    """params.npy's header says n values, its zip entry holds 16 bytes: refused
    without allocating from the header's claim."""
    arrays = contents(saved)
    n = len(arrays["params"])
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (n,)})
    arrays.pop("params")
    write_npz(saved, arrays)
    with zipfile.ZipFile(saved, "a") as z:
        z.writestr("params.npy", header.getvalue() + bytes(16))
    with pytest.raises(CheckpointError, match="'params' is damaged"):
        load_checkpoint(saved)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    assert "named pipe" in str(fifo_refusal(tmp_path / "run.npz", read_checkpoint, CheckpointError))


