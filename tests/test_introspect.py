"""engine.model.introspect against independent computations: a float64 forward pass
written position by position (microgpt's own formulation, with a growing list
of keys and values), brute-force enumeration of completions, and PCA by
numpy.linalg.svd."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import engine
from engine.model import introspect as ins


# an independent reference: microgpt's per-position forward in float64 ------------

def rmsnorm(x):
    return x / math.sqrt(float(np.mean(x * x)) + 1e-5)


def reference_forward(params: dict, model: engine.ModelConfig, tokens):
    """Logits (T, V) at every position and attention weights [layer][head] as (T, T)
    arrays, one position at a time with a KV list, as microgpt computes them."""
    p = {name: np.asarray(value, dtype=np.float64) for name, value in params.items()}
    hd = model.n_embd // model.n_head
    t_len = len(tokens)
    keys = [[] for _ in range(model.n_layer)]
    values = [[] for _ in range(model.n_layer)]
    attn = np.zeros((model.n_layer, model.n_head, t_len, t_len))
    logits = []
    for pos, token in enumerate(tokens):
        x = rmsnorm(p["wte"][token] + p["wpe"][pos])
        for li in range(model.n_layer):
            layer = lambda name: p[f"layer{li}.{name}"]  # noqa: E731
            residual = x
            x = rmsnorm(x)
            q, k, v = layer("attn_wq") @ x, layer("attn_wk") @ x, layer("attn_wv") @ x
            keys[li].append(k)
            values[li].append(v)
            heads = []
            for h in range(model.n_head):
                hs = slice(h * hd, (h + 1) * hd)
                scores = np.array([q[hs] @ key[hs] / math.sqrt(hd) for key in keys[li]])
                weights = np.exp(scores - scores.max())
                weights /= weights.sum()
                attn[li, h, pos, : pos + 1] = weights
                heads.append(sum(w * val[hs] for w, val in zip(weights, values[li])))
            x = layer("attn_wo") @ np.concatenate(heads) + residual
            residual = x
            x = layer("mlp_fc2") @ np.maximum(layer("mlp_fc1") @ rmsnorm(x), 0) + residual
        logits.append(p["lm_head"] @ x)
    return np.array(logits), attn


def reference_probs(params, model, tokens, temperature=1.0):
    z = reference_forward(params, model, tokens)[0][-1] / temperature
    z = np.exp(z - z.max())
    return z / z.sum()


# a model with something learned ---------------------------------------------------

@pytest.fixture(scope="module")
def trained(small_corpus):
    model = engine.ModelConfig(n_embd=8, n_layer=2, n_head=2, block_size=8)
    train = engine.TrainConfig(num_steps=60, learning_rate=0.02, init_std=0.3, seed=3)
    backend = engine.open_backend("numpy", model, train, small_corpus)
    backend.train(60)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def snap(trained):
    return ins.Snapshot.from_backend(trained)


# snapshot ---------------------------------------------------------------------------

def test_snapshot_is_a_detached_copy(trained):
    snap = ins.Snapshot.from_backend(trained)
    params = trained.get_params()
    same = ins.Snapshot.from_params(params, trained.model, trained.corpus.chars, trained.step)
    np.testing.assert_array_equal(snap.flat, same.flat)
    assert (snap.step, snap.bos, snap.vocab_size) == (60, trained.corpus.bos, trained.corpus.vocab_size)
    params["wte"][:] = 0  # changing the caller's arrays changes nothing here
    assert np.abs(same.weights.wte).sum() > 0
    with pytest.raises(ValueError):
        snap.flat[0] = 1.0
    with pytest.raises(ValueError, match="expected"):
        ins.Snapshot(snap.flat[:-1], trained.model, trained.corpus.chars)


# next character ---------------------------------------------------------------------

@pytest.mark.parametrize("prefix", ["", "e", "is", "abigai"])
@pytest.mark.parametrize("temperature", [1.0, 0.5, 1.7])
def test_next_char_is_the_softmax_of_an_independent_forward(trained, snap, prefix, temperature):
    got = ins.next_char(snap, prefix, temperature)
    tokens = [trained.corpus.bos, *trained.corpus.encode(prefix)]
    want = reference_probs(trained.get_params(), trained.model, tokens, temperature)
    np.testing.assert_allclose(got.probs, want, atol=2e-6, rtol=1e-4)
    assert got.probs.sum() == pytest.approx(1.0)
    assert got.labels == (*trained.corpus.chars, "end")
    assert (got.prefix, got.temperature, got.step) == (prefix, temperature, 60)
    order = got.ranked()
    assert sorted(order) == list(range(trained.corpus.vocab_size))
    assert all(got.probs[a] >= got.probs[b] for a, b in zip(order, order[1:]))


def test_next_char_refuses_bad_input(snap):
    with pytest.raises(ValueError, match="shorter than block_size"):
        ins.next_char(snap, "abcdefgh")
    with pytest.raises(ValueError, match="'Z' is not in the vocabulary"):
        ins.next_char(snap, "aZ")
    for temperature in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            ins.next_char(snap, "a", temperature)


# completions --------------------------------------------------------------------------

def completion_prob(trained, prefix, completion, temperature=1.0):
    """Product of the reference conditionals of each generated character (and the end)."""
    corpus, params = trained.corpus, trained.get_params()
    tokens = [corpus.bos, *corpus.encode(prefix)]
    prob = 1.0
    for token in [*corpus.encode(completion.text[len(prefix):]), *([corpus.bos] if completion.ended else [])]:
        prob *= reference_probs(params, trained.model, tokens, temperature)[token]
        tokens.append(token)
    return prob


@pytest.mark.parametrize("prefix,width,temperature", [("", 5, 1.0), ("em", 3, 1.0), ("a", 8, 0.6), ("sophi", 4, 1.3)])
def test_completions_are_sorted_and_each_is_the_product_of_its_conditionals(trained, snap, prefix, width, temperature):
    completions = ins.complete(snap, prefix, width, temperature)
    assert len(completions) == width
    assert len({c.text for c in completions}) == width
    assert all(c.text.startswith(prefix) for c in completions)
    probs = [c.prob for c in completions]
    assert probs == sorted(probs, reverse=True)
    for c in completions:
        assert len(c.text) <= trained.model.block_size
        assert c.ended or len(c.text) == trained.model.block_size
        assert c.prob == pytest.approx(completion_prob(trained, prefix, c, temperature), rel=1e-4)


def test_a_wide_beam_finds_the_most_likely_names_by_enumeration(small_corpus):
    """block_size 3: every name is at most 3 characters, so all of them can be
    listed; a beam as wide as every two-character prefix is exhaustive."""
    corpus = small_corpus
    model = engine.ModelConfig(n_embd=8, n_layer=1, n_head=2, block_size=3)
    backend = engine.open_backend("numpy", model, engine.TrainConfig(num_steps=40, init_std=0.5, seed=1), corpus)
    backend.train(40)
    params, v, bos = backend.get_params(), len(corpus.chars), corpus.bos
    conditionals = {}
    for length in range(3):
        for ids in itertools.product(range(v), repeat=length):
            conditionals[ids] = reference_probs(params, model, [bos, *ids])
    every = {}
    for length in range(4):
        for ids in itertools.product(range(v), repeat=length):
            prob = np.prod([conditionals[ids[:i]][ids[i]] for i in range(length)])
            if length < 3:
                every[(ids, True)] = prob * conditionals[ids][bos]
            else:
                every[(ids, False)] = prob
    best = sorted(every.items(), key=lambda item: -item[1])[:12]
    got = ins.complete(ins.Snapshot.from_backend(backend), "", width=v * v)[:12]
    assert [(c.text, c.ended) for c in got] == [(corpus.decode(ids), ended) for (ids, ended), _ in best]
    np.testing.assert_allclose([c.prob for c in got], [p for _, p in best], rtol=1e-4)
    backend.close()


def test_completions_refuse_a_bad_width_and_can_be_cancelled(snap):
    for width in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="beam width"):
            ins.complete(snap, "a", width)
    with pytest.raises(engine.Cancelled):
        ins.complete(snap, "a", 3, cancel=lambda: True)


# attention ----------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["emma", "", "isabel"])
def test_attention_rows_sum_to_one_are_causal_and_match_the_reference(trained, snap, text):
    got = ins.attention(snap, text)
    t = len(text) + 1
    assert got.maps.shape == (2, 2, t, t)
    assert got.labels == ("start", *text) and not got.truncated
    np.testing.assert_allclose(got.maps.sum(axis=-1), 1.0, atol=1e-6)
    assert np.all(np.triu(got.maps, 1) == 0)
    _, want = reference_forward(trained.get_params(), trained.model, [trained.corpus.bos, *trained.corpus.encode(text)])
    np.testing.assert_allclose(got.maps, want, atol=1e-5)


def test_attention_of_a_long_name_covers_the_context_only(snap):
    got = ins.attention(snap, "elizabeth")  # 9 characters, block_size 8
    assert got.truncated and got.text == "elizabe" and got.maps.shape[-1] == 8


# character map --------------------------------------------------------------------------

def test_char_map_equals_pca_by_svd_up_to_sign(trained, snap):
    wte = trained.get_params()["wte"].astype(np.float64)[: trained.corpus.bos]  # characters only
    centred = wte - wte.mean(axis=0)
    _, s, vt = np.linalg.svd(centred)
    want = centred @ vt[:2].T
    got = ins.char_map(snap)
    assert got.labels == tuple(trained.corpus.chars)
    for axis in range(2):
        sign = np.sign(got.points[:, axis] @ want[:, axis])
        np.testing.assert_allclose(got.points[:, axis], sign * want[:, axis], atol=1e-6)
    np.testing.assert_allclose(got.explained, s[:2] ** 2 / (s**2).sum(), rtol=1e-9)
    for axis in range(2):  # without a previous map: the largest coordinate is positive
        assert got.points[np.argmax(np.abs(got.points[:, axis])), axis] > 0


def test_char_map_keeps_the_previous_orientation(snap):
    first = ins.char_map(snap)
    flipped = ins.CharMap(first.labels, first.points * np.array([-1.0, 1.0]), first.explained, first.step)
    again = ins.char_map(snap, previous=flipped)
    np.testing.assert_allclose(again.points, flipped.points, atol=1e-9)


def test_trails_project_earlier_embeddings_on_todays_axes(trained, snap):
    earlier = engine.open_backend("numpy", trained.model, trained.train_config, trained.corpus)  # step 0
    before = ins.char_map(ins.Snapshot.from_backend(earlier))
    old = earlier.get_params()["wte"].astype(np.float64)[: trained.corpus.bos]
    earlier.close()
    got = ins.char_map(snap, history=[before.embeddings, np.zeros((3, 8))])  # a mismatch is left out
    now = trained.get_params()["wte"].astype(np.float64)[: trained.corpus.bos]
    _, _, vt = np.linalg.svd(now - now.mean(axis=0))
    signs = np.sign(np.sum(got.points * ((now - now.mean(axis=0)) @ vt[:2].T), axis=0))
    axes = vt[:2] * signs[:, None]  # today's axes, oriented as the map shows them
    assert got.trails.shape == (1, len(now), 2)
    np.testing.assert_allclose(got.trails[0], (old - old.mean(axis=0)) @ axes.T, atol=1e-6)


def test_group_spread_is_mean_distance_within_over_mean_distance_overall():
    points = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 3.0], [4.0, 4.0]])
    cmap = ins.CharMap(("a", "b", "e", "z"), points, np.zeros(2), 0)
    pairs = lambda idx: [np.linalg.norm(points[i] - points[j]) for i, j in itertools.combinations(idx, 2)]  # noqa: E731
    want = np.mean(pairs([0, 2])) / np.mean(pairs(range(4)))
    assert ins.group_spread(cmap, ins.VOWELS) == pytest.approx(want)
    assert math.isnan(ins.group_spread(cmap, {"a"}))
