"""Same seed, same names on every backend: NumPy, futhark-c and futhark-multicore
(its one-thread and two-thread builds) follow engine/model/sampling.py's one definition
of the draw, so the same parameters, seed, temperature, prefix and max_length
give the same names.

The backends' float32 logits differ in their last bits (their sums run in
other orders), so a draw can differ where its uniform number lies within that
rounding of a CDF boundary. The tests allow exactly that: a name may differ
only if one of NumPy's draws for it had u within 1e-5 of a CDF entry (a
margin recomputed here from the names' tokens, in float64: 7 to 19 names in
6,000 have one), and they assert how few names differ. Measured on names.txt
with tiny after 500 steps, the first three CASES: 0 of 15,000 names differ
from the same parameters; trained apart on each backend (losses within
1e-6), 1 of 15,000 (one draw 3e-8 from a boundary).
"""
from __future__ import annotations

import numpy as np
import pytest

from engine import PRESETS, TrainConfig, open_backend
from futhark_support import CPU_BACKENDS
from sampling_support import assert_same_up_to_boundaries

pytestmark = [pytest.mark.futhark, pytest.mark.usefixtures("futhark_cpu_builds")]

STEPS = 500
# count, temperature, seed, prefix, max_length (a seed past 2**63: the kernel takes it as a u64)
CASES = [(6000, 0.5, 0, "", None), (6000, 1.0, 7, "", None), (3000, 1.5, 3, "ka", 9),
         (1000, 1.0, 2**64 - 1, "", None)]


def tiny_run(name: str, corpus):
    preset = PRESETS["tiny"]
    train = TrainConfig(num_steps=STEPS, learning_rate=preset.train.learning_rate,
                        init_std=preset.train.init_std, seed=preset.train.seed)
    return open_backend(name, preset.model, train, corpus)


@pytest.fixture(scope="module")
def numpy_run(names_corpus):
    backend = tiny_run("numpy", names_corpus)
    backend.train(STEPS)
    return backend


@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_the_same_parameters_give_the_same_names(name, numpy_run, names_corpus):
    backend = tiny_run(name, names_corpus)
    try:
        backend.set_state(numpy_run.get_state(), numpy_run.loss_history)
        for count, temperature, seed, prefix, max_length in CASES:
            want = numpy_run.sample(count, temperature, seed, prefix=prefix, max_length=max_length)
            got = backend.sample(count, temperature, seed, prefix=prefix, max_length=max_length)
            assert len(set(want)) > count // 10  # real draws: many different names
            assert_same_up_to_boundaries(numpy_run, want, got, temperature, seed, prefix, max_length, most=1)
    finally:
        backend.close()


@pytest.mark.parametrize("name", ["futhark-c", "futhark-multicore"])
def test_runs_trained_apart_give_the_same_names(name, numpy_run, names_corpus):
    """Each backend trains its own run from the same seed (the user's view): losses
    agree to float32 rounding, and so do the names, up to draws at a boundary."""
    backend = tiny_run(name, names_corpus)
    try:
        backend.train(STEPS)
        np.testing.assert_allclose(backend.loss_history, numpy_run.loss_history, rtol=0, atol=1e-5)
        for count, temperature, seed, prefix, max_length in CASES:
            want = numpy_run.sample(count, temperature, seed, prefix=prefix, max_length=max_length)
            got = backend.sample(count, temperature, seed, prefix=prefix, max_length=max_length)
            assert_same_up_to_boundaries(numpy_run, want, got, temperature, seed, prefix, max_length,
                                         most=count // 1000)
    finally:
        backend.close()
