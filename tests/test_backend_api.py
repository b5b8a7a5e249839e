"""The Backend interface through the NumPy backend: the chunked step call,
sampling, parameters, divergence, and the registry."""
from __future__ import annotations

import math

import numpy as np
import pytest

from engine import (PRESETS, Corpus, ModelConfig, TrainConfig, TrainingDiverged, TrainState, list_backends,
                    open_backend)


def open_numpy(model, train, corpus):
    return open_backend("numpy", model, train, corpus)


# ---- registry -------------------------------------------------------------------

def test_numpy_is_listed_and_available():
    infos = {info.name: info for info in list_backends()}
    assert "numpy" in infos and infos["numpy"].available and infos["numpy"].reason


def test_unknown_backend_lists_the_choices(small_corpus, small_model, short_train):
    with pytest.raises(ValueError) as info:
        open_backend("fortran", small_model, short_train, small_corpus)
    assert "fortran" in str(info.value) and "numpy" in str(info.value)


# ---- train(k) -----------------------------------------------------------------------

def test_train_returns_k_losses_and_advances_the_step(small_corpus, small_model, short_train):
    b = open_numpy(small_model, short_train, small_corpus)
    assert b.step == 0 and len(b.loss_history) == 0
    losses = b.train(4)
    assert losses.shape == (4,) and losses.dtype == np.float32 and np.all(np.isfinite(losses))
    assert b.step == 4 and np.array_equal(b.loss_history, losses)


def test_chunked_calls_equal_one_call(small_corpus, small_model, short_train):
    one = open_numpy(small_model, short_train, small_corpus).train(10)
    chunked = open_numpy(small_model, short_train, small_corpus)
    parts = [chunked.train(3), chunked.train(7)]
    assert np.array_equal(np.concatenate(parts), one)
    singles = open_numpy(small_model, short_train, small_corpus)
    assert np.array_equal(np.concatenate([singles.train(1) for _ in range(10)]), one)
    assert np.array_equal(chunked.get_state().params, singles.get_state().params)


def test_same_seed_same_run_other_seed_other_run(small_corpus, small_model, short_train):
    from dataclasses import replace

    a = open_numpy(small_model, short_train, small_corpus).train(5)
    b = open_numpy(small_model, short_train, small_corpus).train(5)
    c = open_numpy(small_model, replace(short_train, seed=43), small_corpus).train(5)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_training_stops_at_num_steps(small_corpus, small_model):
    b = open_numpy(small_model, TrainConfig(num_steps=5), small_corpus)
    assert len(b.train(3)) == 3
    assert len(b.train(10)) == 2  # clamped
    assert b.step == 5 and b.finished
    assert len(b.train(4)) == 0 and b.step == 5
    assert len(b.loss_history) == 5


@pytest.mark.parametrize("warmup", [0, 4])
def test_each_step_moves_a_parameter_by_at_most_its_scheduled_rate(small_corpus, small_model, warmup):
    """Adam's first step moves every parameter by lr_t * g / (|g| + eps), just
    under lr_t wherever the gradient is not tiny: a warm-up of W steps makes
    it lr / W (why gpt2-small's first steps no longer overfit one name)."""
    train = TrainConfig(num_steps=20, learning_rate=0.01, warmup_steps=warmup)
    b = open_numpy(small_model, train, small_corpus)
    before = b.get_state().params
    b.train(1)
    moved = np.abs(b.get_state().params.astype(np.float64) - before)
    lr_0 = 0.01 / (warmup or 1)
    assert moved.max() <= lr_0 * (1 + 1e-5) and np.median(moved) > 0.9 * lr_0


@pytest.mark.parametrize("k", [0, -1, 2.0, True, "3", None])
def test_train_rejects_bad_step_counts(small_corpus, small_model, short_train, k):
    b = open_numpy(small_model, short_train, small_corpus)
    with pytest.raises(ValueError, match="positive integer"):
        b.train(k)
    assert b.step == 0


def test_loss_decreases_on_a_small_corpus(small_corpus, small_model):
    b = open_numpy(small_model, TrainConfig(num_steps=300, learning_rate=0.02), small_corpus)
    losses = b.train(300)
    assert losses[-30:].mean() < losses[:30].mean() - 0.5


def test_initial_loss_is_near_ln_vocab(names_corpus):
    preset = PRESETS["tiny"]
    b = open_numpy(preset.model, preset.train, names_corpus)
    losses = b.train(8)  # no learning to speak of in 8 steps at lr 0.01
    expected = math.log(names_corpus.vocab_size)
    assert expected == pytest.approx(3.2958, abs=1e-4)
    assert abs(losses.mean() - expected) < 0.15
    assert np.all(np.abs(losses - expected) < 0.5)


# ---- sample() ------------------------------------------------------------------------

@pytest.fixture
def trained(small_corpus, small_model):
    b = open_numpy(small_model, TrainConfig(num_steps=60, learning_rate=0.02), small_corpus)
    b.train(60)
    return b


def test_sample_count_alphabet_and_length(trained, small_corpus, small_model):
    names = trained.sample(num_samples=25, temperature=1.0, seed=1)
    assert len(names) == 25 and all(isinstance(n, str) for n in names)
    assert set("".join(names)) <= set(small_corpus.chars)
    assert all(len(n) <= small_model.block_size for n in names)
    assert len(trained.sample(1, 0.5, 0)) == 1


def test_sample_is_reproducible_per_seed(trained):
    a = trained.sample(20, 1.0, seed=11)
    assert trained.sample(20, 1.0, seed=11) == a
    assert trained.sample(20, 1.0, seed=12) != a


def test_sample_does_not_change_training(small_corpus, small_model, short_train):
    a = open_numpy(small_model, short_train, small_corpus)
    b = open_numpy(small_model, short_train, small_corpus)
    a.train(3)
    b.train(3)
    a.sample(5, 1.0, 0)
    assert np.array_equal(a.train(3), b.train(3))


@pytest.mark.parametrize("kwargs, word", [
    (dict(temperature=0.0), "temperature"), (dict(temperature=-1.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"), (dict(num_samples=0), "num_samples"),
    (dict(num_samples=-3), "num_samples"), (dict(num_samples=2.5), "num_samples"),
    (dict(seed=-1), "seed"),
])
def test_sample_rejects_bad_arguments(trained, kwargs, word):
    with pytest.raises(ValueError, match=word):
        trained.sample(**{"num_samples": 3, "temperature": 0.5, "seed": 0, **kwargs})


def test_prefix_samples_start_with_the_prefix_and_fit_block_size(trained, small_model):
    names = trained.sample(30, 1.0, seed=3, prefix="em")
    assert all(n.startswith("em") and len(n) <= small_model.block_size for n in names)
    # the prefix's positions are the model's input: its continuation differs from an empty prefix
    assert [n[2:] for n in names] != trained.sample(30, 1.0, seed=3)


@pytest.mark.parametrize("prefix, word", [("z!", "vocabulary"), ("a" * 8, "block_size"), (3, "prefix")])
def test_prefix_is_checked(trained, prefix, word):
    with pytest.raises(ValueError, match=word):
        trained.sample(3, 0.5, 0, prefix=prefix)


def test_sampling_honours_cancel(trained):
    from engine import Cancelled

    calls = []

    def cancel():
        calls.append(1)
        return len(calls) > 2

    with pytest.raises(Cancelled):
        trained.sample(5, 1.0, 0, cancel=cancel)
    assert len(calls) == 3


def test_sampling_stops_at_bos_or_block_size(small_corpus, small_model, short_train):
    b = open_numpy(small_model, short_train, small_corpus)
    bos, a = small_corpus.bos, small_corpus.encode("a")[0]

    def with_head(bos_row, a_row):
        # layers zeroed and wte rows all ones: the hidden state is ~ones at every
        # position, so each logit is the sum of its lm_head row
        params = {k: np.zeros_like(v) for k, v in b.get_params().items()}
        params["wte"][:] = 1.0
        params["lm_head"][bos] = bos_row
        params["lm_head"][a] = a_row
        b.set_params(params)

    with_head(bos_row=-10.0, a_row=4.0)  # bos never drawn: runs to block_size
    assert b.sample(6, 1.0, 0) == ["a" * small_model.block_size] * 6
    with_head(bos_row=1.0, a_row=0.0)  # bos always drawn first: empty names
    assert b.sample(6, 0.05, 0) == [""] * 6


def test_sampling_follows_the_models_distribution(small_corpus, small_model, short_train):
    """With all layers zeroed, the first character's distribution is
    softmax(lm_head @ rmsnorm(wte[bos] + wpe[0])): check empirical frequencies."""
    b = open_numpy(small_model, short_train, small_corpus)
    params = {k: (np.zeros_like(v) if k.startswith("layer") else v.copy())
              for k, v in b.get_params().items()}
    rng = np.random.default_rng(0)
    params["lm_head"] = rng.normal(0, 0.5, params["lm_head"].shape).astype(np.float32)
    b.set_params(params)
    bos = small_corpus.bos
    x = params["wte"][bos].astype(np.float64) + params["wpe"][0]
    x = x / np.sqrt(np.mean(x * x) + 1e-5)
    temperature = 0.7
    logits = params["lm_head"].astype(np.float64) @ x / temperature
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    n = 4000
    firsts = [name[:1] for name in b.sample(n, temperature, seed=5)]
    counts = np.array([sum(f == ch for f in firsts) for ch in small_corpus.chars] + [firsts.count("")])
    expected = probs * n
    # every class within 5 standard deviations of its binomial expectation
    assert np.all(np.abs(counts - expected) <= 5 * np.sqrt(expected * (1 - probs)) + 1)


# ---- parameters -----------------------------------------------------------------

def test_get_set_params_round_trip(small_corpus, small_model, short_train):
    a = open_numpy(small_model, short_train, small_corpus)
    a.train(5)
    params = a.get_params()
    assert list(params)[:3] == ["wte", "wpe", "lm_head"]
    b = open_numpy(small_model, short_train, small_corpus)
    b.set_params(params)
    for k, v in b.get_params().items():
        assert np.array_equal(v, params[k])
    # get_params is a copy: changing it does not touch the backend
    params["wte"][:] = 0
    assert not np.all(a.get_params()["wte"] == 0)


def test_set_params_rejects_wrong_names_and_shapes(small_corpus, small_model, short_train):
    b = open_numpy(small_model, short_train, small_corpus)
    params = b.get_params()
    before = b.get_state().params.copy()
    bad = dict(params)
    bad["layer0.attn_wx"] = bad.pop("layer0.attn_wq")
    with pytest.raises(ValueError, match="attn_wq"):
        b.set_params(bad)
    with pytest.raises(ValueError, match="lm_head"):
        b.set_params(dict(params, lm_head=params["lm_head"][:-1]))
    assert np.array_equal(b.get_state().params, before)


def test_open_backend_with_initial_params(small_corpus, small_model, short_train):
    b = open_numpy(small_model, short_train, small_corpus)
    flat = b.get_state().params * 0.5
    c = open_backend("numpy", small_model, short_train, small_corpus, params=flat)
    assert np.array_equal(c.get_state().params, flat)
    with pytest.raises(ValueError, match="parameters"):
        open_backend("numpy", small_model, short_train, small_corpus, params=flat[:-1])


# ---- divergence ---------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_divergence_names_the_step_and_keeps_the_previous_parameters():
    # documents in this order; only the last is long enough to reach position 5
    corpus = Corpus(["ab", "ba", "abc", "abcabcab"], shuffled=True)
    model = ModelConfig(n_embd=8, n_layer=1, n_head=2, block_size=16)
    train = TrainConfig(num_steps=50)

    def poisoned():
        b = open_numpy(model, train, corpus)
        params = b.get_params()
        params["wpe"][5] = np.inf  # harmless until a step uses position 5
        b.set_params(params)
        return b

    reference = poisoned()
    good = reference.train(3)
    assert np.all(np.isfinite(good))

    b = poisoned()
    with pytest.raises(TrainingDiverged) as info:
        b.train(10)
    err = info.value
    assert err.step == 3 and not math.isfinite(err.loss)
    assert f"step {err.step + 1}" in str(err) and "diverged" in str(err)
    assert b.step == 3  # the counter did not move past the bad step
    assert np.array_equal(b.loss_history, good)
    state, ref_state = b.get_state(), reference.get_state()
    for name in ("params", "m", "v"):  # bitwise the state before the bad step
        assert np.array_equal(getattr(state, name), getattr(ref_state, name)), name
    # and it fails again, at the same step, without side effects
    with pytest.raises(TrainingDiverged):
        b.train(1)
    assert b.step == 3 and np.array_equal(b.get_state().params, ref_state.params)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_divergence_on_the_first_step_of_a_chunk(small_corpus, small_model, short_train):
    b = open_numpy(small_model, short_train, small_corpus)
    b.train(2)
    params = b.get_params()
    params["layer1.mlp_fc1"][0, 0] = np.nan
    b.set_params(params)
    before = b.get_state()
    with pytest.raises(TrainingDiverged) as info:
        b.train(5)
    assert info.value.step == 2 and b.step == 2 and len(b.loss_history) == 2
    after = b.get_state()
    assert np.array_equal(after.params, before.params, equal_nan=True)
    assert np.array_equal(after.m, before.m) and np.array_equal(after.v, before.v)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nan_gradient_with_finite_loss_keeps_finite_parameters(small_corpus, small_model):
    """Weights of about 1e30 (what a learning rate of 1e30 made of them in one step,
    before engine.config limited the rate to 1): rmsnorm overflows, the logits are
    uniform and the loss finite while the backward pass overflows; training must
    stop before Adam writes NaN into the parameters."""
    b = open_numpy(small_model, TrainConfig(num_steps=50), small_corpus)
    b.train(3)
    state = b.get_state()
    huge = TrainState(state.params * np.float32(1e30), state.m, state.v, state.step)
    b.set_state(huge, losses=b.loss_history)
    # uniform logits: the loss of any document is ln(V), finite
    assert b.heldout_loss() == pytest.approx(math.log(small_corpus.vocab_size), rel=1e-4)
    with pytest.raises(TrainingDiverged) as info:
        b.train(50)
    kept = b.get_state()
    assert b.step == info.value.step == 3
    assert np.all(np.isfinite(kept.params)), "the parameters kept are usable"
    for name in ("params", "m", "v"):  # no update applied
        assert np.array_equal(getattr(kept, name), getattr(huge, name)), name
    assert np.all(np.isfinite(b.loss_history)) and len(b.loss_history) == b.step
