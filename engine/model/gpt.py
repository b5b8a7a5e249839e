"""microgpt's model, loss, gradient and Adam, over an array module `xp`.

This is the reference math: the NumPy backend runs it with xp = numpy, the
CuPy backend with xp = cupy, and the Futhark kernel mirrors it (tests hold
them equal). One training step sees one document of T <= block_size tokens,
all positions at once, or B documents padded to the longest (B, T) with the
padding masked out of the loss:

    x = rmsnorm(wte[tok] + wpe[pos])
    per layer:  x += attn(rmsnorm(x)) @ wo.T          (causal, 1/sqrt(head_dim))
                x += relu(rmsnorm(x) @ fc1.T) @ fc2.T
    logits = x @ lm_head.T                             (no final norm)
    loss = mean cross-entropy over the T positions (over every real position
           of the B documents, for a batch)

rmsnorm(x) = x / sqrt(mean(x^2) + 1e-5), no weights; no biases anywhere.
Shapes are written (T, C) for one sequence; the forward pass also accepts a
leading batch axis (N, T, C) for sampling.
"""
from __future__ import annotations

import functools
import math
import operator
from typing import NamedTuple

from . import batch_ops
from .batch_ops import mean_last, reductions
from ..config import ModelConfig
from ..params import ParamSpec

RMS_EPS = 1e-5


class Weights:
    """Named views into a flat buffer; attn_wq|wk|wv viewed together as one (3C, C) qkv."""

    def __init__(self, flat, specs: list[ParamSpec], model: ModelConfig):
        by_name = {s.name: s for s in specs}
        view = lambda s: flat[s.offset : s.end].reshape(s.shape)  # noqa: E731
        c = model.n_embd
        self.wte, self.wpe, self.lm_head = (view(by_name[n]) for n in ("wte", "wpe", "lm_head"))
        self.layers = []
        for i in range(model.n_layer):
            q = by_name[f"layer{i}.attn_wq"]
            qkv = flat[q.offset : q.offset + 3 * c * c].reshape(3 * c, c)
            self.layers.append((qkv, *(view(by_name[f"layer{i}.{n}"]) for n in ("attn_wo", "mlp_fc1", "mlp_fc2"))))


def rmsnorm(x, xp, mean=mean_last):
    """(y, r) with y = x * r and r = 1/sqrt(mean(x^2) + eps), kept for the backward pass."""
    r = (mean(x * x, xp) + RMS_EPS) ** -0.5
    return x * r, r


def rmsnorm_backward(dy, y, r, xp, mean=mean_last):
    """r * (dy - y * mean(dy * y)), written over dy (a temporary at every call)."""
    dy -= y * mean(dy * y, xp)
    dy *= r
    return dy


def linear(x, w):
    """x @ w.T for a weight w of shape (out, in), computed as (w @ x^T)^T:
    with few rows in x, OpenBLAS streams w up to twice as fast this way.
    One position per sequence (sampling's (N, 1, in)) is one product over the
    N rows, so w is read once for all of them rather than once per row."""
    if x.ndim == 3 and x.shape[1] == 1:
        return linear(x[:, 0], w)[:, None]
    if x.ndim == 3:
        # a batch of documents: one product over all B x T rows, not B of them, and
        # plainly x @ w.T: its rows come out contiguous, which the element-wise
        # operations after it run faster on (learn, batch 32: 1.12 against 1.25 ms/step)
        return (rows2(x) @ w.T).reshape(*x.shape[:-1], w.shape[0])
    return (w @ x.swapaxes(-1, -2)).swapaxes(-1, -2)


def times(a, w):
    """a @ w for activations a (..., N) and a matrix w (N, M), as one product over
    every position of every document (NumPy runs a stacked product as one per
    document). For one document (T, N), exactly a @ w."""
    if a.ndim == 2:
        return a @ w
    return (rows2(a) @ w).reshape(*a.shape[:-1], w.shape[-1])


def same(z):
    return z


def rows2(z):
    """(..., N) -> (rows, N): every position of every document as one row (a
    view where z is contiguous; for one document, the same 2-D array)."""
    return z.reshape(-1, z.shape[-1])


def split_heads(z, n_head):
    """(..., T, C) -> (..., H, T, hd)."""
    *lead, t, c = z.shape
    return z.reshape(*lead, t, n_head, c // n_head).swapaxes(-2, -3)


def merge_heads(z):
    """(..., H, T, hd) -> (..., T, C)."""
    *lead, h, t, hd = z.shape
    return z.swapaxes(-2, -3).reshape(*lead, t, h * hd)


# Small constant arrays, cached per size: building them every step would cost
# a tenth of a tiny step.
@functools.lru_cache(maxsize=None)
def causal_mask(t: int, xp, dtype):
    """0 on and below the diagonal, -inf above: added to attention logits."""
    return xp.triu(xp.full((t, t), -xp.inf, dtype=dtype), 1)


@functools.lru_cache(maxsize=None)
def positions(t: int, xp):
    """0..t-1, for picking each position's target logit."""
    return xp.arange(t)


class LayerActs(NamedTuple):
    """What forward(keep=True) keeps of one layer for the backward pass (and
    attention maps: p), each (..., T, ·) or (..., H, T, ·) per head."""

    xn: object  # rmsnorm of the layer's input, and its scales r1
    r1: object
    q: object  # per head (..., H, T, hd)
    k: object
    v: object
    p: object  # attention probabilities (..., H, T, T)
    y: object  # attention output before wo (..., T, C)
    xn2: object  # rmsnorm before the MLP, and its scales r2
    r2: object
    hid: object  # fc1's output before relu, and after it
    act: object


class KVCache:
    """Every layer's keys and values for `rows` sequences, (rows, H, capacity, hd)
    each: what forward() needs to run one new position per row (sampling)."""

    def __init__(self, keys: list, values: list):
        self.keys, self.values = keys, values

    @classmethod
    def empty(cls, model: ModelConfig, rows: int, capacity: int, xp, dtype) -> "KVCache":
        shape = (rows, model.n_head, capacity, model.head_dim)
        return cls(*([xp.empty(shape, dtype=dtype) for _ in range(model.n_layer)] for _ in "kv"))

    @staticmethod
    def bytes_per_token(model: ModelConfig) -> int:
        """float32 bytes one row's keys and values take per position."""
        return 2 * model.n_layer * model.n_embd * 4

    @property
    def rows(self) -> int:
        return self.keys[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def store(self, layer: int, k, v, start: int):
        """Write positions start.. of layer's keys and values; return all of them up to there."""
        end = start + k.shape[-2]
        keys, values = self.keys[layer], self.values[layer]
        keys[..., start:end, :] = k
        values[..., start:end, :] = v
        return keys[..., :end, :], values[..., :end, :]

    def resized(self, rows, capacity: int, length: int, xp) -> "KVCache":
        """A new cache with room for `capacity` positions holding the first `length`
        of some rows: `rows` is an index array, or an int n for n copies of row 0."""
        copies = isinstance(rows, int)
        count = rows if copies else len(rows)

        def moved(old):
            new = xp.empty((count, old.shape[1], capacity, old.shape[3]), dtype=old.dtype)
            new[:, :, :length] = old[:1, :, :length] if copies else old[rows, :, :length]
            return new

        return KVCache([moved(k) for k in self.keys], [moved(v) for v in self.values])


def forward(w: Weights, tokens, model: ModelConfig, xp, keep=False, kv: KVCache | None = None,
            start: int = 0, batch: bool = False):
    """Final hidden states (..., T, C) of a token array (..., T), and the
    activations the backward pass needs when keep is True: [(x0, r0), then a
    LayerActs per layer] (its attention probabilities p are what an attention
    map shows).

    With a KVCache, the tokens are positions start..start+T-1 of sequences whose
    earlier keys and values the cache holds: their own are stored in it and they
    attend to all of them. Sampling runs one new position per row this way.
    batch: tokens (B, T) are a batch of documents, whose short attention rows
    engine.model.batch_ops reduces (its rounding differs from one document's).
    """
    t = tokens.shape[-1]
    h = model.n_head
    scale = 1.0 / math.sqrt(model.head_dim)
    end = start + t
    # one new position per row may attend to every cached one: no mask needed
    mask = causal_mask(end, xp, w.wte.dtype)[start:] if t > 1 else None
    row_max, row_sum, mean = reductions(batch)
    x, r0 = rmsnorm(w.wte[tokens] + w.wpe[start:end], xp, mean)
    cache = [(x, r0)]
    for layer, (qkv_w, wo, fc1, fc2) in enumerate(w.layers):
        xn, r1 = rmsnorm(x, xp, mean)
        heads = split_heads(linear(xn, qkv_w), 3 * h)  # (..., 3H, T, hd): H queries, H keys, H values
        q, k, v = heads[..., :h, :, :], heads[..., h : 2 * h, :, :], heads[..., 2 * h :, :, :]
        if kv is not None:
            k, v = kv.store(layer, k, v, start)
        att = q @ k.swapaxes(-1, -2)
        att *= scale
        if mask is not None:
            att += mask
        att -= row_max(att, xp)
        p = xp.exp(att)
        p /= row_sum(p, xp)
        y = merge_heads(p @ v)
        x = x + linear(y, wo)
        xn2, r2 = rmsnorm(x, xp, mean)
        hid = linear(xn2, fc1)
        act = xp.maximum(hid, 0)
        x = x + linear(act, fc2)
        if keep:
            cache.append(LayerActs(xn, r1, q, k, v, p, y, xn2, r2, hid, act))
    return x, cache


def target_index(targets, xp) -> tuple:
    """The index of each position's target logit in (..., T, V) logits."""
    if targets.ndim == 1:
        return positions(targets.shape[0], xp), targets
    b, t = targets.shape
    return xp.arange(b)[:, None], positions(t, xp)[None, :], targets


def batch_mask(lengths, t: int, xp, dtype):
    """(B, T): 1 at each document's first lengths[b] positions, 0 at padding."""
    return (positions(t, xp)[None, :] < xp.asarray(lengths)[:, None]).astype(dtype)


def loss_and_grad(w: Weights, g: Weights, inputs, targets, model: ModelConfig, xp, lengths=None):
    """Mean cross-entropy; writes every gradient into g (overwriting).

    inputs, targets: one document (T,), or B documents (B, T) padded to the
    longest, of which document b's first lengths[b] positions are real. The
    loss is the mean over real positions; padding gets no gradient (it comes
    after each document's real positions, which attend only to earlier ones).
    """
    t, h, batch = inputs.shape[-1], model.n_head, inputs.ndim > 1
    # one document's step, every microsecond of which counts at tiny (0.13 ms), skips the reshapes
    rows, mm = (rows2, times) if batch else (same, operator.matmul)
    row_max, row_sum, mean = reductions(batch)
    x, cache = forward(w, inputs, model, xp, keep=True, batch=batch)
    logits = mm(x, w.lm_head.T)
    logits -= row_max(logits, xp)
    probs = xp.exp(logits)
    total = row_sum(probs, xp)
    at_target = target_index(targets, xp)
    if lengths is None:  # one document: every position is real
        loss = (xp.log(total).sum() - logits[at_target].sum()) / t
        weight = 1.0 / t
    else:
        mask = batch_mask(lengths, t, xp, x.dtype)
        count = int(lengths.sum())
        loss = ((xp.log(total)[..., 0] - logits[at_target]) * mask).sum() / count
        weight = (mask / count)[..., None]

    dlogits = probs  # softmax minus one-hot, over T
    dlogits /= total
    dlogits[at_target] -= 1.0
    dlogits *= weight
    xp.matmul(rows(dlogits).T, rows(x), out=g.lm_head)
    dx = mm(dlogits, w.lm_head)
    scale = 1.0 / math.sqrt(model.head_dim)
    for (qkv_w, wo, fc1, fc2), (gqkv, gwo, gfc1, gfc2), (xn, r1, q, k, v, p, y, xn2, r2, hid, act) in zip(
        reversed(w.layers), reversed(g.layers), reversed(cache[1:])
    ):
        xp.matmul(rows(dx).T, rows(act), out=gfc2)
        dhid = mm(dx, fc2)
        dhid *= hid > 0
        xp.matmul(rows(dhid).T, rows(xn2), out=gfc1)
        dx += rmsnorm_backward(mm(dhid, fc1), xn2, r2, xp, mean)

        xp.matmul(rows(dx).T, rows(y), out=gwo)
        dy = split_heads(mm(dx, wo), h)
        datt = dy @ v.swapaxes(-1, -2)  # dp, then in place p * (dp - sum(dp * p))
        datt -= row_sum(datt * p, xp)
        datt *= p
        datt *= scale
        dqkv = qkv_grads(datt, p, q, k, dy, xp)
        xp.matmul(rows(dqkv).T, rows(xn), out=gqkv)
        dx += rmsnorm_backward(mm(dqkv, qkv_w), xn, r1, xp, mean)

    x0, r0 = cache[0]
    dx0 = rmsnorm_backward(dx, x0, r0, xp, mean)
    scatter_rows(g.wte, inputs.reshape(-1), rows(dx0), xp, by_sorting=batch)  # a token used twice: both rows
    g.wpe[:t] = dx0 if dx0.ndim == 2 else dx0.sum(axis=0)  # a position's gradient sums over documents
    g.wpe[t:] = 0
    return loss


def qkv_grads(datt, p, q, k, dy, xp):
    """dq, dk, dv per head, merged as forward's qkv product (..., T, 3C)."""
    if datt.ndim > 3:
        return batch_ops.qkv_grads_merged(datt, p, q, k, dy, xp)
    h = q.shape[0]  # one document: its heads stacked (3H, T, hd) in place, then merged
    dheads = xp.empty((3 * h, *q.shape[-2:]), dtype=q.dtype)
    xp.matmul(datt, k, out=dheads[:h])
    xp.matmul(datt.swapaxes(-1, -2), q, out=dheads[h : 2 * h])
    xp.matmul(p.swapaxes(-1, -2), dy, out=dheads[2 * h :])
    return merge_heads(dheads)


def doc_losses(w: Weights, inputs, targets, lengths, model: ModelConfig, xp):
    """Forward only: each document's summed cross-entropy over its first lengths[b]
    positions, (B,), for B documents padded to (B, T) (the held-out loss)."""
    x, _ = forward(w, inputs, model, xp, batch=True)
    logits = times(x, w.lm_head.T)
    logits -= batch_ops.row_max(logits, xp)
    nll = xp.log(batch_ops.row_sum(xp.exp(logits), xp)[..., 0]) - logits[target_index(targets, xp)]
    return (nll * batch_mask(lengths, inputs.shape[-1], xp, x.dtype)).sum(axis=-1)


def step_activation_bytes(model: ModelConfig, vocab_size: int, t: int, batch: int = 1) -> int:
    """About the most memory loss_and_grad holds for a step of `batch` t-token documents (float32):
    per layer what the backward pass keeps (normed inputs, q/k/v, attention
    probabilities, y, the MLP's 4C hidden and activation), then the logits and
    one layer's backward temporaries."""
    c, h = model.n_embd, model.n_head
    kept = model.n_layer * (t * 15 * c + h * t * t)
    temporaries = 3 * t * vocab_size + 2 * h * t * t + 16 * t * c
    return 4 * batch * (kept + temporaries)


ADAM_BLOCK = 1 << 18  # elements: five 1 MiB blocks per update stay in L2/L3 cache


def adam_scales(lr_t: float, b1: float, b2: float, eps: float, step: int) -> tuple[float, float]:
    """(v_scale, eps_scaled) of adam_update's p -= m / (sqrt(v) * v_scale + eps_scaled)."""
    step_size = lr_t / (1.0 - b1 ** (step + 1))
    return (1.0 / (1.0 - b2 ** (step + 1))) ** 0.5 / step_size, eps / step_size


def adam_update(p, g, m, v, scratch, lr_t: float, b1: float, b2: float, eps: float,
                step: int, xp, block: int = ADAM_BLOCK):
    """microgpt's Adam, in place over flat buffers, one cache-sized block at a time.

    m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
    p -= lr_t * (m / (1 - b1^(t+1))) / (sqrt(v / (1 - b2^(t+1))) + eps)
    computed as p -= m / d with d = (sqrt(v) sqrt(1/bc2) + eps) / step_size,
    step_size = lr_t / bc1: the same quantity in one pass fewer. The largest
    preset's update is bound by memory traffic, so blocking keeps the scratch
    in cache and each buffer is read and written once.
    """
    v_scale, eps_scaled = adam_scales(lr_t, b1, b2, eps, step)
    for lo in range(0, p.shape[0], block):
        hi = min(lo + block, p.shape[0])
        pb, gb, mb, vb, d = p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], scratch[: hi - lo]
        mb *= b1
        xp.multiply(gb, 1.0 - b1, out=d)
        mb += d
        vb *= b2
        xp.multiply(gb, gb, out=d)
        d *= 1.0 - b2
        vb += d
        xp.sqrt(vb, out=d)
        d *= v_scale
        d += eps_scaled
        xp.divide(mb, d, out=d)
        pb -= d


def scatter_rows(out, rows, values, xp, by_sorting: bool = False) -> None:
    """out = 0, then out[rows[i]] += values[i] for each i (repeated rows add up).
    by_sorting: NumPy adds each run of equal rows at once (a batch's many rows)."""
    out[...] = 0
    if xp.__name__ == "cupy":  # CuPy's add.at is recent; scatter_add is its equivalent in every version
        import cupyx

        cupyx.scatter_add(out, rows, values)
    elif by_sorting:
        batch_ops.add_rows_sorted(out, rows, values, xp)
    else:
        xp.add.at(out, rows, values)


def next_token_logits(w: Weights, tokens, model: ModelConfig, xp):
    """Logits (N, V) for the token after each row of tokens (N, T), recomputing
    the whole prefix (engine.model.sampling runs one position at a time instead)."""
    x, _ = forward(w, tokens, model, xp)
    return x[:, -1, :] @ w.lm_head.T
