"""Helpers for the Futhark tests: skipping where the compiler is absent,
opening a backend, and an independent reference of the kernel's sampler.

The reference re-implements the kernel's RNG (hash32 and uniform in
kernels/sample.fut) in Python, runs NumPy's full forward pass over the
whole prefix for every token (engine.model.next_token_logits, no cache)
and draws by inverse CDF in float32, as the kernel's `draw` does.
"""
from __future__ import annotations

import numpy as np
import pytest

from engine import open_backend
from engine import futhark_build as fb
from engine import futhark_tools as ft
from engine.model import Weights, next_token_logits


def _compiler_reason() -> str | None:
    try:
        ft.find_compiler()
    except ft.CompilerNotFound as exc:
        return str(exc)
    return None


NO_FUTHARK = _compiler_reason()
requires_futhark = pytest.mark.skipif(NO_FUTHARK is not None, reason=f"needs the Futhark compiler: {NO_FUTHARK}")
CPU_BACKENDS = ["futhark-c", "futhark-multicore"]


def open_futhark(name, model, train, corpus, params=None):
    """open_backend(name, ...), skipping the test where that backend cannot run."""
    available, reason = fb.probe(name.removeprefix("futhark-"))
    if not available:
        pytest.skip(f"{name}: {reason}")
    return open_backend(name, model, train, corpus, params)


# -- the sampler's reference ---------------------------------------------------

MASK32 = 0xFFFFFFFF


def hash32(x: int) -> int:
    """Wellons' lowbias32 on unsigned 32-bit integers."""
    x &= MASK32
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & MASK32
    x = ((x ^ (x >> 15)) * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def uniform(seed: int, sample: int, position: int) -> np.float32:
    """The kernel's uniform number in [0, 1) for (seed, sample, position)."""
    h = hash32((seed & MASK32) ^ hash32((seed >> 32) & MASK32))
    h = hash32(h ^ (sample & MASK32))
    h = hash32(h ^ (position & MASK32))
    return np.float32(h >> 8) / np.float32(16777216)


def draw(logits: np.ndarray, u: np.float32) -> int:
    """The token whose float32 CDF interval holds u."""
    logits = np.asarray(logits, dtype=np.float32)
    e = np.exp(logits - logits.max())
    cdf = np.cumsum(e / e.sum(dtype=np.float32), dtype=np.float32)
    return int(min(np.count_nonzero(cdf < u), len(logits) - 1))


def reference_samples(params, specs, model, bos: int, num_samples: int, temperature: float,
                      seed: int, prefix=()) -> list[list[int]]:
    """Each sample's token ids after bos + prefix, recomputing the whole
    sequence for every token."""
    weights = Weights(np.asarray(params, dtype=np.float32), specs, model)
    samples = []
    for j in range(num_samples):
        sequence, drawn = [bos, *prefix], []
        for position in range(len(prefix), model.block_size):
            logits = next_token_logits(weights, np.array([sequence]), model, np)[0]
            token = draw(logits / np.float32(temperature), uniform(seed, j, position))
            if token == bos:
                break
            drawn.append(token)
            sequence.append(token)
        samples.append(drawn)
    return samples
