"""The NumPy backend against an independent, straightforward implementation:
a scalar-autograd port of microgpt's Value class (pure Python, float64),
run position by position with per-layer key/value lists, exactly microgpt's
algorithm. Both start from engine.init_params and microgpt's document order.

For speed the port's nodes may have many children (a dot product or a sum is
one node, as microgpt's Value already allows with its children/local-grads
tuples), so the graph is smaller but the arithmetic is the same.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from engine import PRESETS, Corpus, TrainConfig, init_params, open_backend

STEPS = 50


# ---- the scalar autograd ----------------------------------------------------

class Value:
    __slots__ = ("data", "grad", "children", "local_grads")

    def __init__(self, data, children=(), local_grads=()):
        self.data = data
        self.grad = 0.0
        self.children = children
        self.local_grads = local_grads

    def __add__(self, other):
        other = other if isinstance(other, Value) else Value(other)
        return Value(self.data + other.data, (self, other), (1.0, 1.0))

    def __mul__(self, other):
        other = other if isinstance(other, Value) else Value(other)
        return Value(self.data * other.data, (self, other), (other.data, self.data))

    def __pow__(self, k):
        return Value(self.data ** k, (self,), (k * self.data ** (k - 1),))

    def exp(self):
        e = math.exp(self.data)
        return Value(e, (self,), (e,))

    def log(self):
        return Value(math.log(self.data), (self,), (1.0 / self.data,))

    def relu(self):
        return Value(max(0.0, self.data), (self,), (float(self.data > 0),))

    __radd__ = __add__
    __rmul__ = __mul__

    def __neg__(self):
        return self * -1.0

    def __sub__(self, other):
        return self + (-other)

    def __truediv__(self, other):
        return self * other ** -1

    def backward(self):
        topo, seen, stack = [], set(), [(self, False)]
        while stack:  # iterative post-order DFS: the graph is too deep for recursion
            node, expanded = stack.pop()
            if expanded:
                topo.append(node)
            elif id(node) not in seen:
                seen.add(id(node))
                stack.append((node, True))
                stack.extend((c, False) for c in node.children if id(c) not in seen)
        self.grad = 1.0
        for node in reversed(topo):
            g = node.grad
            for child, local in zip(node.children, node.local_grads):
                child.grad += local * g


def total(values):
    """sum(values) as one node."""
    return Value(sum(v.data for v in values), tuple(values), (1.0,) * len(values))


def dot(ws, xs):
    """sum(w * x) as one node."""
    return Value(sum(w.data * x.data for w, x in zip(ws, xs)), (*ws, *xs),
                 (*(x.data for x in xs), *(w.data for w in ws)))


# ---- microgpt -----------------------------------------------------------------

def linear(x, w):
    return [dot(row, x) for row in w]


def softmax(logits):
    top = max(v.data for v in logits)
    exps = [(v - top).exp() for v in logits]
    s = total(exps)
    return [e / s for e in exps]


def rmsnorm(x):
    scale = (total([xi * xi for xi in x]) / len(x) + 1e-5) ** -0.5
    return [xi * scale for xi in x]


def gpt(sd, token, pos, keys, values, n_layer, n_head):
    x = [t + p for t, p in zip(sd["wte"][token], sd["wpe"][pos])]
    x = rmsnorm(x)
    head_dim = len(x) // n_head
    for li in range(n_layer):
        residual = x
        x = rmsnorm(x)
        q = linear(x, sd[f"layer{li}.attn_wq"])
        keys[li].append(linear(x, sd[f"layer{li}.attn_wk"]))
        values[li].append(linear(x, sd[f"layer{li}.attn_wv"]))
        attn = []
        for h in range(n_head):
            hs = slice(h * head_dim, (h + 1) * head_dim)
            logits = [dot(q[hs], k[hs]) / head_dim ** 0.5 for k in keys[li]]
            weights = softmax(logits)
            vs = [v[hs] for v in values[li]]
            attn += [dot(weights, [v[j] for v in vs]) for j in range(head_dim)]
        x = [a + b for a, b in zip(linear(attn, sd[f"layer{li}.attn_wo"]), residual)]
        residual = x
        hidden = [h.relu() for h in linear(rmsnorm(x), sd[f"layer{li}.mlp_fc1"])]
        x = [a + b for a, b in zip(linear(hidden, sd[f"layer{li}.mlp_fc2"]), residual)]
    return linear(x, sd["lm_head"])


def microgpt_train(docs, flat_init, model, train, steps, batch_size=1, n_train=None):
    """microgpt's training loop from the given initial parameters.

    With batch_size B, step s trains on documents (s*B + b) % n_train (default:
    all of them), its loss the mean over all their positions (the engine's
    batches, written microgpt's way: no padding, one document at a time).
    Returns the per-step losses and the final parameters (float64, layout order).
    """
    n_train = len(docs) if n_train is None else n_train
    chars = sorted(set("".join(docs)))
    bos = len(chars)
    vocab = bos + 1
    c = model.n_embd
    shapes = [("wte", vocab, c), ("wpe", model.block_size, c), ("lm_head", vocab, c)]
    for i in range(model.n_layer):
        shapes += [(f"layer{i}.attn_w{x}", c, c) for x in "qkvo"]
        shapes += [(f"layer{i}.mlp_fc1", 4 * c, c), (f"layer{i}.mlp_fc2", c, 4 * c)]
    values = iter(float(x) for x in flat_init)  # microgpt's order: matrices, rows, entries
    sd = {name: [[Value(next(values)) for _ in range(cols)] for _ in range(rows)]
          for name, rows, cols in shapes}
    params = [p for mat in sd.values() for row in mat for p in row]
    assert len(params) == len(flat_init)
    m, v = [0.0] * len(params), [0.0] * len(params)
    b1, b2, eps = train.beta1, train.beta2, train.eps
    losses = []
    for step in range(steps):
        step_losses = []
        for b in range(batch_size):
            doc = docs[(step * batch_size + b) % n_train]
            tokens = [bos] + [chars.index(ch) for ch in doc] + [bos]
            n = min(model.block_size, len(tokens) - 1)
            keys, vals = [[] for _ in range(model.n_layer)], [[] for _ in range(model.n_layer)]
            for pos in range(n):
                logits = gpt(sd, tokens[pos], pos, keys, vals, model.n_layer, model.n_head)
                probs = softmax(logits)
                step_losses.append(-probs[tokens[pos + 1]].log())
        loss = total(step_losses) * (1.0 / len(step_losses))
        loss.backward()
        lr_t = train.learning_rate * (1 - step / train.num_steps)
        for i, p in enumerate(params):
            m[i] = b1 * m[i] + (1 - b1) * p.grad
            v[i] = b2 * v[i] + (1 - b2) * p.grad ** 2
            m_hat = m[i] / (1 - b1 ** (step + 1))
            v_hat = v[i] / (1 - b2 ** (step + 1))
            p.data -= lr_t * m_hat / (v_hat ** 0.5 + eps)
            p.grad = 0.0
        losses.append(loss.data)
    return np.array(losses), np.array([p.data for p in params])


# ---- the comparison -------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_runs(names_path, microgpt_docs):
    preset = PRESETS["tiny"]
    model, train = preset.model, preset.train
    docs = microgpt_docs(names_path)
    vocab = len(set("".join(docs))) + 1
    flat = init_params(model, vocab, train.seed, train.init_std)
    ref_losses, ref_params = microgpt_train(docs, flat, model, train, STEPS)
    backend = open_backend("numpy", model, train, Corpus.from_file(names_path))
    losses = backend.train(STEPS)
    return ref_losses, ref_params, losses, backend


def test_first_50_losses_equal_microgpts(tiny_runs):
    ref_losses, _, losses, _ = tiny_runs
    assert len(losses) == STEPS
    assert abs(ref_losses[0] - math.log(27)) < 0.3  # sanity: the reference starts near ln V
    np.testing.assert_allclose(losses, ref_losses, rtol=0, atol=1e-4)


def test_adam_parameters_after_50_steps_equal_microgpts(tiny_runs):
    _, ref_params, _, backend = tiny_runs
    flat = np.concatenate([a.reshape(-1) for a in backend.get_params().values()])
    start = init_params(PRESETS["tiny"].model, 27, PRESETS["tiny"].train.seed,
                        PRESETS["tiny"].train.init_std)
    # the updates are large compared with the tolerance: this is not comparing init to init
    assert np.abs(ref_params - start).max() > 0.1
    np.testing.assert_allclose(flat, ref_params, rtol=0, atol=2e-5)  # measured: ~1.2e-6


def test_multi_layer_multi_head_with_truncation(tmp_path, small_corpus, small_model, microgpt_docs):
    """Two layers, two heads, block 8 (names longer than 7 letters are cut): the
    layer loop, head split and truncation through the whole training loop."""
    path = tmp_path / "small.txt"
    path.write_text("\n".join(sorted(small_corpus.docs)) + "\n")
    model = small_model
    train = TrainConfig(num_steps=40, learning_rate=0.02, seed=3, holdout=0)  # microgpt holds out nothing
    docs = microgpt_docs(path)
    assert any(len(d) > model.block_size - 1 for d in docs[:20])
    vocab = len(set("".join(docs))) + 1
    flat = init_params(model, vocab, train.seed, train.init_std)
    ref_losses, ref_params = microgpt_train(docs, flat, model, train, 20)
    backend = open_backend("numpy", model, train, Corpus.from_file(path))
    losses = backend.train(20)
    np.testing.assert_allclose(losses, ref_losses, rtol=0, atol=1e-4)
    flat_after = np.concatenate([a.reshape(-1) for a in backend.get_params().values()])
    np.testing.assert_allclose(flat_after, ref_params, rtol=0, atol=2e-5)
