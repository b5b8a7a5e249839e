"""A run going wrong while its loss stays finite: a warning, not an error.

A NaN or inf loss stops training (TrainingDiverged). A loss that climbs far
above ln(V), the cross-entropy of guessing every token uniformly, means the
run is diverging too (lr 10 on `tiny` ends near 2,700 without a single NaN),
so the CLI and the window say so.
"""
from __future__ import annotations

import math

import numpy as np

WINDOW = 100  # recent steps averaged: single names' losses jump by +-0.5
FACTOR = 3.0  # "far above": a mean this many times ln(V)


def loss_warning(losses, vocab_size: int, window: int = WINDOW, factor: float = FACTOR) -> str:
    """A sentence when the mean of the last `window` finite losses exceeds
    factor * ln(vocab_size), else ""."""
    recent = np.asarray(losses, dtype=np.float64)[-window:]
    recent = recent[np.isfinite(recent)]
    if vocab_size < 2 or not len(recent):
        return ""
    uniform, mean = math.log(vocab_size), float(recent.mean())
    if mean <= factor * uniform:
        return ""
    return (f"the run is diverging: the mean loss of the last {len(recent)} steps is {mean:.4g}, "
            f"far above ln({vocab_size}) = {uniform:.2f}, the loss of guessing uniformly. "
            "Lower the learning rate (or init std) and train again.")
