"""The NumPy backend's held-out evaluation in a child process
(engine.backends.heldout_process): the same losses to the last bit as the
evaluation in this process, cancellation, nothing left behind, and the
evaluation in this process whenever the child is gone."""
from __future__ import annotations

import errno
import os
import tempfile
from dataclasses import replace

import numpy as np
import pytest

from engine import Cancelled, Corpus, ModelConfig, TrainConfig, open_backend
from engine.backends import base, heldout_process
from engine.data.split import DataSplit

NAMES = ["emma", "olivia", "ava", "isabella", "sophia", "charlotte", "mia", "amelia", "harper", "evelyn",
         "abigail", "emily", "elizabeth", "mila", "ella", "avery", "sofia", "camila", "aria", "scarlett"]
MODEL = ModelConfig(n_embd=16, n_layer=2, n_head=4, block_size=8)
TRAIN = TrainConfig(num_steps=100, holdout=7, batch_size=3, seed=5)


def pair(train=TRAIN):
    """A backend evaluating in the child and one evaluating in this process, alike."""
    corpus = Corpus(NAMES, shuffled=True)
    child, here = open_backend("numpy", MODEL, train, corpus), open_backend("numpy", MODEL, train, corpus)
    here._heldout_session = False  # as after the child was found gone
    return child, here


@pytest.mark.parametrize("batch_size, max_docs", [(1, 1024), (3, 2)])
def test_the_child_computes_the_same_losses_as_this_process(batch_size, max_docs, monkeypatch):
    monkeypatch.setattr(base, "EVAL_MAX_DOCS", max_docs)  # 2: four held-out batches
    child, here = pair(replace(TRAIN, batch_size=batch_size))
    for steps in (0, 5, 15):  # evaluated at steps 0, 5 and 20
        if steps:
            np.testing.assert_array_equal(child.train(steps), here.train(steps))
        assert child.heldout_loss() == here.heldout_loss()
    assert isinstance(child._heldout_session, heldout_process.Session) and heldout_process.shared().alive
    assert child.heldout_history == here.heldout_history
    # and both are the plain sum over every held-out position (DataSplit's documents)
    split = DataSplit(child.corpus, TRAIN.holdout, MODEL.block_size)
    assert sum(child._heldout_session.positions) == int(split.positions[split.heldout_documents()].sum())
    child.close()


def test_a_cancelled_evaluation_returns_at_once_and_the_next_one_is_right(monkeypatch):
    monkeypatch.setattr(base, "EVAL_MAX_DOCS", 1)
    child, here = pair()
    child.train(10)
    here.train(10)
    child.heldout_loss()  # the child knows the batches
    with pytest.raises(Cancelled):
        child.heldout_loss(cancel=lambda: True)
    assert [p.step for p in child.heldout_history] == [10], "a cancelled evaluation records nothing"
    child.train(3)
    here.train(3)
    assert child.heldout_loss() == here.heldout_loss()
    child.close()


def test_nothing_is_left_behind():
    child, _ = pair()
    child.heldout_loss()
    session = child._heldout_session
    if os.name == "posix":
        assert not os.path.exists(session.path), "unlinked once both processes had it mapped"
    child.close()
    assert not os.path.exists(session.path) and child._heldout_session is None
    process = heldout_process.shared()
    assert session.key in process._closing
    other, _ = pair()
    other.heldout_loss()
    assert session.key not in process._closing, "the child was told to drop it with the next request"
    other.close()


def test_a_run_evaluates_here_once_the_child_is_gone(monkeypatch):
    own = heldout_process.HeldoutProcess()
    monkeypatch.setattr(heldout_process, "_shared", own)
    child, here = pair()
    child.train(4)
    here.train(4)
    assert child.heldout_loss() == here.heldout_loss() and child._heldout_session is not False
    own._proc.kill()
    own._proc.wait()
    child.train(4)
    here.train(4)
    assert child.heldout_loss() == here.heldout_loss()
    assert child._heldout_session is False, "from now on in this process"
    own.close()


def test_no_room_for_the_parameters_file_means_evaluating_here(monkeypatch):
    """A full /dev/shm (a container's 64 MB) and a full disk: refused up front, never
    a mapped page that cannot be written (SIGBUS)."""
    def full(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    child, here = pair()
    assert child.heldout_loss() == here.heldout_loss() and child._heldout_session is False
    assert not [name for name in os.listdir(tempfile.gettempdir()) if name.startswith("microgpt-heldout-")]


def test_a_backend_that_evaluates_its_own_way_stays_in_this_process(monkeypatch):
    class OwnWay(type(open_backend("numpy", MODEL, TRAIN, Corpus(NAMES, shuffled=True)))):
        def _doc_losses(self, batch):
            return super()._doc_losses(batch)

    backend = OwnWay(MODEL, TRAIN, Corpus(NAMES, shuffled=True))
    backend.heldout_loss()
    assert backend._heldout_session is None and not backend._evaluates_in_child()
    assert all("held-out evaluation's process" not in what for what, _ in backend.memory_needs())
    assert any("held-out evaluation's process" in what for what, _ in pair()[0].memory_needs())
    from engine.backends.numpy_backend import NumpyBackend

    monkeypatch.setattr(NumpyBackend, "_doc_losses", lambda self, batch: np.zeros(len(batch.lengths)))
    replaced = pair()[0]
    assert replaced.heldout_loss() == 0.0 and replaced._heldout_session is None
