"""The larger presets train sensibly from their first steps (slow: 20
gpt2-small steps on NumPy took 7.5 s on the idle 2-core machine, 70 s at a
load of 6 and 6 minutes at 12)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from engine import PRESETS, open_backend
from engine.training.health import loss_warning


@pytest.mark.slow
def test_a_20_step_gpt2_small_run_stays_near_the_uniform_loss(names_corpus):
    """What `demo --preset gpt2-small --steps 20` trains. Its first Adam steps at
    the full rate moved all 85 million weights by lr each, overfitting the first
    name (its loss fell to 0.0002) and putting the next ones at 8 to 14; the
    preset's warm-up and init std keep every step below ln(V) + 1, and the run
    draws no divergence warning."""
    preset = PRESETS["gpt2-small"].with_steps(20)
    backend = open_backend("numpy", preset.model, preset.train, names_corpus)
    try:
        losses = backend.train(20)
    finally:
        backend.close()
    bound = math.log(names_corpus.vocab_size) + 1
    assert len(losses) == 20 and np.isfinite(losses).all()
    assert losses[1:].max() < bound, np.round(losses, 2).tolist()
    assert loss_warning(losses, names_corpus.vocab_size) == ""
