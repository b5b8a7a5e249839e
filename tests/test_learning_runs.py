"""Runs that learn: checkpoints of batched runs with their held-out history, older
checkpoints, the evaluation schedule, `demo --batch --holdout`, `bench --to-loss`,
and the Futhark backends' held-out documents and doc_losses."""
from __future__ import annotations

import io
import zipfile
from dataclasses import replace

import numpy as np
import pytest

from checkpoint_support import as_format_1
from cli_support import run_in_process as run
from cupy_support import HostLogicBackend
from engine import TrainConfig, load_checkpoint, open_backend, read_checkpoint
from engine.backends import BackendError, probe_backend
from engine.bench.to_loss import ToLoss, train_to_loss
from engine.training.heldout import HeldoutPoint, HoldoutSchedule
from test_learning import MODEL, corpus

TRAIN = TrainConfig(num_steps=60, batch_size=3, holdout=3, learning_rate=0.01)


# checkpoints ------------------------------------------------------------------------

@pytest.mark.parametrize("resume_on", ["numpy", "cupy-logic"])
def test_a_batched_run_resumes_exactly_mid_epoch(resume_on, tmp_path):
    c = corpus()
    uninterrupted = open_backend("numpy", MODEL, TRAIN, c)
    expected = uninterrupted.train(20)
    first = open_backend("numpy", MODEL, TRAIN, c)
    first.train(7)  # 21 documents of 8 training ones: mid-epoch
    first.heldout_loss()
    first.train(2)
    first.heldout_loss()
    first.save(tmp_path / "run.npz")
    ck = read_checkpoint(tmp_path / "run.npz")
    assert (ck.train.batch_size, ck.train.holdout, ck.step) == (3, 3, 9)
    assert [(p.step, p.loss) for p in ck.heldout] == [(p.step, p.loss) for p in first.heldout_history]
    if resume_on == "numpy":
        resumed = load_checkpoint(ck)
    else:
        resumed = HostLogicBackend(ck.model, ck.train, ck.corpus)
        resumed.set_state(first.get_state(), losses=ck.losses, heldout=ck.heldout)
    assert resumed.heldout_history == first.heldout_history and resumed.epochs == pytest.approx(27 / 8)
    np.testing.assert_array_equal(resumed.train(11), expected[9:])
    np.testing.assert_array_equal(resumed.get_state().params, uninterrupted.get_state().params)


def test_a_format_1_checkpoint_loads_as_one_document_per_step_nothing_held_out(tmp_path):
    c = corpus()
    train = TrainConfig(num_steps=30, holdout=0)
    old_run = open_backend("numpy", MODEL, train, c)
    old_run.train(5)
    old_run.save(tmp_path / "new.npz")
    old = as_format_1(tmp_path / "new.npz", tmp_path / "old.npz")
    ck = read_checkpoint(old)
    assert (ck.train.batch_size, ck.train.holdout, ck.heldout) == (1, 0, [])
    resumed = load_checkpoint(old)
    np.testing.assert_array_equal(resumed.train(5), old_run.train(5))


def test_a_format_2_checkpoint_missing_its_heldout_history_is_refused(tmp_path):
    from engine.errors import CheckpointError

    backend = open_backend("numpy", MODEL, TRAIN, corpus())
    backend.save(tmp_path / "run.npz")
    out = io.BytesIO()
    with zipfile.ZipFile(tmp_path / "run.npz") as src, zipfile.ZipFile(out, "w") as z:
        for info in src.infolist():
            if info.filename != "heldout_steps.npy":
                z.writestr(info.filename, src.read(info.filename))
    (tmp_path / "bad.npz").write_bytes(out.getvalue())
    with pytest.raises(CheckpointError, match="has no 'heldout_steps'"):
        read_checkpoint(tmp_path / "bad.npz")


# when to evaluate ------------------------------------------------------------------

def test_the_schedule_keeps_evaluation_within_its_share_and_evaluates_at_the_end():
    schedule = HoldoutSchedule(0.1)
    assert schedule.due(), "the first evaluation is due at once"
    evaluations = []
    for chunk in range(200):
        schedule.trained(0.05)
        finished = chunk == 199
        if schedule.due(finished):
            schedule.evaluated(0.02)
            evaluations.append(chunk)
    assert evaluations[0] == 0 and evaluations[-1] == 199
    # after the first, each one needs ten times its cost in training (0.2 s: 4 chunks)
    assert schedule.eval_seconds <= 0.1 * schedule.train_seconds + 0.02 + 1e-9
    assert len(evaluations) >= 40
    assert not schedule.due(True), "nothing trained since the last evaluation"


class FakeRunner:
    """A run whose held-out loss falls by 0.1 per 10 steps, on a fake clock (with
    what the training loop reads of a runner)."""

    name, model, train_config, num_params, holdout = "fake", None, None, 0, 5
    corpus = corpus()

    def __init__(self, clock, num_steps=1000):
        self.clock, self.step, self.num_steps, self.calls = clock, 0, num_steps, 0
        self.heldout_history = []

    def close(self):
        pass

    @property
    def finished(self):
        return self.step >= self.num_steps

    def train(self, k):
        k = min(k, self.num_steps - self.step)
        self.step += k
        self.clock[0] += 0.01 * k
        return np.zeros(k)

    def heldout_loss(self, cancel=None):
        self.calls += 1
        self.clock[0] += 0.05
        self.heldout_history.append(HeldoutPoint(self.step, 3.0 - 0.01 * self.step))
        return self.heldout_history[-1].loss


def test_train_to_loss_stops_at_the_first_evaluation_at_or_below_the_target():
    clock = [0.0]
    runner = FakeRunner(clock)
    reached, schedule = train_to_loss(runner, ToLoss(2.0, time_limit=100), clock=lambda: clock[0])
    assert reached and 3.0 - 0.01 * runner.step <= 2.0
    assert runner.step < 130, "found soon after step 100"
    assert schedule.train_seconds == pytest.approx(0.01 * runner.step)  # evaluation excluded
    assert schedule.eval_seconds == pytest.approx(0.05 * runner.calls)


def test_train_to_loss_stops_at_the_time_limit_or_the_end_of_the_run():
    clock = [0.0]
    reached, schedule = train_to_loss(FakeRunner(clock), ToLoss(0.5, time_limit=2), clock=lambda: clock[0])
    assert not reached and 2 <= schedule.train_seconds <= 2.3
    runner = FakeRunner([0.0], num_steps=50)
    clock = runner.clock
    reached, _ = train_to_loss(runner, ToLoss(0.5, time_limit=100), clock=lambda: clock[0])
    assert not reached and runner.step == 50


# the command line -------------------------------------------------------------------

def names_file(tmp_path, count=60):
    path = tmp_path / "names.txt"
    words = ["ava", "mia", "emma", "ella", "luna", "aria", "leah", "nora", "zoe", "ivy"]
    path.write_text("\n".join(f"{w}{'a' * (i % 4)}" for i, w in zip(range(count), words * count)))
    return path


def test_demo_prints_the_heldout_loss_with_the_final_loss(tmp_path, capsys):
    code, out, err = run(["demo", "--data", str(names_file(tmp_path)), "--steps", "20", "--batch", "4",
                          "--holdout", "7", "--samples", "1"], capsys)
    assert code == 0, err
    assert "batch: 4 documents per step; held out: 7 documents, training on 53" in out
    final = next(line for line in out.splitlines() if line.startswith("held-out loss: "))
    assert "over 7 documents" in final and "80 names seen" in final and "1.51 epochs" in final


def test_demo_refuses_a_holdout_that_leaves_nothing_to_train(tmp_path, capsys):
    code, out, err = run(["demo", "--data", str(names_file(tmp_path)), "--holdout", "60"], capsys)
    assert code == 2 and err.strip() == ("error: --holdout 60 leaves no documents to train on: the "
                                         "dataset has 60; hold out fewer (0: none)")
    code, _, err = run(["demo", "--batch", "5000"], capsys)
    assert code == 2 and err.strip() == "error: --batch must be at most 4,096, got 5,000"


def test_bench_to_loss_options_need_to_loss(tmp_path, capsys):
    for flag in ("--time-limit", "--run-steps"):
        code, _, err = run(["bench", "--data", str(names_file(tmp_path)), "--backends", "numpy", flag, "5"], capsys)
        assert code == 2 and err.strip() == f"error: {flag} goes with --to-loss X"


def test_bench_to_loss_reports_a_row_per_batch(tmp_path, capsys):
    code, out, err = run(["bench", "--data", str(names_file(tmp_path)), "--backends", "numpy", "--presets",
                          "tiny", "--batch", "1,4", "--to-loss", "9", "--time-limit", "5"], capsys)
    assert code == 0, err
    rows = [line.split() for line in out.splitlines() if line.startswith("numpy ")]
    assert [(r[1], r[2], r[4]) for r in rows] == [("tiny", "1", "yes"), ("tiny", "4", "yes")]


# the Futhark backends -------------------------------------------------------------

def futhark_c():
    available, reason = probe_backend("futhark-c")
    if not available:
        pytest.skip(reason)


@pytest.mark.futhark
def test_futhark_holds_out_the_same_documents_and_its_doc_losses_match_numpy():
    futhark_c()
    c = corpus()
    train = replace(TRAIN, batch_size=1, init_std=0.3)
    reference, backend = open_backend("numpy", MODEL, train, c), open_backend("futhark-c", MODEL, train, c)
    try:
        np.testing.assert_allclose(backend.train(20), reference.train(20), rtol=0, atol=1e-4)  # 2.5 epochs
        assert backend.heldout_loss() == pytest.approx(reference.heldout_loss(), abs=1e-5)
        batch = reference.split.documents_batch(np.arange(len(c)))
        np.testing.assert_allclose(backend._doc_losses(batch), reference._doc_losses(batch), rtol=1e-5, atol=1e-5)
    finally:
        backend.close()


# OpenBLAS's threads during a batch ------------------------------------------------

@pytest.mark.parametrize("batch_size, threads_in_step", [(1, None), (4, 1)])
def test_a_batched_numpy_step_runs_on_one_blas_thread(batch_size, threads_in_step, monkeypatch):
    from engine.backends import blas
    from engine.backends.numpy_backend import NumpyBackend

    functions = blas.thread_functions()
    if functions is None:
        pytest.skip("NumPy's BLAS here is not an OpenBLAS whose threads can be set")
    _, get_threads = functions
    before = get_threads()
    backend = NumpyBackend(MODEL, replace(TRAIN, batch_size=batch_size), corpus())
    seen = []
    unchecked = NumpyBackend._train_steps_unchecked

    def record(self, k):
        seen.append(get_threads())
        return unchecked(self, k)

    monkeypatch.setattr(NumpyBackend, "_train_steps_unchecked", record)
    backend.train(3)
    assert seen == [threads_in_step or before] and get_threads() == before
