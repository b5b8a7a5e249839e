"""The Futhark backends against the NumPy reference.

Marshalling (parameter layout, corpus arrays, loss and sample decoding) is
checked without building anything. Tests marked `futhark` build the C and
multicore backends from the shipped generated C (kernels/generated/) with
no Futhark compiler to be found, as on a user's machine or in CI; each
library is built once per session (and then comes from the suite's build
cache, see conftest.py). (How they are built: test_futhark_build.py.)
"""
from __future__ import annotations

import gc
import json
import os

import numpy as np
import pytest

from engine import (PRESETS, BackendError, Corpus, ModelConfig, TrainConfig, TrainingDiverged, TrainState,
                    list_backends, load_checkpoint, open_backend, param_specs)
from engine import futhark
from engine.backends import futhark_backend as fbk
from engine.futhark import build as fb
from engine.params import ParamSpec
from futhark_support import CPU_BACKENDS, MULTICORE_2_THREADS, assert_same_kernel_run, hide_futhark
from reference_model import microgpt_step_tokens

NAMES = ["emma", "olivia", "ava", "isabella", "sophia", "mia", "amelia", "harper", "evelyn",
         "abigail", "emily", "ella", "elizabeth", "camila", "luna", "bo", "christopherjohn"]
TWO_LAYERS = ModelConfig(n_embd=16, n_layer=2, n_head=2, block_size=8)  # heads differ from tiny's 4
LAYOUT = -4  # new_model's layout argument, before the tokens, offsets and lengths


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


def test_multicore_threads_by_work_per_step():
    """One thread below MULTICORE_MIN_WORK parameters times documents per step (a
    second made small steps slower), every core from there."""
    assert fbk.multicore_threads(fbk.MULTICORE_MIN_WORK - 1, 2, environ={}) == 1
    assert fbk.multicore_threads(fbk.MULTICORE_MIN_WORK, 2, environ={}) == 2
    assert fbk.multicore_threads(85_000_000, 8, environ={}) == 8
    # measured (docs/performance.md, "The workers' wait"): at one document per
    # step s64 is faster on one thread, s128 on two; at batches s64 and 2 documents
    # level, learn and s32 at 32 faster on two
    names_vocab = 27
    params = {name: PRESETS[name].model.num_params(names_vocab) for name in ("learn", "s32", "s64", "s128", "s256")}
    assert fbk.multicore_threads(params["s64"], 2, environ={}) == 1
    assert fbk.multicore_threads(params["s128"], 2, environ={}) == 2
    assert fbk.multicore_threads(params["s256"], 2, environ={}) == 2
    assert fbk.multicore_threads(params["learn"], 2, environ={}, batch=32) == 2
    assert fbk.multicore_threads(params["s32"], 2, environ={}, batch=32) == 2
    assert fbk.multicore_threads(params["s64"], 2, environ={}, batch=32) == 2
    assert fbk.multicore_threads(params["s128"], 2, environ={}, batch=16) == 2
    assert fbk.multicore_threads(4192, 2, environ={}, batch=2) == 1
    assert fbk.multicore_threads(params["learn"], 2, environ={}, batch=4) == 1  # 107,000: level, c's
    assert fbk.multicore_threads(4192, 2, environ={fbk.THREADS_ENV: " 3 "}) == 3
    assert fbk.multicore_threads(4192, 2, environ={fbk.THREADS_ENV: "2"}, batch=16) == 2
    # a batch runs on at most B threads, asked or not (Futhark's nested loops went wrong)
    assert fbk.multicore_threads(4192, 2, environ={fbk.THREADS_ENV: "5"}, batch=3) == 3
    assert fbk.multicore_threads(4192, 2, environ={fbk.THREADS_ENV: "5"}, batch=1) == 5
    assert fbk.multicore_threads(params["s64"], 16, environ={}, batch=4) == 4
    assert fbk.multicore_threads(params["learn"], 64, environ={}, batch=32) == 32
    assert fbk.multicore_threads(params["s128"], 16, environ={}) == 16
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(BackendError, match=fbk.THREADS_ENV):
            fbk.multicore_threads(4192, 2, environ={fbk.THREADS_ENV: bad})


def test_small_models_batches_train_in_parts_on_every_core():
    """A batch of PARTS_MIN_BATCH documents or more of a model under PARTS_MAX_PARAMS
    trains in a group of documents per thread (measured: tiny to s128 faster so,
    s256 level at 32 documents and slower at 16), so tiny's batches, too little work
    for the products' tasks, get every core too."""
    params = {name: PRESETS[name].model.num_params(27) for name in ("tiny", "learn", "s32", "s64", "s128", "s256")}
    assert all(fbk.batches_in_parts(params[name], batch) for name in ("tiny", "learn", "s32", "s64", "s128")
               for batch in (8, 32))
    assert not any(fbk.batches_in_parts(params["s256"], batch) for batch in (8, 32, 64))
    assert fbk.batches_in_parts(params["tiny"], fbk.PARTS_MIN_BATCH)
    assert not fbk.batches_in_parts(params["tiny"], fbk.PARTS_MIN_BATCH - 1)
    assert not fbk.batches_in_parts(params["tiny"], 1)
    assert fbk.multicore_threads(params["tiny"], 2, environ={}, batch=32) == 2  # 134,000: one thread before
    assert fbk.multicore_threads(params["tiny"], 2, environ={}, batch=4) == 1


def test_train_entry_by_batch():
    """B = 1 runs each target's program for one document a step and its `train`
    (multicore.fut's is its form for several threads); batches the _batch program
    and its train_batch; each program lists its own step alone, and only B = 1's
    the evaluation (held-out losses, sampling), which batches run there."""
    assert fbk.train_entry(1) == "train"
    assert fbk.train_entry(2) == fbk.train_entry(32) == "train_batch"
    assert fbk.train_entry(32, in_parts=True) == "train_batch_parts" and fbk.train_entry(1, in_parts=True) == "train"
    for target in ("c", "multicore", "cuda", "opencl"):
        assert fbk.entry_points(1, target) == fbk.SHARED_ENTRY_POINTS + fbk.EVALUATION_ENTRY_POINTS + ("train",)
    for target in ("c", "cuda", "opencl"):
        assert fbk.entry_points(32, target) == fbk.SHARED_ENTRY_POINTS + ("train_batch",)  # evaluation: B = 1's
    assert fbk.entry_points(32, "multicore") == fbk.SHARED_ENTRY_POINTS + ("train_batch", "train_batch_parts")
    assert set(fbk.entry_points(1)) | set(fbk.entry_points(2, "multicore")) == set(fbk.ENTRY_POINTS)


@pytest.mark.parametrize("cls, copies", [(fbk.FutharkCBackend, "4 more copies"),
                                         (fbk.FutharkCudaBackend, "1 more copy")])
def test_the_memory_check_counts_a_batched_runs_copy_of_the_weights(cls, copies, monkeypatch, corpus):
    """At B > 1 held-out losses and sampling run on a copy of the weights in the
    program for one document a step: its parameters and zero moments (host memory
    on a CPU target, the GPU's on a GPU target) and the host copy they come
    through. The check refuses before anything is built or allocated."""
    from engine.backends import base

    monkeypatch.setattr(base, "available_memory_bytes", lambda: 1)
    evaluation = "for held-out losses and sampling"
    for batch, counted in ((8, True), (1, False)):
        with pytest.raises(BackendError) as info:
            cls(ModelConfig(), TrainConfig(num_steps=2, batch_size=batch), corpus)
        assert (f"{copies} {evaluation}" in str(info.value)) is counted, str(info.value)


@pytest.mark.futhark
@pytest.mark.parametrize("name, threads, library", [("futhark-multicore", 1, "c"),
                                                     (MULTICORE_2_THREADS, 2, "multicore")])
def test_one_thread_runs_the_sequential_build(name, threads, library, corpus, futhark_cpu_builds):
    backend = open_backend(name, ModelConfig(), TrainConfig(num_steps=5), corpus)
    try:
        assert (backend.threads(), backend.library_target()) == (threads, library)
    finally:
        backend.close()


def test_open_context_sets_the_thread_count(futhark_cpu_builds):
    """The multicore runtime starts a worker thread per thread past the first."""
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("counts threads through /proc")
    gc.collect()  # contexts earlier tests left to the collector end their threads now, not midway
    before = len(os.listdir("/proc/self/task"))
    one = fbk.open_context("multicore", 1)
    assert len(os.listdir("/proc/self/task")) == before
    two = fbk.open_context("multicore", 2)
    assert len(os.listdir("/proc/self/task")) == before + 1
    del one, two


def test_model_arguments_carry_the_configs_and_the_corpus(corpus):
    model = TWO_LAYERS
    train = TrainConfig(num_steps=30, learning_rate=0.02, beta1=0.8, seed=3, warmup_steps=7, batch_size=5)
    args = fbk.model_arguments(model, train, corpus, param_specs(model, corpus.vocab_size), threads=3)
    (c, layers, heads, block, vocab, lr, b1, b2, eps, steps, warmup, threads, batch, layout, tokens, offsets,
     lengths) = args
    assert (c, layers, heads, block, vocab) == (16, 2, 2, 8, corpus.vocab_size)
    assert (lr, b1, b2, eps, steps, warmup, threads, batch) == (0.02, 0.8, 0.99, 1e-8, 30, 7, 3, 5)
    specs = param_specs(model, corpus.vocab_size)
    assert layout.tolist() == [s.offset for s in specs]
    assert (tokens.dtype, offsets.dtype, lengths.dtype) == (np.int32, np.int64, np.int32)
    bos = corpus.bos
    for doc, off, length in zip(corpus.docs, offsets, lengths):
        assert tokens[off : off + length].tolist() == [bos, *corpus.encode(doc), bos]


@pytest.mark.parametrize("block_size", [4, 8, 16])
def test_kernel_windows_are_the_reference_step_tokens(corpus, block_size):
    """The kernel's step_loss_grad reads document step % D, its first
    T = min(block_size, length - 1) positions: the same tokens as the NumPy backend."""
    model, train = ModelConfig(n_embd=8, n_head=2, block_size=block_size), TrainConfig(num_steps=40)
    tokens, offsets, lengths = fbk.model_arguments(model, train, corpus, param_specs(model, corpus.vocab_size))[-3:]
    for step in range(2 * len(corpus) + 3):
        doc = step % len(offsets)
        t = min(block_size, int(lengths[doc]) - 1)
        start = int(offsets[doc])
        inputs, targets = microgpt_step_tokens(corpus, step, block_size)
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
                                   fbk.FutharkCudaBackend, fbk.FutharkOpenCLBackend)} == set(futhark.TARGETS)


# -- built from the shipped C, with no Futhark compiler --------------------------------



@pytest.fixture(autouse=True)
def without_futhark(monkeypatch, tmp_path):
    """No Futhark compiler can be found: the backends run from the shipped code."""
    hide_futhark(monkeypatch, tmp_path)


@pytest.mark.futhark
@pytest.mark.parametrize("name", CPU_BACKENDS)
@pytest.mark.parametrize("model", [ModelConfig(), TWO_LAYERS], ids=["tiny", "2layer-2head"])
@pytest.mark.parametrize("warmup", [0, 24], ids=["microgpt-schedule", "warmup"])
def test_50_steps_match_numpy(name, model, warmup, names_corpus, futhark_cpu_builds):
    """Per-step losses to 1e-4, with microgpt's schedule and with a warm-up
    (ramping through the first 24 steps, across the calls' boundaries)."""
    train = TrainConfig(num_steps=60, learning_rate=0.01, warmup_steps=warmup)
    if model is TWO_LAYERS:  # block_size 8: the longer names are truncated
        assert max(len(doc) for doc in names_corpus.docs) + 1 > model.block_size
    reference = open_backend("numpy", model, train, names_corpus)
    backend = open_backend(name, model, train, names_corpus)
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


def peak_context_bytes(backend) -> int:
    """The most memory the backend's Futhark context has held at once (its report)."""
    fut = backend._fut
    report = json.loads(fut.ffi.string(fut.lib.futhark_context_report(fut.ctx)).decode())
    return sum(report["memory"].values())


@pytest.mark.futhark
@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_train_updates_the_weights_without_a_copy(name, corpus, futhark_cpu_builds):
    """train consumes the weights: in all the context never holds much more than
    the parameters and moments (3 P floats), where a copy per call would double it."""
    model = ModelConfig(n_embd=64, n_layer=2, n_head=4, block_size=8)
    backend = open_backend(name, model, TrainConfig(num_steps=10), corpus)
    try:
        for k in (1, 3, 1):
            backend.train(k)
        weights = 3 * 4 * backend.num_params
        assert weights < peak_context_bytes(backend) < 1.25 * weights
    finally:
        backend.close()


@pytest.mark.futhark
@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_samples_are_valid_names(name, corpus, futhark_cpu_builds):
    model = ModelConfig(n_embd=16, n_layer=1, n_head=4, block_size=8)
    backend = open_backend(name, model, TrainConfig(num_steps=40), corpus)
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
@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_checkpoints_move_between_futhark_and_numpy(name, names_corpus, tmp_path, futhark_cpu_builds):
    model, train = TWO_LAYERS, TrainConfig(num_steps=40)
    futhark_run = open_backend(name, model, train, names_corpus)
    futhark_run.train(15)
    futhark_run.save(tmp_path / "f.npz")
    numpy_resumed = load_checkpoint(tmp_path / "f.npz", backend="numpy")
    expected = futhark_run.train(10)
    np.testing.assert_allclose(numpy_resumed.train(10), expected, atol=1e-4, rtol=0)

    numpy_resumed.save(tmp_path / "n.npz")
    futhark_resumed = load_checkpoint(tmp_path / "n.npz", backend=name)
    assert futhark_resumed.step == 25
    np.testing.assert_allclose(futhark_resumed.train(10), numpy_resumed.train(10), atol=1e-4, rtol=0)
    np.testing.assert_array_equal(futhark_resumed.loss_history[:15], futhark_run.loss_history[:15])
    futhark_run.close()
    futhark_resumed.close()


def scaled_state(backend, scale: float) -> TrainState:
    """backend's state with every weight times scale: what one Adam step at a learning
    rate of 1e30 made of them, before engine.config limited the rate to 1."""
    state = backend.get_state()
    return TrainState(state.params * np.float32(scale), state.m, state.v, state.step)


@pytest.mark.futhark
@pytest.mark.parametrize("name", CPU_BACKENDS)
@pytest.mark.parametrize("scale", [1e30, 1e10])
def test_an_overflowed_gradient_stops_where_numpy_stops(name, scale, corpus, futhark_cpu_builds):
    """A step whose loss is finite but whose gradient overflows (weights of 1e30 make
    rmsnorm overflow, which gives uniform logits) applies no update: it used to write
    NaN into every parameter one step after NumPy stopped."""
    model = ModelConfig(n_embd=16, n_layer=1, n_head=4, block_size=8)
    train = TrainConfig(num_steps=50)
    reference, backend = open_backend("numpy", model, train, corpus), open_backend(name, model, train, corpus)
    reference.train(3)
    huge = scaled_state(reference, scale)
    for run in (reference, backend):
        run.set_state(huge)
        with pytest.raises(TrainingDiverged):
            run.train(50)
    assert backend.step == reference.step == 3
    expected, got = reference.get_state(), backend.get_state()
    for field in ("params", "m", "v"):
        assert np.isfinite(getattr(got, field)).all(), field
        np.testing.assert_allclose(getattr(got, field), getattr(expected, field), rtol=1e-4,
                                   atol=1e-4 * np.abs(getattr(expected, field)).max())
    backend.close()


@pytest.mark.futhark
@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_divergence_keeps_the_parameters_from_before(name, corpus, futhark_cpu_builds):
    """The kernel's isnan/isinf check survives the build's flags (no finite-math assumption)."""
    model = ModelConfig(n_embd=16, n_layer=1, n_head=4, block_size=8)
    train = TrainConfig(num_steps=50)
    # the embedding of position 7 is NaN: the first step on a name of 7 or more letters
    # diverges (the names before it train normally)
    poisoned = open_backend("numpy", model, train, corpus).get_params()
    poisoned["wpe"][7] = np.nan

    def open_poisoned():
        backend = open_backend(name, model, train, corpus)
        backend.set_params(poisoned)
        return backend

    diverged = open_poisoned()
    with pytest.raises(TrainingDiverged) as error:
        diverged.train(50)
    good = diverged.step
    assert error.value.step == good and 0 < good < 50 and not np.isfinite(error.value.loss)
    state = diverged.get_state()
    # a second run that stops just before the bad step is in the same state (the same kernel's run)
    before = open_poisoned()

    def same(actual, desired):
        finite = np.abs(np.asarray(desired)[np.isfinite(desired)])  # two threads: 1e-5 of the largest
        assert_same_kernel_run(name, actual, desired, rtol=1e-4, atol=1e-5 * finite.max(initial=0.0))
    same(before.train(good), diverged.loss_history)
    for field in ("params", "m", "v", "step"):
        same(getattr(state, field), getattr(before.get_state(), field))
    # and it reports the same non-finite loss for the next step
    with pytest.raises(TrainingDiverged):
        before.train(1)
    assert before.step == good
    diverged.close()
    before.close()


@pytest.mark.futhark
def test_two_backends_open_in_one_process(corpus, futhark_cpu_builds):
    """futhark-c twice and futhark-multicore at once, in turns: each keeps its own state."""
    model = ModelConfig(n_embd=16, n_layer=1, n_head=4, block_size=8)
    runs = [(open_backend(name, model, TrainConfig(num_steps=30, seed=seed), corpus),
             open_backend("numpy", model, TrainConfig(num_steps=30, seed=seed), corpus))
            for name, seed in (("futhark-c", 1), ("futhark-multicore", 2), ("futhark-c", 3))]
    for chunk in (4, 7, 9):
        for backend, reference in runs:
            np.testing.assert_allclose(backend.train(chunk), reference.train(chunk), atol=1e-4, rtol=0)
    assert runs[0][0].sample(5, seed=4) != runs[2][0].sample(5, seed=4) or \
        not np.array_equal(runs[0][0].get_state().params, runs[2][0].get_state().params)
    for backend, _ in runs:
        backend.close()


@pytest.mark.futhark
def test_a_failed_train_call_says_the_weights_are_lost_and_set_state_recovers(corpus, futhark_cpu_builds):
    """train consumes the weights (no copy of them per call): after a failed call
    the backend refuses what needs them, with the reason, until set_state."""
    model, train = ModelConfig(n_embd=16, n_layer=1, n_head=4, block_size=8), TrainConfig(num_steps=20)
    backend = open_backend("futhark-c", model, train, corpus)
    reference = open_backend("numpy", model, train, corpus)
    np.testing.assert_allclose(backend.train(3), reference.train(3), atol=1e-5)
    # a model whose corpus holds a token id outside the vocabulary in step 3's
    # document: the kernel's bounds check fails inside `train`
    args = list(fbk.model_arguments(model, train, corpus, backend.specs))
    args[-3] = args[-3].copy()
    args[-3][args[-2][3 % len(corpus)] + 1] = corpus.vocab_size + 5
    good, backend._model = backend._model, backend._call("new_model", *args)
    with pytest.raises(BackendError, match=r"(?is)(index|bounds).*at step 3 used them up"):
        backend.train(1)
    assert backend.step == 3
    backend._model = good
    for use in (backend.get_state, lambda: backend.train(1), lambda: backend.sample(2)):
        with pytest.raises(BackendError, match="has no weights: a failed train call at step 3"):
            use()
    backend.set_state(reference.get_state(), losses=reference.loss_history)
    np.testing.assert_allclose(backend.train(5), reference.train(5), atol=1e-4)
    backend.close()


@pytest.mark.futhark
@pytest.mark.parametrize("change", ["past-the-end", "negative", "too-short"])
def test_weights_refuse_a_layout_that_does_not_fit(corpus, change, futhark_cpu_builds):
    """The kernel reads matrices unchecked, so it checks the layout where weights are made."""
    model, train = ModelConfig(n_embd=16, n_layer=1, n_head=4, block_size=8), TrainConfig(num_steps=5)
    backend = open_backend("futhark-c", model, train, corpus)
    state = backend.get_state()
    args = list(fbk.model_arguments(model, train, corpus, backend.specs))
    layout = args[LAYOUT].copy()
    if change == "past-the-end":
        layout[-1] += 1
    elif change == "negative":
        layout[0] = -1
    else:
        layout = layout[:-1]
    args[LAYOUT] = layout
    bad = backend._call("new_model", *args)
    with pytest.raises(BackendError, match=r"(?i)assert"):
        backend._call("initial_weights", bad, state.params)
    with pytest.raises(BackendError, match=r"(?i)assert"):
        backend._call("new_weights", bad, state.params, state.m, state.v, 0)
    args[LAYOUT] = fbk.layout_offsets(backend.specs, model, corpus.vocab_size)
    backend._call("initial_weights", backend._call("new_model", *args), state.params)  # the true layout is accepted
    backend.close()


@pytest.mark.futhark
def test_one_library_serves_every_size(corpus, futhark_cpu_builds, session_compiler):
    """Sizes are run-time values: a second, different model reuses the compiled library."""
    libdir = futhark_cpu_builds["c"]
    before = libdir.stat().st_mtime_ns
    for model in (ModelConfig(n_embd=8, n_layer=1, n_head=1, block_size=4),
                  ModelConfig(n_embd=24, n_layer=3, n_head=3, block_size=12)):
        backend = open_backend("futhark-c", model, TrainConfig(num_steps=3), corpus)
        reference = open_backend("numpy", model, TrainConfig(num_steps=3), corpus)
        np.testing.assert_allclose(backend.train(3), reference.train(3), atol=1e-4)
        backend.close()
    assert fb.build("c") == libdir and libdir.stat().st_mtime_ns == before
