"""Comparing two backends' names for the same seed (tests/test_sampling_backends.py,
the CuPy GPU tests): equal, except where a draw's uniform number lies within
rounding of a CDF boundary, where the backends' last-bit differences in the
logits may pick the neighbouring character."""
from __future__ import annotations

import numpy as np

from engine.model.gpt import forward, linear
from engine.model.sampling import uniforms

BOUNDARY = 1e-5  # far above float32 logits' rounding (about 1e-7 of a probability)


def draw_margins(backend, names: list[str], temperature: float, seed: int, prefix: str,
                 max_length: int) -> np.ndarray:
    """For each name NumPy drew, the smallest distance between one of its draws'
    uniform numbers and a CDF entry: teacher-forced over the name's own tokens."""
    corpus, model = backend.corpus, backend.model
    ids = [corpus.encode(name) for name in names]
    width = min(max(map(len, ids)) + 1, max_length)  # positions fed: bos, then all but a full name's last
    tokens = np.full((len(names), width), corpus.bos, dtype=np.int64)
    for row, name_ids in zip(tokens, ids):
        row[1 : 1 + len(name_ids)] = name_ids[: width - 1]
    x, _ = forward(backend.w, tokens, model, np)
    logits = linear(x, backend.w.lm_head).astype(np.float64) / temperature
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    cdf = np.cumsum(p / p.sum(axis=-1, keepdims=True), axis=-1)
    margins = np.full(len(names), np.inf)
    rows = np.arange(len(names))
    for position in range(len(prefix), width):  # the draw of character `position`
        drew = np.array([position <= len(name_ids) for name_ids in ids])  # a character, or the end before max_length
        u = uniforms(seed, rows, position)
        # the names themselves are these draws (this recomputation is the sampler's)
        token = np.array([name_ids[position] if position < len(name_ids) else corpus.bos for name_ids in ids])
        assert np.array_equal(((cdf[:, position] < u[:, None]).sum(axis=-1))[drew], token[drew])
        gap = np.abs(cdf[:, position] - u[:, None]).min(axis=-1)
        margins = np.where(drew, np.minimum(margins, gap), margins)
    return margins


def assert_same_up_to_boundaries(reference, want, got, temperature, seed, prefix, max_length, most):
    assert len(got) == len(want)
    differ = [i for i, (a, b) in enumerate(zip(want, got)) if a != b]
    margins = draw_margins(reference, want, temperature, seed, prefix,
                           max_length or reference.default_max_length(len(prefix)))
    near = set(np.flatnonzero(margins < BOUNDARY))
    assert set(differ) <= near, [(want[i], got[i]) for i in differ if i not in near]
    assert len(differ) <= most, f"{len(differ)} of {len(want)} names differ"
    return differ
