"""The Futhark kernel's hand-written backward pass against `vjp`, and its
key/value-cache sampler against an independent reference.

Training's own gradient must equal grad_vjp (`vjp` of kernels/lib/model.fut's
loss, in the tests' program kernels/tests/oracle.fut) and NumPy's
loss_and_grad on several documents and model sizes, through every way a
program runs its backward products (model.fut's `products`: futhark-c's
sequential sums; futhark-multicore's tasks over blocks of rows, on 2 and 3
threads, even and uneven; the GPU program's thread per position and column,
run by the oracle program in sequential C). It is read from training itself:
with beta1 = 0, Adam's first moment after a step is exactly that step's
gradient (m = 0 * m + 1 * g). Samples must equal
tests/futhark_support.py's reference: engine/model/sampling.py's generator in pure
Python (tests/rng_reference.py), NumPy's full forward pass for every token,
the float64 inverse-CDF draw; and stop at max_length.
"""
from __future__ import annotations

import numpy as np
import pytest

from engine import Cancelled, Corpus, ModelConfig, TrainConfig, open_backend
from engine.backends import futhark_backend as fbk
from engine.data.split import DataSplit
from engine.model.gpt import Weights, loss_and_grad
from futhark_support import (CPU_BACKENDS, MULTICORE_2_THREADS, MULTICORE_3_THREADS, Oracle, backend_steps,
                             reference_samples)

# the libraries come from the shipped C (kernels/generated/), built once per session
pytestmark = [pytest.mark.futhark, pytest.mark.usefixtures("futhark_cpu_builds")]

# Names from 2 to 15 characters: documents of T = 3 .. 16 positions.
NAMES = ["emma", "olivia", "ava", "isabella", "sophia", "mia", "amelia", "harper", "evelyn",
         "abigail", "emily", "ella", "elizabeth", "camila", "luna", "bo", "christopherjohn"]
MODELS = {
    "tiny": ModelConfig(),
    "2layer-2head": ModelConfig(n_embd=16, n_layer=2, n_head=2, block_size=8),
    "s64ish": ModelConfig(n_embd=64, n_layer=3, n_head=4, block_size=64),
    # products of T x 256 x 1024 multiply-adds: past model.fut's parallel_work
    # from T = 4, so futhark-multicore's tasks take the parallel branch of back_linear
    "wide": ModelConfig(n_embd=256, n_layer=1, n_head=4, block_size=16),
}
# the wide model's initial scale: at 0.1 its losses run past 100, where float32
# rounding alone moves a loss by more than the tolerances below
INIT_STD = {"wide": 0.02}
STEPS = [0, 2, 14, 15, 16, 23]  # emma, ava, luna, bo, christopherjohn (truncated at 8), then wrapped


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return Corpus.from_lines(NAMES)


GPU = "gpu.fut's step"  # run by the oracle program (sequential C)


@pytest.mark.parametrize("name", CPU_BACKENDS + [MULTICORE_3_THREADS])
@pytest.mark.parametrize("model_name", list(MODELS))
def test_training_gradient_equals_vjp_and_numpy(name, model_name, corpus):
    model = MODELS[model_name]
    # every document trained (holdout 0), in microgpt's order, as the kernel's steps index them
    train = TrainConfig(num_steps=100, init_std=INIT_STD.get(model_name, 0.1), beta1=0.0, holdout=0)
    backend = open_backend(name, model, train, corpus)
    split = DataSplit(corpus, 0, model.block_size)
    try:
        assert backend.split.n_train == len(corpus)
        oracle = Oracle(backend)
        backend.train(5)  # away from the initial parameters, with Adam moments
        state = backend.get_state()
        for step in STEPS:
            vjp_loss, vjp_grad = oracle.gradient(state, step)
            numpy_grad = np.zeros_like(state.params)
            inputs, targets = split.step_tokens(step)
            numpy_loss = loss_and_grad(Weights(state.params, backend.specs, model),
                                       Weights(numpy_grad, backend.specs, model), inputs, targets, model, np)
            # the backend's own program, and (once, on futhark-c's run) the GPU program's step
            runs = {name: backend_steps(backend, state, step, 1)}
            if name == "futhark-c":
                runs[GPU] = oracle.gpu_steps(state, step, 1)
            for losses, _, train_grad in runs.values():
                loss = float(losses[0])
                assert abs(loss - vjp_loss) < 1e-5 and abs(loss - float(numpy_loss)) < 1e-5
                # float32 sums in another order: 1e-5 absolute, and 1e-5 relative for the
                # wide model's entries near 3 (on some CPUs they differ by 4e-6 relative)
                np.testing.assert_allclose(train_grad, vjp_grad, rtol=1e-5, atol=1e-5)
                np.testing.assert_allclose(train_grad, numpy_grad, rtol=1e-5, atol=1e-5)
                assert np.abs(train_grad).max() > 1e-3  # a gradient, not zeros
    finally:
        backend.close()


@pytest.mark.parametrize("name", ["futhark-c", MULTICORE_2_THREADS, MULTICORE_3_THREADS, GPU])
def test_training_with_parallel_parts_matches_numpy(name, corpus):
    """train() through every form of the backward products follows NumPy."""
    model, train = MODELS["wide"], TrainConfig(num_steps=20, learning_rate=0.002, init_std=INIT_STD["wide"])
    backend = open_backend("futhark-c" if name == GPU else name, model, train, corpus)
    reference = open_backend("numpy", model, train, corpus)
    try:
        if name == GPU:
            losses, params, _ = Oracle(backend).gpu_steps(backend.get_state(), 0, 12)
        else:
            losses, params = backend.train(12), backend.get_state().params
            assert backend.library_target() == ("c" if name == "futhark-c" else "multicore")
        np.testing.assert_allclose(losses, reference.train(12), rtol=0, atol=1e-4)
        # Adam divides by sqrt(v): where a gradient is near zero, float32 rounding
        # moves an update by up to a step; no parameter may be half a step off
        np.testing.assert_allclose(params, reference.get_state().params, rtol=0, atol=train.learning_rate / 2)
    finally:
        backend.close()


def test_multicores_train_computes_cs_steps(corpus):
    """futhark-multicore's `train` (kernels/multicore.fut: the update pass as two
    parallel maps, products in tasks) computes futhark-c's steps: the same
    losses, parameters and moments from the same state, up to the last bits two
    threads' sums may change."""
    model = MODELS["2layer-2head"]
    runs = []
    for name in ("futhark-c", MULTICORE_2_THREADS):
        with pytest.MonkeyPatch.context() as monkeypatch:
            if name == MULTICORE_2_THREADS:
                from engine import backends as registry

                monkeypatch.setenv(fbk.THREADS_ENV, "2")
                monkeypatch.setitem(registry._REGISTRY, name, registry._REGISTRY["futhark-multicore"])
            backend = open_backend(name, model, TrainConfig(num_steps=100), corpus)
            try:
                assert backend.library_target() == ("c" if name == "futhark-c" else "multicore")
                losses = backend.train(13)  # with Adam moments from the third
                state = backend.get_state()
                runs.append([losses, state.params, state.m, state.v])
            finally:
                backend.close()
    for got, expected in zip(*runs):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    assert np.abs(runs[1][1] - open_backend("numpy", model, TrainConfig(num_steps=100), corpus)
                  .get_state().params).max() > 1e-4  # the steps moved the parameters


def _trained(name, model, corpus, steps=60):
    backend = open_backend(name, model, TrainConfig(num_steps=100), corpus)
    backend.train(steps)
    return backend


@pytest.mark.parametrize("name", CPU_BACKENDS)
@pytest.mark.parametrize("model_name", ["tiny", "2layer-2head"])
@pytest.mark.parametrize("seed, temperature, prefix", [(0, 0.5, ""), (7, 1.0, ""), (3, 0.8, "ka"),
                                                       (11, 2.0, "m")])
def test_samples_equal_the_reference(name, model_name, seed, temperature, prefix, names_corpus):
    model = MODELS[model_name]
    backend = _trained(name, model, names_corpus)
    try:
        start = names_corpus.encode(prefix)
        got = backend._sample_ids(25, temperature, seed, start, None, max_length=model.block_size)
        expected = reference_samples(backend.get_state().params, backend.specs, model, names_corpus.bos,
                                     25, temperature, seed, start)
        assert got == expected
        assert any(len(sample) > 1 for sample in got) and len({tuple(s) for s in got}) > 1
    finally:
        backend.close()


def test_long_samples_grow_the_cache_and_match_the_reference(names_corpus):
    """Names past the cache's first 32 positions (an untrained model at a high
    temperature rarely draws bos), while others finish early."""
    model = ModelConfig(n_embd=16, n_layer=1, n_head=4, block_size=64)
    backend = open_backend("futhark-c", model, TrainConfig(num_steps=10), names_corpus)
    try:
        got = backend._sample_ids(30, 4.0, 5, [], None, max_length=model.block_size)
        lengths = [len(sample) for sample in got]
        assert max(lengths) > 40 and min(lengths) < 10
        assert got == reference_samples(backend.get_state().params, backend.specs, model,
                                        names_corpus.bos, 30, 4.0, 5)
    finally:
        backend.close()


@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_names_stop_at_max_length(name, names_corpus):
    """The kernel stops at max_length (prefix included): an untrained model's
    names at a high temperature reach it, and equal the reference's cut there."""
    model = ModelConfig(n_embd=16, n_layer=1, n_head=4, block_size=64)
    backend = open_backend(name, model, TrainConfig(num_steps=10), names_corpus)
    try:
        prefix = names_corpus.encode("ka")
        got = backend._sample_ids(30, 4.0, 5, prefix, None, max_length=9)
        assert max(map(len, got)) == 9 - 2
        assert got == reference_samples(backend.get_state().params, backend.specs, model,
                                        names_corpus.bos, 30, 4.0, 5, prefix, max_length=9)
        # by default: names.txt's longest name (15 characters) plus 5
        assert backend.default_max_length() == 20
        assert max(map(len, backend.sample(30, 4.0, 5))) == 20
    finally:
        backend.close()


@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_prefix_samples_start_with_the_prefix(name, names_corpus):
    model = MODELS["2layer-2head"]
    backend = _trained(name, model, names_corpus)
    try:
        for prefix in ("a", "ka", "mar", "abcdefg"):  # up to block_size - 1 characters
            names = backend.sample(20, temperature=1.0, seed=4, prefix=prefix)
            assert len(names) == 20 and all(n.startswith(prefix) for n in names)
            assert all(len(n) <= model.block_size for n in names)
            assert len(set(names)) > 1 or len(prefix) == model.block_size - 1
        # at block_size - 1 characters a name gets exactly one more token (or bos)
        assert all(len(n) <= model.block_size for n in backend.sample(10, 1.0, 0, prefix="abcdefg"))
    finally:
        backend.close()


def test_batches_give_the_same_names_as_one_call(names_corpus, monkeypatch):
    backend = _trained("futhark-c", MODELS["tiny"], names_corpus)
    try:
        whole = backend.sample(23, temperature=1.0, seed=9, prefix="e")
        monkeypatch.setattr(fbk, "MAX_SAMPLE_BATCH", 4)
        assert fbk.sample_batch(backend.model, 23) == 4
        assert backend.sample(23, temperature=1.0, seed=9, prefix="e") == whole
    finally:
        backend.close()


def test_cancel_is_polled_between_batches(names_corpus, monkeypatch):
    backend = _trained("futhark-c", MODELS["tiny"], names_corpus, steps=5)
    monkeypatch.setattr(fbk, "MAX_SAMPLE_BATCH", 5)
    polls = []

    def cancel_after_two_batches():
        polls.append(1)
        return len(polls) > 2

    try:
        with pytest.raises(Cancelled):
            backend.sample(50, cancel=cancel_after_two_batches)
        assert len(polls) == 3
        assert len(backend.sample(12, cancel=lambda: False)) == 12
    finally:
        backend.close()


def test_sample_batch_bounds_the_cache():
    small, big = ModelConfig(), ModelConfig(n_embd=768, n_layer=12, n_head=12, block_size=1024)
    assert fbk.sample_batch(small, 10) == 10 and fbk.sample_batch(small, 10_000) == fbk.MAX_SAMPLE_BATCH
    per_sample = 2 * 12 * fbk.CACHE_POSITIONS * 768 * 4
    assert fbk.sample_batch(big, 10_000) == fbk.SAMPLE_CACHE_BYTES // per_sample
    assert fbk.sample_batch(big, 10) == 10
