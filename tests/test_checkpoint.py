"""engine.training.checkpoint: resume equals an uninterrupted run; atomic writes that
leave no partial file; permissions and the leftovers of killed saves.
(Bad files: test_checkpoint_files.py.)"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from dataclasses import replace

from checkpoint_support import TRAIN
from engine.data.split import default_holdout
from engine import TrainConfig, load_checkpoint, open_backend, read_checkpoint, save_checkpoint


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
    # the held-out count is stored as the run resolved it (TRAIN's None: the default for 15 documents)
    assert ck.model == small_model and ck.step == 6 and ck.backend == "numpy"
    assert ck.train == replace(TRAIN, holdout=default_holdout(len(small_corpus)))
    assert ck.corpus.docs == small_corpus.docs and ck.corpus.chars == small_corpus.chars
    state = run.get_state()
    for name in ("params", "m", "v"):
        assert np.array_equal(getattr(ck, name), getattr(state, name)), name
    assert np.any(ck.m != 0) and np.any(ck.v != 0)  # Adam moments are really saved
    assert np.array_equal(ck.losses, run.loss_history)


def test_a_run_saved_during_its_warmup_resumes_on_the_same_schedule(small_corpus, small_model, tmp_path):
    train = TrainConfig(num_steps=30, learning_rate=0.02, seed=9, warmup_steps=10)
    expected = open_backend("numpy", small_model, train, small_corpus).train(12)
    first = open_backend("numpy", small_model, train, small_corpus)
    first.train(4)
    first.save(tmp_path / "warm.npz")
    assert read_checkpoint(tmp_path / "warm.npz").train.warmup_steps == 10
    resumed = load_checkpoint(tmp_path / "warm.npz")
    assert resumed.train_config == replace(train, holdout=default_holdout(len(small_corpus)))
    assert np.array_equal(resumed.train(8), expected[4:])


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


def test_the_next_save_removes_only_unlocked_leftovers(run, tmp_path):
    from engine.training import checkpoint

    folder = tmp_path
    stale = folder / f"run.npz.0123456789ab{checkpoint.TEMP_SUFFIX}"
    legacy = folder / "old.npz.k3j_x9ab.tmp"  # mkstemp's name, from earlier versions
    dead = folder / f"run.npz.cccccccccccc{checkpoint.TEMP_SUFFIX}"  # a writer killed a moment ago
    fresh = folder / f"run.npz.ba9876543210{checkpoint.TEMP_SUFFIX}"  # created, not yet locked
    live = folder / f"other.npz.aaaaaaaaaaaa{checkpoint.TEMP_SUFFIX}"  # an old one still being written
    others = [folder / "notes.tmp", folder / "run.npz.tmp", folder / f"x{checkpoint.TEMP_SUFFIX}"]
    for p in (stale, legacy, dead, live, *others):
        p.write_bytes(b"PK partial")
    fresh.write_bytes(b"")
    for p in (stale, legacy, live, *others):
        _age(p, 3600)
    if checkpoint.fcntl is None:
        pytest.skip("no file locks here")
    with open(live, "rb") as holder:
        checkpoint.fcntl.flock(holder.fileno(), checkpoint.fcntl.LOCK_EX)  # as a save in progress does
        run.save(folder / "next.npz")
    names = sorted(os.listdir(folder))
    assert stale.name not in names and legacy.name not in names and dead.name not in names
    assert {fresh.name, live.name, *(p.name for p in others), "next.npz"} == set(names)
    _age(fresh, checkpoint.STALE_TEMP_SECONDS + 60)  # its writer never locked it: dead
    run.save(folder / "next.npz")
    assert fresh.name not in os.listdir(folder)


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

    from engine.training import checkpoint

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
    run.save(tmp_path / "later.npz")  # its writer is dead (no lock): removed, however recent
    assert sorted(os.listdir(tmp_path)) == ["later.npz", "run.npz"]
