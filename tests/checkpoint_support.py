"""The checkpoint tests' fixtures (a pytest plugin, see conftest.py): a short
NumPy run and its saved checkpoint."""
from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from engine import TrainConfig, open_backend
from engine.training.checkpoint import NEW_IN_2

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


def as_format_1(path, dest):
    """The checkpoint at path as format 1 wrote it: none of format 2's members
    (batch size, held-out count and history, warm-up), format_version 1."""
    new_in_2 = {f"{key}.npy" for key in NEW_IN_2}
    out = io.BytesIO()
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as z:
        for info in src.infolist():
            if info.filename == "format_version.npy":
                buffer = io.BytesIO()
                np.save(buffer, np.int64(1))
                z.writestr(info.filename, buffer.getvalue())
            elif info.filename not in new_in_2:
                z.writestr(info.filename, src.read(info.filename))
    dest.write_bytes(out.getvalue())
    return dest
