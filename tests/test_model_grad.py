"""engine.model.gpt.loss_and_grad against central finite differences, in float64."""
from __future__ import annotations

import numpy as np
import pytest

from engine import Corpus, ModelConfig, init_params, param_specs
from engine.data.split import DataSplit
from engine.model.gpt import Weights, loss_and_grad
from reference_model import plain_loss_sum

MODEL = ModelConfig(n_embd=8, n_layer=2, n_head=2, block_size=8)
H = 1e-5          # central-difference step (float64)
ENTRIES = 12      # random entries checked per parameter tensor
REL_TOL = 1e-6
ABS_TOL = 1e-9    # central differences' own error here is about 2e-10 (rounding + H^2 term)


@pytest.fixture(scope="module")
def corpus():
    # kept in this order: doc 0 is short (wpe tail unused), doc 1 is longer than block_size
    return Corpus(["abca", "cabbagecabbage"], shuffled=True)


def doc_tokens(corpus, doc):
    """Document doc's inputs and targets as training takes them (truncated to block_size)."""
    return DataSplit(corpus, 0, MODEL.block_size).step_tokens(doc)


def float64_setup(corpus, seed=5, std=0.3):
    specs = param_specs(MODEL, corpus.vocab_size)
    # a larger std than training uses, so no gradient is negligibly small
    flat = init_params(MODEL, corpus.vocab_size, seed, std).astype(np.float64)
    grad = np.full_like(flat, np.nan)  # loss_and_grad must overwrite every entry
    return specs, flat, grad


def loss_at(flat, specs, inputs, targets):
    scratch = np.empty_like(flat)
    return float(loss_and_grad(Weights(flat, specs, MODEL), Weights(scratch, specs, MODEL),
                               inputs, targets, MODEL, np))


def reference_loss(flat, specs, inputs, targets):
    """The same loss written plainly, position by position (no backward pass)."""
    return plain_loss_sum(flat, specs, MODEL, inputs, targets) / len(inputs)


@pytest.mark.parametrize("doc", [0, 1], ids=["short-doc", "truncated-doc"])
def test_loss_matches_a_plain_position_by_position_forward(corpus, doc):
    specs, flat, _ = float64_setup(corpus)
    inputs, targets = doc_tokens(corpus, doc)
    assert loss_at(flat, specs, inputs, targets) == pytest.approx(
        reference_loss(flat, specs, inputs, targets), rel=1e-12)


@pytest.mark.parametrize("doc", [0, 1], ids=["short-doc", "truncated-doc"])
def test_gradient_matches_finite_differences(corpus, doc):
    specs, flat, grad = float64_setup(corpus)
    inputs, targets = doc_tokens(corpus, doc)
    if doc == 1:
        assert len(inputs) == MODEL.block_size < len(corpus.docs[1]) + 1  # truncation path
    loss = loss_and_grad(Weights(flat, specs, MODEL), Weights(grad, specs, MODEL),
                         inputs, targets, MODEL, np)
    assert np.isfinite(loss) and np.all(np.isfinite(grad)), "every gradient entry written"
    assert loss == pytest.approx(loss_at(flat, specs, inputs, targets), rel=1e-14)

    rng = np.random.default_rng(doc)
    used = set(inputs.tolist())
    for s in specs:
        idx = rng.choice(s.size, size=min(ENTRIES, s.size), replace=False)
        if s.name == "wte":  # make sure rows of tokens that occur are among the checked ones
            rows = np.array(sorted(used))
            idx = np.concatenate([idx, rows * MODEL.n_embd + rng.integers(0, MODEL.n_embd, len(rows))])
        for j in idx:
            i = s.offset + int(j)
            saved = flat[i]
            flat[i] = saved + H
            up = loss_at(flat, specs, inputs, targets)
            flat[i] = saved - H
            down = loss_at(flat, specs, inputs, targets)
            flat[i] = saved
            fd = (up - down) / (2 * H)
            g = grad[i]
            assert abs(g - fd) <= REL_TOL * abs(fd) + ABS_TOL, \
                f"{s.name}[{j}]: analytic {g:.10g}, numeric {fd:.10g}"


def test_gradient_is_exactly_zero_where_the_loss_does_not_depend(corpus):
    specs, flat, grad = float64_setup(corpus)
    inputs, targets = doc_tokens(corpus, 0)  # "abca": 5 positions of 8
    t = len(inputs)
    assert t < MODEL.block_size
    loss_and_grad(Weights(flat, specs, MODEL), Weights(grad, specs, MODEL), inputs, targets, MODEL, np)
    g = Weights(grad, specs, MODEL)
    assert np.all(g.wpe[t:] == 0), "positions past the document get no gradient"
    assert np.all(np.abs(g.wpe[:t]).sum(axis=1) > 0)
    unused = sorted(set(range(corpus.vocab_size)) - set(inputs.tolist()))
    assert unused and np.all(g.wte[unused] == 0), "rows of tokens not in the input get none"
    # and finite differences agree that the loss does not move there
    i = specs[1].offset + t * MODEL.n_embd + 3
    base = loss_at(flat, specs, inputs, targets)
    flat[i] += 0.5
    assert loss_at(flat, specs, inputs, targets) == base


def test_gradient_overwrites_stale_values(corpus):
    specs, flat, grad = float64_setup(corpus)
    long_in, long_tg = doc_tokens(corpus, 1)
    short_in, short_tg = doc_tokens(corpus, 0)
    loss_and_grad(Weights(flat, specs, MODEL), Weights(grad, specs, MODEL), long_in, long_tg, MODEL, np)
    loss_and_grad(Weights(flat, specs, MODEL), Weights(grad, specs, MODEL), short_in, short_tg, MODEL, np)
    fresh = np.full_like(flat, 123.0)
    loss_and_grad(Weights(flat, specs, MODEL), Weights(fresh, specs, MODEL), short_in, short_tg, MODEL, np)
    assert np.array_equal(grad, fresh)
