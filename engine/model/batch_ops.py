"""engine.model.gpt's reductions over the last axis in two forms, and faster forms
of two more of its operations, for a training batch.

A batch is B documents of a few tokens each, so its attention rows (T keys)
and logit rows (V characters) are short, and NumPy reduces short last axes
slowly: on `learn` at batch 32 ((32, 4, 11, 11) attention), att.max(axis=-1)
takes 58 us, its sum 20 us and np.add.at over 352 rows 76 us; the batch forms
below take 8, 3 and 19 us. One document's step (B = 1, microgpt's) keeps
NumPy's own forms (max_last, sum_last, mean_last), bit for bit.
"""
from __future__ import annotations

import functools


def max_last(z, xp):
    return z.max(axis=-1, keepdims=True)


def sum_last(z, xp):
    return z.sum(axis=-1, keepdims=True)


def mean_last(z, xp=None):
    """Mean over the last axis, kept; sum / n is the same arithmetic as xp.mean
    without its Python-level overhead (it runs ~10 times per step)."""
    return z.sum(axis=-1, keepdims=True) / z.shape[-1]


def reductions(batch: bool) -> tuple:
    """(max, sum, mean) over the last axis, kept: this module's row_max, row_sum and
    row_mean for a batch of documents (short rows), else NumPy's own (one document)."""
    if batch:
        return row_max, row_sum, row_mean
    return max_last, sum_last, mean_last


# Above this many elements per row NumPy's own max along the last axis is the
# faster (measured: 16 against 100 us at 16 keys, 79 against 215 at 32, 1,203
# against 576 at 128).
SHORT_ROW = 32


def row_max(z, xp):
    """z.max(axis=-1, keepdims=True), the same values: a short last axis is
    moved first and reduced there, one element-wise maximum over whole rows."""
    if z.shape[-1] > SHORT_ROW:
        return z.max(axis=-1, keepdims=True)
    return xp.ascontiguousarray(xp.moveaxis(z, -1, 0)).max(axis=0)[..., None]


@functools.lru_cache(maxsize=None)
def _ones(n: int, xp, dtype):
    return xp.ones(n, dtype=dtype)


def row_sum(z, xp):
    """z.sum(axis=-1, keepdims=True) as one matrix-vector product over every row
    (the same sums, rounded in another order)."""
    n = z.shape[-1]
    return (z.reshape(-1, n) @ _ones(n, xp, z.dtype)).reshape(*z.shape[:-1], 1)


def row_mean(z, xp):
    """z.mean(axis=-1, keepdims=True) the same way (rmsnorm's)."""
    return row_sum(z, xp) / z.shape[-1]


def add_rows_sorted(out, rows, values, xp) -> None:
    """out[rows[i]] += values[i] for each i (repeated rows add up), for NumPy: the
    rows sorted, then each run of equal rows summed by one add.reduceat."""
    order = xp.argsort(rows, kind="stable")
    ordered = rows[order]
    starts = xp.flatnonzero(xp.concatenate([xp.ones(1, dtype=bool), ordered[1:] != ordered[:-1]]))
    out[ordered[starts]] += xp.add.reduceat(values[order], starts, axis=0)


def qkv_grads_merged(datt, p, q, k, dy, xp):
    """dq, dk, dv of B documents' heads (B, H, T, hd) each, merged as forward's
    qkv product (B, T, 3C): written in place, with no concatenation or copy."""
    b, h, t, hd = q.shape
    merged = xp.empty((b, t, 3 * h, hd), dtype=q.dtype)
    heads = merged.swapaxes(1, 2)  # (B, 3H, T, hd), a view
    xp.matmul(datt, k, out=heads[:, :h])
    xp.matmul(datt.swapaxes(-1, -2), q, out=heads[:, h : 2 * h])
    xp.matmul(p.swapaxes(-1, -2), dy, out=heads[:, 2 * h :])
    return merged.reshape(b, t, 3 * h * hd)
