"""The cupy backend on a real GPU: parity with the NumPy backend, the compiled
kernel against its NumPy reference, samples, divergence, checkpoints and GPU
out-of-memory. Each test skips with the reason where CuPy or a CUDA device is
absent (scripts/gpu_check.sh runs them on a GPU machine).
"""
from __future__ import annotations

import numpy as np
import pytest

import engine.backends.cupy_backend as cb
from engine import (PRESETS, BackendError, Corpus, ModelConfig, TrainConfig, TrainingDiverged,
                    load_checkpoint, open_backend)
from engine.backends.numpy_backend import NumpyBackend

from cupy_support import assert_same_state, poisoned_params
from sampling_support import assert_same_up_to_boundaries


def _gpu_reason():
    available, reason = cb.probe()
    return None if available else reason


gpu = pytest.mark.gpu


@pytest.fixture(scope="module")
def cupy():
    reason = _gpu_reason()
    if reason:
        pytest.skip(f"needs CuPy and a CUDA device: {reason}")
    import cupy

    return cupy


@gpu
def test_gpu_kernel_equals_its_numpy_reference(cupy):
    rng = np.random.default_rng(1)
    n = 300_001  # not a multiple of the block, and more than one grid-stride pass
    p, m, g = rng.normal(size=(3, n)).astype(np.float32)
    v = rng.random(n).astype(np.float32)
    tc = TrainConfig(num_steps=100)
    host = [a.copy() for a in (p, m, v)]
    h_losses, h_ok = np.zeros(3, np.float32), np.ones(4, np.int32)
    d = [cupy.asarray(a) for a in (p, m, v)]
    d_g, d_losses, d_ok = cupy.asarray(g), cupy.zeros(3, cupy.float32), cupy.ones(4, cupy.int32)
    kernel = cb._compiled_kernel(cupy)
    grid = min((n + cb.BLOCK - 1) // cb.BLOCK, 64)
    for i, loss in enumerate((2.0, np.nan, 1.5)):
        scalars = cb.adam_scalars(tc, i + 3)
        cb.fused_step_host(*host, g, np.float32(loss), h_losses, h_ok, i, scalars)
        kernel((grid,), (cb.BLOCK,), (*d, d_g, cupy.asarray(np.float32(loss)), d_losses, d_ok,
                                      np.int32(i), *scalars, np.int64(n)))
    for dev, ref in zip(d, host):
        np.testing.assert_array_equal(cupy.asnumpy(dev), ref)
    np.testing.assert_array_equal(cupy.asnumpy(d_losses), h_losses)
    np.testing.assert_array_equal(cupy.asnumpy(d_ok), h_ok)
    assert not np.array_equal(host[0], p)


@gpu
@pytest.mark.parametrize("preset_name", ["tiny", "s64"])
def test_gpu_parity_with_numpy_over_50_steps(cupy, names_corpus, preset_name):
    preset = PRESETS[preset_name].with_steps(100)
    ref = open_backend("numpy", preset.model, preset.train, names_corpus)
    dev = open_backend("cupy", preset.model, preset.train, names_corpus)
    try:
        np.testing.assert_array_equal(dev.get_state().params, ref.get_state().params)
        want = np.concatenate([ref.train(10) for _ in range(5)])
        got = np.concatenate([dev.train(k) for k in (1, 9, 20, 20)])
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
        # Adam divides by sqrt(v): a gradient near zero amplifies float32 rounding, hence 1e-3 here
        np.testing.assert_allclose(dev.get_state().params, ref.get_state().params, rtol=0, atol=1e-3)
        assert dev.step == ref.step == 50
    finally:
        dev.close()


@gpu
def test_gpu_samples_equal_numpys_for_the_same_seed(cupy, names_corpus):
    """engine.model.sampling's draw on the GPU backend: NumPy's names from the same
    parameters, up to draws within rounding of a CDF boundary."""
    preset = PRESETS["tiny"].with_steps(300)
    ref = NumpyBackend(preset.model, preset.train, names_corpus)
    ref.train(300)
    dev = open_backend("cupy", preset.model, preset.train, names_corpus)
    try:
        dev.set_state(ref.get_state(), ref.loss_history)
        for count, temperature, seed, prefix, max_length in [(6000, 0.5, 0, "", None), (2000, 1.5, 3, "ka", 9)]:
            want = ref.sample(count, temperature, seed, prefix=prefix, max_length=max_length)
            got = dev.sample(count, temperature, seed, prefix=prefix, max_length=max_length)
            assert_same_up_to_boundaries(ref, want, got, temperature, seed, prefix, max_length, most=1)
    finally:
        dev.close()


@gpu
def test_gpu_samples_are_valid_names(cupy, names_corpus):
    preset = PRESETS["tiny"].with_steps(100)
    dev = open_backend("cupy", preset.model, preset.train, names_corpus)
    try:
        dev.train(100)
        samples = dev.sample(20, temperature=0.5, seed=7)
        assert len(samples) == 20 and samples == dev.sample(20, temperature=0.5, seed=7)
        alphabet = set(names_corpus.chars)
        assert all(set(s) <= alphabet and len(s) <= preset.model.block_size for s in samples)
        assert sum(len(s) > 0 for s in samples) >= 15
    finally:
        dev.close()


@gpu
def test_gpu_divergence_matches_numpy(cupy):
    corpus = Corpus(["ab", "abc", "abcdefgh", "a", "b"], shuffled=True)
    model, train = ModelConfig(8, 1, 2, 16), TrainConfig(num_steps=20)
    params = poisoned_params(model, corpus, train, position=6)
    ref = NumpyBackend(model, train, corpus, params.copy())
    dev = open_backend("cupy", model, train, corpus, params.copy())
    try:
        for backend in (ref, dev):
            with pytest.raises(TrainingDiverged) as info:
                backend.train(5)
            assert info.value.step == 2
        assert_same_state(dev, ref, rtol=1e-5, atol=1e-6)
    finally:
        dev.close()


@gpu
def test_gpu_checkpoint_resumes_on_numpy(cupy, names_corpus, tmp_path):
    preset = PRESETS["tiny"].with_steps(40)
    dev = open_backend("cupy", preset.model, preset.train, names_corpus)
    try:
        dev.train(20)
        dev.save(tmp_path / "run.npz")
        on_numpy = load_checkpoint(tmp_path / "run.npz", backend="numpy")
        back = load_checkpoint(tmp_path / "run.npz", backend="cupy")
        assert on_numpy.step == back.step == 20
        np.testing.assert_array_equal(on_numpy.loss_history, dev.loss_history)
        np.testing.assert_array_equal(on_numpy.get_state().params, dev.get_state().params)
        np.testing.assert_array_equal(back.get_state().v, dev.get_state().v)
        going_on = dev.train(5)
        np.testing.assert_allclose(on_numpy.train(5), going_on, rtol=0, atol=1e-4)
        np.testing.assert_allclose(back.train(5), going_on, rtol=0, atol=1e-6)
        back.close()
    finally:
        dev.close()


@gpu
def test_gpu_out_of_memory_becomes_backend_error_and_recovers(cupy, names_corpus):
    pool = cupy.get_default_memory_pool()
    preset = PRESETS["s128"].with_steps(10)
    warm = open_backend("cupy", preset.model, preset.train, names_corpus)
    warm.train(3)  # cuBLAS handle and this step's kernels loaded before memory runs out
    warm.close()
    dev = open_backend("cupy", preset.model, preset.train, names_corpus)
    before = dev.get_state()
    pool.free_all_blocks()
    hog = []
    try:
        size = cupy.cuda.runtime.memGetInfo()[0]
        while size >= 512:  # take all but a few hundred bytes of the GPU's memory
            try:
                hog.append(cupy.empty(size, dtype=cupy.uint8))
            except cupy.cuda.memory.OutOfMemoryError:
                size //= 2
        with pytest.raises(BackendError, match="ran out of memory"):
            dev.train(2)
        with pytest.raises(BackendError, match="ran out of memory while opening"):
            open_backend("cupy", PRESETS["s256"].model, preset.train, names_corpus)
    finally:
        hog.clear()
        pool.free_all_blocks()
    assert dev.step == 0
    after = dev.get_state()
    np.testing.assert_array_equal(after.params, before.params)
    np.testing.assert_array_equal(after.m, before.m)
    ref = NumpyBackend(preset.model, preset.train, names_corpus)
    np.testing.assert_allclose(dev.train(2), ref.train(2), rtol=0, atol=1e-4)
    dev.close()


@gpu
def test_gpu_batched_steps_and_heldout_loss_match_numpy(cupy, names_corpus):
    """B = 8 documents per step, padded and gathered on the device, and the
    held-out loss: the NumPy backend's, to float32 rounding."""
    model = ModelConfig(32, 2, 4, 16)
    train = TrainConfig(num_steps=100, batch_size=8, learning_rate=0.005, init_std=0.05)
    ref, dev = NumpyBackend(model, train, names_corpus), open_backend("cupy", model, train, names_corpus)
    try:
        np.testing.assert_allclose(dev.train(30), ref.train(30), rtol=0, atol=1e-4)
        assert dev.heldout_loss() == pytest.approx(ref.heldout_loss(), abs=1e-4)
        assert dev.epochs == ref.epochs and dev.names_seen == 240
    finally:
        dev.close()
