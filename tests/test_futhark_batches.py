"""Batches on the Futhark backends (kernels/lib/batch.fut): a step over B documents
padded to the longest and masked, one Adam update on the gradient of their mean
loss, documents picked as engine.data.split.DataSplit picks them.

The references are independent of the kernel: NumPy's batched loss_and_grad
(engine/model/gpt.py, itself held to float64 finite differences in
tests/test_model_grad.py), the same run in float64 (tests/float64_reference.py:
the engine's loss_and_grad, Adam and doc_losses on float64 buffers) and `vjp` of
the kernel's forward-only loss (grad_vjp, in the tests' program
kernels/tests/oracle.fut). The training gradient is read from training itself:
with beta1 = 0, Adam's first moment after one step is exactly that step's gradient.
"""
from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

from engine import Corpus, ModelConfig, TrainConfig, load_checkpoint, open_backend, read_checkpoint
from engine.backends import probe_backend
from engine.model.gpt import Weights, loss_and_grad
import float64_reference
from futhark_support import MULTICORE_2_THREADS, MULTICORE_PARTS, Oracle, backend_steps, reference_samples

pytestmark = pytest.mark.futhark

# Names from 2 to 15 characters: documents of T = 3 .. 9 positions at block_size 8
# (christopherjohn is truncated), so every batch pads some of its documents.
NAMES = ["emma", "olivia", "ava", "isabella", "sophia", "mia", "amelia", "harper", "evelyn",
         "abigail", "emily", "ella", "elizabeth", "camila", "luna", "bo", "christopherjohn"]
MODEL = ModelConfig(n_embd=16, n_layer=2, n_head=2, block_size=8)
BACKENDS = ["futhark-c", MULTICORE_2_THREADS, MULTICORE_PARTS]


def available(name: str) -> None:
    ok, reason = probe_backend("futhark-multicore" if name in (MULTICORE_2_THREADS, MULTICORE_PARTS) else name)
    if not ok:
        pytest.skip(reason)


def assert_runs_as_named(name: str, backend) -> None:
    """Two threads run the multicore program for batches: MULTICORE_PARTS's in parts,
    MULTICORE_2_THREADS's by the products' tasks."""
    if name in (MULTICORE_2_THREADS, MULTICORE_PARTS):
        assert backend.threads() == 2 and backend.library_target() == "multicore_batch"
        assert backend.trains_in_parts() == (name == MULTICORE_PARTS)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return Corpus.from_lines(NAMES)


def test_the_documents_differ_in_length_and_one_is_truncated(corpus):
    lengths = np.minimum(MODEL.block_size, corpus.arrays.lengths - 1)
    assert len(set(lengths[:14].tolist())) > 3 and (corpus.arrays.lengths - 1 > MODEL.block_size).any()


def fifty_steps_config(batch: int) -> TrainConfig:
    """The 50-step parity runs' configuration at batch size `batch`."""
    # at B = 32 each step sees every one of the 14 documents twice or more, and at
    # 0.01 the run overfits (loss 0.5 by step 30), where float32 rounding in the
    # order of the sums over B T positions grows past 1e-4 on any backend
    rate = 0.003 if batch == 32 else 0.01
    return TrainConfig(num_steps=60, batch_size=batch, holdout=3, learning_rate=rate)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("batch", [4, 3, 32])  # 32: more documents than the 14 trained, each step wraps
def test_fifty_batched_steps_follow_numpy(name, batch, corpus):
    available(name)
    train = fifty_steps_config(batch)
    reference, backend = open_backend("numpy", MODEL, train, corpus), open_backend(name, MODEL, train, corpus)
    try:
        assert_runs_as_named(name, backend)
        losses = backend.train(50)  # 150 or 200 documents of 14: many epochs, every batch padded
        np.testing.assert_allclose(losses, reference.train(50), rtol=0, atol=1e-4)
        got, expected = backend.get_state(), reference.get_state()
        assert got.step == expected.step == 50
        np.testing.assert_allclose(got.params, expected.params, rtol=0, atol=1e-4)
        assert np.abs(got.params - open_backend("numpy", MODEL, train, corpus).get_state().params).max() > 0.1
        assert backend.heldout_loss() == pytest.approx(reference.heldout_loss(), abs=1e-4)
    finally:
        backend.close()


@pytest.mark.parametrize("name", [MULTICORE_2_THREADS, MULTICORE_PARTS])
@pytest.mark.parametrize("batch", [4, 32])
def test_two_runs_of_one_batch_on_two_threads_are_the_same_bits(name, batch, corpus):
    """The same run twice on two threads: the same losses and parameters, bit for bit (sums
    over positions in position order, not in the order the threads meet them)."""
    available(name)
    train = fifty_steps_config(batch)
    runs = []
    for _ in range(2):
        backend = open_backend(name, MODEL, train, corpus)
        try:
            assert_runs_as_named(name, backend)
            losses = backend.train(20)
            runs.append((losses, backend.get_state().params, backend.heldout_loss()))
        finally:
            backend.close()
    (losses, params, heldout), (losses2, params2, heldout2) = runs
    np.testing.assert_array_equal(losses, losses2)
    np.testing.assert_array_equal(params, params2)
    assert heldout == heldout2


@pytest.mark.parametrize("in_parts", [False, True])
@pytest.mark.parametrize("threads, batch", [(5, 3), (6, 4)])
def test_a_batch_runs_on_no_more_threads_than_documents(threads, batch, in_parts, corpus, monkeypatch):
    """Asked for more threads than documents a step, futhark-multicore runs on B: on
    more, Futhark's runtime ran the loops over the documents in their nested
    version, and the steps went NaN or far off (measured: 5 threads at B = 3 2e-2
    off NumPy's first losses, then NaN). Either way of training a batch."""
    available("futhark-multicore")
    from engine.backends import futhark_backend as fbk

    monkeypatch.setenv(fbk.THREADS_ENV, str(threads))
    monkeypatch.setattr(fbk, "PARTS_MIN_BATCH", 2)
    if not in_parts:
        monkeypatch.setattr(fbk, "PARTS_MAX_PARAMS", 0)
    train = fifty_steps_config(batch)
    reference, backend = open_backend("numpy", MODEL, train, corpus), open_backend("futhark-multicore", MODEL, train, corpus)
    try:
        assert backend.threads() == batch and backend.trains_in_parts() == in_parts
        assert backend.library_target() == "multicore_batch"
        np.testing.assert_allclose(backend.train(20), reference.train(20), rtol=0, atol=1e-4)
        np.testing.assert_allclose(backend.get_state().params, reference.get_state().params, rtol=0, atol=1e-4)
    finally:
        backend.close()


def float64_run(backend, steps: int) -> float64_reference.Float64Run:
    """`steps` steps of backend's run in float64 from its state now, which must be step 0."""
    run = float64_reference.start(backend)
    assert run.step == 0
    float64_reference.train(run, backend, steps)
    return run


@pytest.mark.parametrize("name", ["numpy", *BACKENDS])
@pytest.mark.parametrize("batch", [4, 32])
def test_fifty_batched_steps_follow_a_float64_reference(name, batch, corpus):
    """A float32 run against the same run in float64 from its own initial
    parameters: losses and parameters within 1e-4, the held-out loss after them
    within 1e-5. NumPy's run shows the reference is the engine's model and run,
    only in float64 (measured: under 5e-7, held-out under 3e-7); the kernel's
    (measured on the shipped kernel, futhark-c and two threads: losses within
    2e-6, parameters within 4e-7, the held-out loss within 4e-7; with a 1% wrong
    learning rate or the documents one step late, the reference's losses are
    1e-2 off or more)."""
    available(name)
    backend = open_backend(name, MODEL, fifty_steps_config(batch), corpus)
    try:
        assert_runs_as_named(name, backend)
        initial = backend.get_state().params
        run = float64_run(backend, 50)
        assert run.params.dtype == np.float64
        np.testing.assert_allclose(backend.train(50), run.losses, rtol=0, atol=1e-4)
        assert backend.step == 50
        np.testing.assert_allclose(backend.get_state().params, run.params, rtol=0, atol=1e-4)
        assert np.abs(run.params - initial).max() > 0.1  # trained
        assert backend.heldout_loss() == pytest.approx(float64_reference.heldout_loss(run, backend), abs=1e-5)
    finally:
        backend.close()


GPU = "gpu.fut's step"  # run by the oracle program (sequential C)


@pytest.mark.parametrize("name", ["futhark-c", GPU, MULTICORE_2_THREADS, MULTICORE_PARTS])
@pytest.mark.parametrize("step", [0, 3, 4])  # step 4 wraps: documents 12, 13, 0
@pytest.mark.parametrize("batch", [3, 32])
def test_a_batched_steps_gradient_equals_vjp_and_numpy(name, step, batch, corpus):
    """GPU runs the GPU program's form of the step in sequential C."""
    available("futhark-c" if name == GPU else name)
    train = TrainConfig(num_steps=100, batch_size=batch, holdout=3, beta1=0.0, learning_rate=0.01)
    backend = open_backend("futhark-c" if name == GPU else name, MODEL, train, corpus)
    try:
        assert_runs_as_named(name, backend)
        oracle = Oracle(backend)
        backend.train(5)  # away from the initial parameters
        state = backend.get_state()
        vjp_loss, vjp_grad = oracle.gradient(state, step)
        run = oracle.gpu_steps if name == GPU else lambda *args: backend_steps(backend, *args)
        losses, _, train_grad = run(state, step, 1)
        batch = backend.split.batch(step)
        assert len(set(batch.lengths.tolist())) > 1  # padded
        numpy_grad = np.zeros_like(state.params)
        numpy_loss = loss_and_grad(Weights(state.params, backend.specs, MODEL),
                                   Weights(numpy_grad, backend.specs, MODEL),
                                   batch.inputs, batch.targets, MODEL, np, lengths=batch.lengths)
        loss = float(losses[0])
        assert loss == pytest.approx(vjp_loss, abs=1e-5) and loss == pytest.approx(float(numpy_loss), abs=1e-5)
        np.testing.assert_allclose(train_grad, vjp_grad, rtol=0, atol=1e-5)
        np.testing.assert_allclose(train_grad, numpy_grad, rtol=0, atol=1e-5)
        assert np.abs(train_grad).max() > 1e-3  # a gradient, not zeros
    finally:
        backend.close()


def test_a_batched_run_resumes_mid_epoch_across_backends(corpus, tmp_path):
    """numpy saves mid-epoch, futhark-c resumes and saves, numpy resumes: the run
    follows the uninterrupted NumPy run."""
    available("futhark-c")
    train = TrainConfig(num_steps=40, batch_size=3, holdout=3, learning_rate=0.01)
    uninterrupted = open_backend("numpy", MODEL, train, corpus)
    expected = uninterrupted.train(20)
    first = open_backend("numpy", MODEL, train, corpus)
    first.train(3)  # 9 documents of 14: mid-epoch
    first.save(tmp_path / "numpy.npz")
    middle = load_checkpoint(tmp_path / "numpy.npz", backend="futhark-c")
    try:
        assert (middle.name, middle.step, middle.batch_size) == ("futhark-c", 3, 3)
        np.testing.assert_allclose(middle.train(8), expected[3:11], rtol=0, atol=1e-4)  # wraps the epoch
        middle.save(tmp_path / "futhark.npz")
    finally:
        middle.close()
    ck = read_checkpoint(tmp_path / "futhark.npz")
    assert (ck.train.batch_size, ck.train.holdout, ck.step) == (3, 3, 11)
    last = load_checkpoint(ck, backend="numpy")
    np.testing.assert_allclose(last.train(9), expected[11:], rtol=0, atol=1e-4)
    np.testing.assert_allclose(last.get_state().params, uninterrupted.get_state().params, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", BACKENDS)
def test_batches_evaluate_in_the_program_for_one_document_on_the_weights_of_now(name, corpus):
    """The batches' programs have no held-out losses or sampling: a batched run
    runs them in its target's program for one document a step, on a copy of the
    training parameters that follows each change of them (training, set_state).
    Each time, the held-out loss equals NumPy's at the same parameters and the
    samples the reference sampler's."""
    available(name)
    train = fifty_steps_config(4)
    backend, numpy = open_backend(name, MODEL, train, corpus), open_backend("numpy", MODEL, train, corpus)
    try:
        assert backend.library_targets() == (backend.library_target(), backend.evaluation_target())
        assert backend.library_target() == backend.evaluation_target() + "_batch"

        def evaluated() -> float:
            state = backend.get_state()
            numpy.set_state(state)
            loss = backend.heldout_loss()
            assert loss == pytest.approx(numpy.heldout_loss(), abs=1e-5)
            samples = backend._sample_ids(20, 0.8, 3, [], None, max_length=MODEL.block_size)
            assert samples == reference_samples(state.params, backend.specs, MODEL, corpus.bos, 20, 0.8, 3)
            return loss

        start = backend.get_state()
        initial = evaluated()
        backend.train(30)
        assert abs(evaluated() - initial) > 0.1  # the trained parameters, not the first copy's (14 documents: overfit)
        backend.set_state(start)
        assert evaluated() == initial
    finally:
        backend.close()


@pytest.mark.parametrize("name", BACKENDS)
def test_held_out_documents_are_never_trained(name):
    """A character that only held-out documents use gets a wte gradient only where
    it is an input, so its row stays exactly as initialised unless a held-out
    document is trained (as it is with nothing held out)."""
    available(name)
    c = Corpus.from_lines(NAMES[:10] + ["zzz", "qqq", "xxx", "jjj", "www", "yyy"])
    held = 4
    trained = set("".join(c.docs[: len(c) - held]))
    only_held = sorted(set("".join(c.docs[len(c) - held :])) - trained)
    assert only_held  # the training order put some of the six at the end
    rows = c.encode("".join(only_held))

    def moved(holdout: int) -> np.ndarray:
        train = TrainConfig(num_steps=60, batch_size=4, holdout=holdout, learning_rate=0.01)
        backend = open_backend(name, MODEL, train, c)
        try:
            wte = lambda: backend.get_state().params[: c.vocab_size * MODEL.n_embd].reshape(c.vocab_size, -1)
            before = wte()[rows].copy()
            backend.train(40)  # 160 documents: many epochs
            return np.abs(wte()[rows] - before).max(axis=1)
        finally:
            backend.close()

    assert (moved(holdout=held) == 0).all()
    assert (moved(holdout=0) > 1e-3).all()


@pytest.mark.parametrize("name", BACKENDS)
def test_one_document_per_step_is_unchanged(name, corpus):
    """B = 1 keeps the unpadded step: it follows NumPy's single-document step."""
    available(name)
    train = TrainConfig(num_steps=60, batch_size=1, holdout=3, learning_rate=0.01)
    reference, backend = open_backend("numpy", MODEL, train, corpus), open_backend(name, MODEL, train, corpus)
    try:
        np.testing.assert_allclose(backend.train(30), reference.train(30), rtol=0, atol=1e-5)
    finally:
        backend.close()


def resident_bytes() -> int:
    """This process's resident memory (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident memory from /proc")
@pytest.mark.parametrize("name", BACKENDS)
def test_a_batched_step_holds_no_more_memory_the_longer_it_trains(name, corpus):
    """500 more steps leave the process about as large: futhark-multicore's step in
    parts leaked every step what the functions its groups called returned (Futhark
    0.25.34 frees nothing such a call returns inside a task): here about 33 KB a
    step, 16.7 MB in 500; at learn and 32 documents 250 KB a step. (Futhark's own
    count of its memory is no measure here: its threads update it unlocked.)"""
    available(name)
    train = TrainConfig(num_steps=100_000, batch_size=8, holdout=3, learning_rate=0.001)
    backend = open_backend(name, MODEL, train, corpus)
    try:
        assert_runs_as_named(name, backend)
        backend.train(50)
        before = resident_bytes()
        backend.train(500)
        assert resident_bytes() - before < 2 << 20
    finally:
        backend.close()
