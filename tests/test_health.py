"""engine.training.health.loss_warning: a finite loss far above ln(V) is a warning."""
import math

import numpy as np

from engine import loss_warning


def test_no_warning_near_or_below_uniform():
    v = 27
    assert loss_warning(np.full(500, math.log(v)), v) == ""
    assert loss_warning(np.linspace(3.3, 2.0, 1000), v) == ""
    assert loss_warning(np.empty(0), v) == ""


def test_warning_names_the_mean_and_ln_v():
    v = 27
    losses = np.concatenate([np.full(900, 2.5), np.full(100, 2698.0)])
    text = loss_warning(losses, v)
    assert "diverging" in text and "ln(27) = 3.30" in text and "2698" in text


def test_only_recent_finite_losses_count():
    v = 27
    early_blowup = np.concatenate([np.full(50, 100.0), np.full(200, 2.3)])
    assert loss_warning(early_blowup, v) == ""  # the last 100 steps are fine
    with_nan = np.array([np.nan] * 10 + [50.0] * 20)
    assert "mean loss of the last 20 steps is 50" in loss_warning(with_nan, v)
