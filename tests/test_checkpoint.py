"""engine.checkpoint: resume equals an uninterrupted run; atomic writes; every
kind of bad file is a CheckpointError that says what is wrong."""
from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

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
    import threading

    fifo = tmp_path / "run.npz"
    os.mkfifo(fifo)
    errors = []
    thread = threading.Thread(target=lambda: errors.append(pytest.raises(CheckpointError, read_checkpoint, fifo)),
                              daemon=True)
    thread.start()
    thread.join(timeout=20)
    if thread.is_alive():
        with open(fifo, "wb"):
            pass
        pytest.fail("opening a FIFO blocked")
    assert "named pipe" in str(errors[0].value)


# ---- saving: permissions, leftovers of killed saves ---------------------------------

@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_saved_files_get_the_users_usual_permissions(run, tmp_path, umask):
    old = os.umask(umask)
    try:
        run.save(tmp_path / "run.npz")
    finally:
        os.umask(old)
    assert (tmp_path / "run.npz").stat().st_mode & 0o777 == 0o666 & ~umask


def _age(path, seconds):
    stamp = os.stat(path).st_mtime - seconds
    os.utime(path, (stamp, stamp))


def test_the_next_save_removes_only_stale_unlocked_leftovers(run, tmp_path):
    from engine import checkpoint

    folder = tmp_path
    stale = folder / f"run.npz.0123456789ab{checkpoint.TEMP_SUFFIX}"
    legacy = folder / "old.npz.k3j_x9ab.tmp"  # mkstemp's name, from earlier versions
    fresh = folder / f"run.npz.ba9876543210{checkpoint.TEMP_SUFFIX}"  # a save that just began
    live = folder / f"other.npz.aaaaaaaaaaaa{checkpoint.TEMP_SUFFIX}"  # an old one still being written
    others = [folder / "notes.tmp", folder / "run.npz.tmp", folder / f"x{checkpoint.TEMP_SUFFIX}"]
    for p in (stale, legacy, fresh, live, *others):
        p.write_bytes(b"PK partial")
    for p in (stale, legacy, live, *others):
        _age(p, 3600)
    if checkpoint.fcntl is None:
        pytest.skip("no file locks here")
    with open(live, "rb") as holder:
        checkpoint.fcntl.flock(holder.fileno(), checkpoint.fcntl.LOCK_EX)  # as a save in progress does
        run.save(folder / "next.npz")
    names = sorted(os.listdir(folder))
    assert stale.name not in names and legacy.name not in names
    assert {fresh.name, live.name, *(p.name for p in others), "next.npz"} == set(names)


KILLED_SAVE = r"""
import sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
from engine import Corpus, ModelConfig, TrainConfig, open_backend
b = open_backend("numpy", ModelConfig(16, 2, 2, 16), TrainConfig(num_steps=20),
                 Corpus.from_lines(["anna", "bob", "cyril", "dora"]))
b.train(4)
b.save(sys.argv[2])
print("saved", flush=True)
b.train(4)

def stalled_savez(file, **arrays):  # a large save, caught halfway
    file.write(b"PK\x03\x04" + bytes(1 << 20))
    file.flush()
    print("writing", flush=True)
    time.sleep(120)

np.savez = stalled_savez
b.save(sys.argv[2])
"""


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGKILL"), reason="no SIGKILL here")
def test_a_save_killed_midway_keeps_the_old_file_and_the_next_save_cleans_up(run, tmp_path):
    import signal
    import subprocess
    import sys

    from engine import checkpoint

    repo_root = Path(__file__).resolve().parents[1]
    path = tmp_path / "run.npz"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SAVE, str(repo_root), str(path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "saved"
        saved_bytes = path.read_bytes()
        assert proc.stdout.readline().strip() == "writing"
        leftovers = [n for n in os.listdir(tmp_path) if n.endswith(checkpoint.TEMP_SUFFIX)]
        assert len(leftovers) == 1
        assert checkpoint.remove_stale_temp_files(tmp_path, min_age=0) == []  # locked: a live save
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert path.read_bytes() == saved_bytes and read_checkpoint(path).step == 4  # intact
    assert (tmp_path / leftovers[0]).stat().st_size > 1 << 20
    run.save(tmp_path / "later.npz")  # too recent to be sure it is stale: kept
    assert leftovers[0] in os.listdir(tmp_path)
    _age(tmp_path / leftovers[0], checkpoint.STALE_TEMP_SECONDS + 60)
    run.save(tmp_path / "later.npz")
    assert sorted(os.listdir(tmp_path)) == ["later.npz", "run.npz"]
