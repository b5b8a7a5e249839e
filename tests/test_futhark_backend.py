"""The Futhark backends against the NumPy reference.

Marshalling (parameter layout, corpus arrays, loss and sample decoding) is
checked everywhere. Tests marked `futhark` compile kernels/microgpt.fut
with the real compiler and skip with the reason where `futhark` is absent.
"""
from __future__ import annotations

import numpy as np
import pytest

from engine import (BackendError, Corpus, ModelConfig, TrainConfig, TrainingDiverged, init_params,
                    list_backends, load_checkpoint, open_backend, param_specs)
from engine import futhark_build as fb
from engine import futhark_tools as ft
from engine.backends import futhark_backend as fbk
from engine.params import ParamSpec
from futhark_support import CPU_BACKENDS, open_futhark, requires_futhark

NAMES = ["emma", "olivia", "ava", "isabella", "sophia", "mia", "amelia", "harper", "evelyn",
         "abigail", "emily", "ella", "elizabeth", "camila", "luna", "bo", "christopherjohn"]
TWO_LAYERS = ModelConfig(n_embd=16, n_layer=2, n_head=2, block_size=8)  # heads differ from tiny's 4


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return Corpus.from_lines(NAMES)


# -- marshalling, no compiler needed ----------------------------------------------

@pytest.mark.parametrize("model", [ModelConfig(), TWO_LAYERS, ModelConfig(32, 3, 8, 32)])
def test_layout_is_engine_params_layout(model, corpus):
    specs = param_specs(model, corpus.vocab_size)
    offsets = fbk.layout_offsets(specs, model, corpus.vocab_size)
    assert offsets.dtype == np.int64 and len(offsets) == 3 + 6 * model.n_layer
    assert offsets.tolist() == [s.offset for s in specs]
    # the kernel reads each matrix with the shape engine.params gives it, back to back
    shapes = [shape for _, shape in fbk.kernel_matrices(model, corpus.vocab_size)]
    assert shapes == [s.shape for s in specs]
    ends = offsets + [r * c for r, c in shapes]
    assert ends[:-1].tolist() == offsets[1:].tolist() and ends[-1] == model.num_params(corpus.vocab_size)


def test_layout_refuses_a_different_order(corpus):
    model = ModelConfig()
    specs = param_specs(model, corpus.vocab_size)
    swapped = [specs[1], specs[0], *specs[2:]]
    with pytest.raises(BackendError, match="layout does not match"):
        fbk.layout_offsets(swapped, model, corpus.vocab_size)
    wider = [ParamSpec(s.name, (s.shape[0], s.shape[1] + 1), s.offset) for s in specs]
    with pytest.raises(BackendError):
        fbk.layout_offsets(wider, model, corpus.vocab_size)


def test_state_arguments_carry_the_configs_and_the_corpus(corpus):
    model, train = TWO_LAYERS, TrainConfig(num_steps=30, learning_rate=0.02, beta1=0.8, seed=3)
    params = init_params(model, corpus.vocab_size, train.seed, train.init_std)
    args = fbk.state_arguments(model, train, corpus, param_specs(model, corpus.vocab_size), params, blocks=3)
    (c, layers, heads, block, vocab, lr, b1, b2, eps, steps, blocks, layout, flat, tokens, offsets, lengths) = args
    assert (c, layers, heads, block, vocab) == (16, 2, 2, 8, corpus.vocab_size)
    assert (lr, b1, b2, eps, steps, blocks) == (0.02, 0.8, 0.99, 1e-8, 30, 3)
    assert flat.dtype == np.float32 and np.array_equal(flat, params)
    assert (tokens.dtype, offsets.dtype, lengths.dtype) == (np.int32, np.int64, np.int32)
    bos = corpus.bos
    for doc, off, length in zip(corpus.docs, offsets, lengths):
        assert tokens[off : off + length].tolist() == [bos, *corpus.encode(doc), bos]


@pytest.mark.parametrize("block_size", [4, 8, 16])
def test_kernel_windows_are_the_reference_step_tokens(corpus, block_size):
    """The kernel's step_loss_grad reads document step % D, its first
    T = min(block_size, length - 1) positions: the same tokens as the NumPy backend."""
    model, train = ModelConfig(n_embd=8, n_head=2, block_size=block_size), TrainConfig(num_steps=40)
    args = fbk.state_arguments(model, train, corpus, param_specs(model, corpus.vocab_size),
                               init_params(model, corpus.vocab_size, 0, 0.1))
    tokens, offsets, lengths = args[-3:]
    for step in range(2 * len(corpus) + 3):
        doc = step % len(offsets)
        t = min(block_size, int(lengths[doc]) - 1)
        start = int(offsets[doc])
        inputs, targets = corpus.step_tokens(step, block_size)
        assert tokens[start : start + t].tolist() == inputs.tolist()
        assert tokens[start + 1 : start + 1 + t].tolist() == targets.tolist()


def test_losses_until_divergence():
    assert fbk.losses_until_divergence(np.array([3.0, 2.5, 2.0], np.float32)).tolist() == [3.0, 2.5, 2.0]
    cut = fbk.losses_until_divergence(np.array([3.0, np.inf, np.nan, np.nan], np.float32))
    assert cut.dtype == np.float32 and cut[0] == 3.0 and np.isinf(cut[1]) and len(cut) == 2
    assert len(fbk.losses_until_divergence(np.array([np.nan, np.nan], np.float32))) == 1


def test_sample_rows_to_ids_stops_at_bos():
    rows = np.array([[1, 2, 9, 9], [9, 9, 9, 9], [3, 4, 5, 6]], dtype=np.int32)
    assert fbk.sample_rows_to_ids(rows, bos=9) == [[1, 2], [], [3, 4, 5, 6]]


def test_the_four_backends_are_registered():
    names = {info.name for info in list_backends()}
    assert {"futhark-c", "futhark-multicore", "futhark-cuda", "futhark-opencl"} <= names
    assert {cls.target for cls in (fbk.FutharkCBackend, fbk.FutharkMulticoreBackend,
                                   fbk.FutharkCudaBackend, fbk.FutharkOpenCLBackend)} == set(fb.TARGETS)


# -- with the compiler ----------------------------------------------------------

@pytest.mark.futhark
@requires_futhark
@pytest.mark.parametrize("name", CPU_BACKENDS)
@pytest.mark.parametrize("model", [ModelConfig(), TWO_LAYERS], ids=["tiny", "2layer-2head"])
def test_50_steps_match_numpy(name, model, names_corpus):
    train = TrainConfig(num_steps=60, learning_rate=0.01)
    reference = open_backend("numpy", model, train, names_corpus)
    backend = open_futhark(name, model, train, names_corpus)
    try:
        expected = np.concatenate([reference.train(20), reference.train(30)])
        got = np.concatenate([backend.train(1), backend.train(19), backend.train(30)])
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)
        assert backend.step == 50
        state, ref_state = backend.get_state(), reference.get_state()
        assert state.step == 50
        for field in ("params", "m", "v"):
            np.testing.assert_allclose(getattr(state, field), getattr(ref_state, field), rtol=1e-3, atol=1e-5)
    finally:
        backend.close()


@pytest.mark.futhark
@requires_futhark
@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_samples_are_valid_names(name, corpus):
    model = ModelConfig(n_embd=16, n_layer=1, n_head=4, block_size=8)
    backend = open_futhark(name, model, TrainConfig(num_steps=40), corpus)
    backend.train(40)
    samples = backend.sample(25, temperature=0.8, seed=7)
    assert len(samples) == 25
    alphabet = set(corpus.chars)
    for sample in samples:
        assert set(sample) <= alphabet and len(sample) <= model.block_size
    assert len(set(samples)) > 1
    assert backend.sample(25, temperature=0.8, seed=7) == samples  # a seed names the draw
    # a cold temperature concentrates the draws on the most likely names
    cold = backend.sample(40, temperature=0.05, seed=1)
    assert len(set(cold)) < len(set(backend.sample(40, temperature=2.0, seed=1)))
    backend.close()


@pytest.mark.futhark
@requires_futhark
def test_checkpoints_move_between_futhark_and_numpy(names_corpus, tmp_path):
    model, train = TWO_LAYERS, TrainConfig(num_steps=40)
    futhark = open_futhark("futhark-c", model, train, names_corpus)
    futhark.train(15)
    futhark.save(tmp_path / "f.npz")
    numpy_resumed = load_checkpoint(tmp_path / "f.npz", backend="numpy")
    expected = futhark.train(10)
    np.testing.assert_allclose(numpy_resumed.train(10), expected, atol=1e-4, rtol=0)

    numpy_resumed.save(tmp_path / "n.npz")
    futhark_resumed = load_checkpoint(tmp_path / "n.npz", backend="futhark-c")
    assert futhark_resumed.step == 25
    np.testing.assert_allclose(futhark_resumed.train(10), numpy_resumed.train(10), atol=1e-4, rtol=0)
    np.testing.assert_array_equal(futhark_resumed.loss_history[:15], futhark.loss_history[:15])
    futhark.close()
    futhark_resumed.close()


@pytest.mark.futhark
@requires_futhark
def test_divergence_keeps_the_parameters_from_before(corpus):
    model = ModelConfig(n_embd=16, n_layer=1, n_head=4, block_size=8)
    train = TrainConfig(num_steps=50, learning_rate=1e30)  # blows up within a few steps
    futhark = open_futhark("futhark-c", model, train, corpus)
    with pytest.raises(TrainingDiverged) as error:
        futhark.train(50)
    good = futhark.step
    assert error.value.step == good and 0 < good < 50 and not np.isfinite(error.value.loss)
    # a second run that stops just before the bad step is in the same state
    before = open_futhark("futhark-c", model, train, corpus)
    np.testing.assert_array_equal(before.train(good), futhark.loss_history)
    for field in ("params", "m", "v", "step"):
        np.testing.assert_array_equal(getattr(futhark.get_state(), field), getattr(before.get_state(), field))
    # and it reports the same non-finite loss for the next step
    with pytest.raises(TrainingDiverged):
        before.train(1)
    assert before.step == good
    futhark.close()
    before.close()


@pytest.mark.futhark
@requires_futhark
def test_a_run_time_error_is_an_exception_and_keeps_the_state(corpus):
    model, train = ModelConfig(n_embd=16, n_layer=1, n_head=4, block_size=8), TrainConfig(num_steps=20)
    futhark = open_futhark("futhark-c", model, train, corpus)
    reference = open_backend("numpy", model, train, corpus)
    np.testing.assert_allclose(futhark.train(3), reference.train(3), atol=1e-5)
    # a state whose corpus holds a token id outside the vocabulary: the kernel's
    # bounds check fails inside `train`
    args = list(fbk.state_arguments(model, train, corpus, futhark.specs, reference.get_state().params))
    args[-3] = args[-3].copy()
    args[-3][1] = corpus.vocab_size + 5
    bad = futhark._call("new_state", *args)
    with pytest.raises(BackendError, match=r"(?i)index|bounds"):
        futhark._values(futhark._call("train", bad, 1)[1])
    np.testing.assert_allclose(futhark.train(5), reference.train(5), atol=1e-4)
    futhark.close()


@pytest.mark.futhark
@requires_futhark
@pytest.mark.parametrize("change", ["past-the-end", "negative", "too-short"])
def test_new_state_refuses_a_layout_that_does_not_fit(corpus, change):
    """The kernel reads matrices unchecked, so it checks the layout once, up front."""
    model, train = ModelConfig(n_embd=16, n_layer=1, n_head=4, block_size=8), TrainConfig(num_steps=5)
    futhark = open_futhark("futhark-c", model, train, corpus)
    args = list(fbk.state_arguments(model, train, corpus, futhark.specs, futhark.get_state().params))
    layout = args[11].copy()
    if change == "past-the-end":
        layout[-1] += 1
    elif change == "negative":
        layout[0] = -1
    else:
        layout = layout[:-1]
    args[11] = layout
    with pytest.raises(BackendError, match=r"(?i)assert"):
        futhark._call("new_state", *args)
    args[11] = fbk.layout_offsets(futhark.specs, model, corpus.vocab_size)
    futhark._call("new_state", *args)  # the true layout is accepted
    futhark.close()


@pytest.mark.futhark
@requires_futhark
def test_one_library_serves_every_size(corpus):
    """Sizes are run-time values: a second, different model reuses the compiled library."""
    compiler = ft.find_compiler()
    libdir = fb.build("c", compiler)
    before = libdir.stat().st_mtime_ns
    for model in (ModelConfig(n_embd=8, n_layer=1, n_head=1, block_size=4),
                  ModelConfig(n_embd=24, n_layer=3, n_head=3, block_size=12)):
        backend = open_futhark("futhark-c", model, TrainConfig(num_steps=3), corpus)
        reference = open_backend("numpy", model, TrainConfig(num_steps=3), corpus)
        np.testing.assert_allclose(backend.train(3), reference.train(3), atol=1e-4)
        backend.close()
    assert fb.build("c", compiler) == libdir and libdir.stat().st_mtime_ns == before
