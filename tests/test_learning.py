"""Batches of documents and the held-out loss: engine.data.corpus.DataSplit, the batched
loss_and_grad, Backend.heldout_loss and the held-out history, against
independent float64 references (tests/reference_model.py's plain forward pass,
finite differences, a per-document loop with Adam written out here)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cupy_support import HostLogicBackend
from engine import Corpus, ModelConfig, TrainConfig, init_params, open_backend, param_specs
from engine.backends import base
from engine.backends.numpy_backend import NumpyBackend
from engine.data.split import DataSplit, default_holdout
from engine.model.gpt import Weights, adam_update, batch_mask, doc_losses, loss_and_grad
from reference_model import microgpt_step_tokens, plain_loss_sum
from test_reference import microgpt_train

MODEL = ModelConfig(n_embd=8, n_layer=2, n_head=2, block_size=8)
# lengths 2 to 14 characters: 3 to 8 positions, the longest truncated at block_size 8
DOCS = ["ab", "cabbage", "dd", "abcdabcdabcdab", "bead", "c", "cafe", "dab", "ebb", "fade", "aced"]
H_STEP = 1e-5  # central differences in float64


def corpus() -> Corpus:
    return Corpus(DOCS, shuffled=True)  # kept in this order: documents are indexed by position


def host_backends():
    """The CPU backends whose batched step is engine.model.gpt's: NumPy, and CuPy's own
    code on NumPy (its device gather of the batch)."""
    return [("numpy", NumpyBackend), ("cupy-logic", HostLogicBackend)]


def reference_batch_loss(flat, specs, model, split: DataSplit, docs) -> float:
    """The mean over every real position of the documents: plain float64, one document at a time."""
    tokens = split.corpus.arrays.tokens
    total, count = 0.0, 0
    for d in docs:
        off, n = int(split.offsets[d]), int(split.positions[d])
        total += plain_loss_sum(flat, specs, model, tokens[off : off + n], tokens[off + 1 : off + 1 + n])
        count += n
    return total / count


# the data ---------------------------------------------------------------------

def test_step_documents_follow_the_training_order_and_skip_the_heldout_ones():
    split = DataSplit(corpus(), holdout=3, block_size=8, batch_size=4)
    assert split.n_train == 8 and split.heldout_documents().tolist() == [8, 9, 10]
    assert [split.step_documents(s).tolist() for s in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]
    one = DataSplit(corpus(), holdout=0, block_size=8)
    for step in range(25):  # B = 1, nothing held out: microgpt's step
        assert [a.tolist() for a in one.step_tokens(step)] == [a.tolist() for a in microgpt_step_tokens(corpus(), step, 8)]


def test_step_tokens_follow_microgpt(names_corpus):
    split = DataSplit(names_corpus, holdout=0, block_size=16)
    for step in (0, 1, 5, len(names_corpus) + 3):  # wraps around: step % len(docs)
        inputs, targets = split.step_tokens(step)
        want_inputs, want_targets = microgpt_step_tokens(names_corpus, step, 16)
        assert inputs.tolist() == want_inputs.tolist() and targets.tolist() == want_targets.tolist()


def test_a_block_beyond_every_document_truncates_nothing():
    """block_size 10^12 (ModelConfig refuses it now) raised a raw OverflowError here:
    Python integer out of bounds for int32."""
    whole = DataSplit(corpus(), holdout=0, block_size=max(len(d) for d in DOCS) + 1)
    for block in (10**12, 2**31, 4096):
        split = DataSplit(corpus(), holdout=0, block_size=block)
        assert split.positions.dtype == np.int32
        assert split.positions.tolist() == whole.positions.tolist() == [len(d) + 1 for d in DOCS]


def test_long_documents_train_on_their_first_block_size_tokens():
    corpus = Corpus(["ab", "abcdefg", "abcdefgh", "abcdefghijkl"], shuffled=True)  # keep this order
    split = DataSplit(corpus, holdout=0, block_size=8)
    inputs, targets = split.step_tokens(3)
    assert len(inputs) == len(targets) == 8
    assert corpus.decode(inputs.tolist()) == "abcdefg"  # bos + the first 7 characters
    assert targets[-1] != corpus.bos  # the tail (and the closing bos) is cut off
    inputs, targets = split.step_tokens(1)  # exactly block-1 characters: fits
    assert len(inputs) == 8 and targets[-1] == corpus.bos


def test_a_batch_is_its_documents_padded_with_bos():
    c = corpus()
    split = DataSplit(c, holdout=0, block_size=8, batch_size=3)
    batch = split.batch(1)  # documents 3, 4, 5: "abcdabcdabcdab" (truncated), "bead", "c"
    assert batch.lengths.tolist() == [8, 5, 2] and batch.tokens.shape == (3, 9)
    for row, d in zip(batch.tokens, [3, 4, 5]):
        ids = [c.bos, *c.encode(c.docs[d]), c.bos][:9]
        assert row.tolist() == ids + [c.bos] * (9 - len(ids))
    mask = batch_mask(batch.lengths, 8, np, np.float32)
    assert mask.tolist() == [[1] * 8, [1] * 5 + [0] * 3, [1] * 2 + [0] * 6]


def test_default_holdout_and_its_checks():
    assert default_holdout(32_033) == 1000 and default_holdout(500) == 50 and default_holdout(9) == 0
    assert DataSplit(corpus(), None, 8).holdout == 1
    with pytest.raises(ValueError, match="holdout 11 leaves no documents to train on"):
        DataSplit(corpus(), 11, 8)
    for bad in [dict(batch_size=0), dict(batch_size=2.0), dict(holdout=-1), dict(holdout=True)]:
        with pytest.raises(ValueError):
            TrainConfig(**bad)


# one batched step against float64 references -----------------------------------

def float64_weights(model, c):
    specs = param_specs(model, c.vocab_size)
    flat = init_params(model, c.vocab_size, 7, 0.3).astype(np.float64)  # larger than training's std
    return specs, flat


def test_batched_float64_gradient_matches_finite_differences_of_the_plain_reference():
    c = corpus()
    split = DataSplit(c, holdout=0, block_size=8, batch_size=4)
    specs, flat = float64_weights(MODEL, c)
    batch = split.batch(0)  # "ab", "cabbage", "dd", "abcdabcdabcdab": 3, 8, 3, 8 positions
    assert len(set(batch.lengths.tolist())) > 1
    grad = np.full_like(flat, np.nan)
    loss = loss_and_grad(Weights(flat, specs, MODEL), Weights(grad, specs, MODEL), batch.inputs,
                         batch.targets, MODEL, np, batch.lengths)
    docs = split.step_documents(0)
    assert loss == pytest.approx(reference_batch_loss(flat, specs, MODEL, split, docs), rel=1e-12)
    assert np.all(np.isfinite(grad))
    rng = np.random.default_rng(0)
    for s in specs:
        for j in rng.choice(s.size, size=min(10, s.size), replace=False):
            i = s.offset + int(j)
            saved = flat[i]
            flat[i] = saved + H_STEP
            up = reference_batch_loss(flat, specs, MODEL, split, docs)
            flat[i] = saved - H_STEP
            down = reference_batch_loss(flat, specs, MODEL, split, docs)
            flat[i] = saved
            fd = (up - down) / (2 * H_STEP)
            assert abs(grad[i] - fd) <= 1e-6 * abs(fd) + 1e-9, f"{s.name}[{j}]: {grad[i]} vs {fd}"


@pytest.mark.parametrize("name, cls", host_backends(), ids=[n for n, _ in host_backends()])
def test_a_b4_step_loss_and_gradient_match_the_float64_reference(name, cls):
    c = corpus()
    train = TrainConfig(num_steps=50, batch_size=4, holdout=2, init_std=0.3, seed=7)
    backend = cls(MODEL, train, c)
    specs = backend.specs
    flat = backend.get_state().params.astype(np.float64)
    loss = float(backend._step_loss(1))  # documents 4..7
    got = np.asarray(backend.g, dtype=np.float64).copy()
    # the reference gradient: float64 engine math per document, weighted by its positions
    want = np.zeros_like(flat)
    docs = backend.split.step_documents(1)
    count = int(backend.split.positions[docs].sum())
    for d in docs:
        off, n = int(backend.split.offsets[d]), int(backend.split.positions[d])
        tokens = c.arrays.tokens
        g = np.empty_like(flat)
        loss_and_grad(Weights(flat, specs, MODEL), Weights(g, specs, MODEL), tokens[off : off + n],
                      tokens[off + 1 : off + 1 + n], MODEL, np)
        want += g * n / count
    assert loss == pytest.approx(reference_batch_loss(flat, specs, MODEL, backend.split, docs), abs=1e-4)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name, cls", host_backends(), ids=[n for n, _ in host_backends()])
def test_50_b4_steps_match_a_float64_per_document_run(name, cls):
    """Against microgpt's own scalar-autograd loop (tests/test_reference.py), batched
    the engine's way: documents (s*4 + b) % 8, the mean over all their positions."""
    c = corpus()
    train = TrainConfig(num_steps=50, batch_size=4, holdout=3, learning_rate=0.01)
    backend = cls(MODEL, train, c)
    got = backend.train(50)
    flat = init_params(MODEL, c.vocab_size, train.seed, train.init_std)
    want, params = microgpt_train(c.docs, flat, MODEL, train, 50, batch_size=4, n_train=8)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    np.testing.assert_allclose(backend.get_state().params, params, rtol=0, atol=1e-4)


def test_padding_changes_nothing():
    """A document alone and the same document padded beside a longer one: the same
    per-document loss and the same gradient (the longer one's subtracted)."""
    c = corpus()
    split = DataSplit(c, holdout=0, block_size=8)
    specs, flat = float64_weights(MODEL, c)
    w = Weights(flat, specs, MODEL)
    alone, padded = split.documents_batch(np.array([7])), split.documents_batch(np.array([7, 3]))
    assert padded.tokens.shape[1] > alone.tokens.shape[1]
    one = doc_losses(w, alone.inputs, alone.targets, alone.lengths, MODEL, np)
    both = doc_losses(w, padded.inputs, padded.targets, padded.lengths, MODEL, np)
    assert both[0] == pytest.approx(one[0], rel=1e-12)
    grads = {}
    for key, docs in (("short", [7]), ("long", [3]), ("both", [7, 3])):
        b = split.documents_batch(np.array(docs))
        g = np.empty_like(flat)
        loss_and_grad(w, Weights(g, specs, MODEL), b.inputs, b.targets, MODEL, np, b.lengths)
        grads[key] = g * b.positions
    np.testing.assert_allclose(grads["both"], grads["short"] + grads["long"], rtol=1e-9, atol=1e-12)


# B = 1 and the training order -------------------------------------------------------

def test_b1_without_holdout_is_microgpt_bit_for_bit(names_corpus):
    """The backend's losses equal a loop of engine.model.gpt over microgpt's order (microgpt_step_tokens)."""
    model = ModelConfig()
    train = TrainConfig(num_steps=40, holdout=0)
    got = open_backend("numpy", model, train, names_corpus).train(40)
    specs = param_specs(model, names_corpus.vocab_size)
    p = init_params(model, names_corpus.vocab_size, train.seed, train.init_std)
    g, m, v = (np.zeros_like(p) for _ in range(3))
    want = []
    for step in range(40):
        inputs, targets = microgpt_step_tokens(names_corpus, step, model.block_size)
        want.append(loss_and_grad(Weights(p, specs, model), Weights(g, specs, model), inputs, targets, model, np))
        adam_update(p, g, m, v, np.empty_like(p), train.lr_at(step), train.beta1, train.beta2, train.eps, step, np)
    assert np.array_equal(got, np.array(want, dtype=np.float32))


def test_holding_out_changes_no_step_before_the_first_epoch_ends():
    c = corpus()
    train = TrainConfig(num_steps=30, holdout=0)
    full = open_backend("numpy", MODEL, train, c).train(8)
    held = open_backend("numpy", MODEL, replace(train, holdout=3), c).train(8)
    assert np.array_equal(full, held)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_heldout_documents_never_reach_training(batch_size, monkeypatch):
    c = corpus()
    seen = []
    original_batch, original_tokens = DataSplit.documents_batch, DataSplit.step_tokens

    def record_batch(self, docs, *args, **kwargs):
        seen.extend(("batch", int(d)) for d in docs)
        return original_batch(self, docs, *args, **kwargs)

    def record_tokens(self, step):
        seen.append(("one", int(step % self.n_train)))
        return original_tokens(self, step)

    monkeypatch.setattr(DataSplit, "documents_batch", record_batch)
    monkeypatch.setattr(DataSplit, "step_tokens", record_tokens)
    backend = open_backend("numpy", MODEL, TrainConfig(num_steps=40, batch_size=batch_size, holdout=4), c)
    backend.train(20)  # several epochs of the 7 training documents
    trained = [d for _, d in seen]
    assert trained == [(s * batch_size + b) % 7 for s in range(20) for b in range(batch_size)]
    assert backend.epochs == pytest.approx(20 * batch_size / 7) and backend.names_seen == 20 * batch_size
    seen.clear()
    backend.heldout_loss()
    assert sorted(d for _, d in seen) == [7, 8, 9, 10]


# the held-out loss ------------------------------------------------------------------

@pytest.mark.parametrize("name, cls", host_backends(), ids=[n for n, _ in host_backends()])
def test_heldout_loss_is_the_token_weighted_mean_of_the_plain_reference(name, cls):
    c = corpus()
    backend = cls(MODEL, TrainConfig(num_steps=20, batch_size=2, holdout=4, init_std=0.3), c)
    backend.train(5)
    loss = backend.heldout_loss()
    flat = backend.get_state().params
    want = reference_batch_loss(flat, backend.specs, MODEL, backend.split, backend.split.heldout_documents())
    assert loss == pytest.approx(want, abs=1e-5)
    assert [(p.step, p.loss) for p in backend.heldout_history] == [(5, loss)]
    backend.heldout_loss()  # the same step again: one entry
    backend.train(3)
    assert [p.step for p in backend.heldout_history] == [5]
    backend.heldout_loss()
    assert [p.step for p in backend.heldout_history] == [5, 8]


def test_heldout_loss_in_several_batches_is_the_same(monkeypatch):
    c = corpus()
    backend = open_backend("numpy", MODEL, TrainConfig(num_steps=20, holdout=5), c)
    whole = backend.heldout_loss()
    monkeypatch.setattr(base, "EVAL_MAX_DOCS", 2)
    assert backend.heldout_loss() == pytest.approx(whole, rel=1e-6)


def test_no_heldout_loss_without_heldout_documents():
    backend = open_backend("numpy", MODEL, TrainConfig(num_steps=5, holdout=0), corpus())
    with pytest.raises(ValueError, match="holds out no documents"):
        backend.heldout_loss()
