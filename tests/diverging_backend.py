"""A backend whose loss turns NaN at step DIVERGES_AT, for the tests of a
diverging trial: within engine.config's limits a real run diverges rarely.
It is the NumPy backend, steps and all, until then.

register() adds it to the engine's backends as "diverging"; SITECUSTOMIZE is
a sitecustomize.py that does so in every Python process started with its
folder on PYTHONPATH (a sweep's runner and Ray's workers)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.backends import register_backend
from engine.backends.numpy_backend import NumpyBackend

NAME = "diverging"
DIVERGES_AT = 1500
SITECUSTOMIZE = (f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
                 "import diverging_backend\ndiverging_backend.register()\n")


class DivergingBackend(NumpyBackend):
    """The NumPy backend whose loss turns NaN from step DIVERGES_AT."""

    name = NAME

    def _train_steps(self, k):
        losses = super()._train_steps(k)
        if self._step + len(losses) < DIVERGES_AT:
            return losses
        cut = max(0, DIVERGES_AT - self._step)
        return np.append(losses[:cut], np.float32(np.nan)).astype(np.float32)


def probe() -> tuple[bool, str]:
    return True, "test backend"


def opener(model, train, corpus, params):
    return DivergingBackend(model, train, corpus, params)


def register() -> None:
    register_backend(NAME, probe, opener)
