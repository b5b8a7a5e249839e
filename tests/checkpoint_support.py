"""The checkpoint tests' fixtures (a pytest plugin, see conftest.py): a short
NumPy run and its saved checkpoint."""
from __future__ import annotations

import pytest

from engine import TrainConfig, open_backend

TRAIN = TrainConfig(num_steps=30, learning_rate=0.02, seed=9)


@pytest.fixture
def run(small_corpus, small_model):
    """A backend trained for 6 steps."""
    b = open_backend("numpy", small_model, TRAIN, small_corpus)
    b.train(6)
    return b


@pytest.fixture
def saved(run, tmp_path):
    path = tmp_path / "run.npz"
    run.save(path)
    return path
