"""An independent reference of sampling's random numbers (engine/model/sampling.py's
module doc): SplitMix64 on Python integers, one number at a time, and the
inverse-CDF draw on one row. The engine's NumPy version and the Futhark
kernel's are held to it."""
from __future__ import annotations

import numpy as np

MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """SplitMix64's output for the state x (Steele, Lea and Flood, 2014)."""
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def uniform(seed: int, sample: int, position: int) -> float:
    """The uniform number in [0, 1) of one (seed, sample, position)."""
    key = splitmix64(splitmix64(splitmix64(seed & MASK64) ^ sample) ^ position)
    return (key >> 11) / 2.0**53


def draw(logits, temperature: float, u: float) -> int:
    """The token whose CDF interval of softmax(float64(logits) / temperature) holds u."""
    scaled = np.asarray(logits, dtype=np.float32).astype(np.float64) / temperature
    e = np.exp(scaled - scaled.max())
    cdf = np.cumsum(e / e.sum())
    return int(min(np.count_nonzero(cdf < u), len(scaled) - 1))
