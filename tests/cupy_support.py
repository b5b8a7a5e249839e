"""Helpers shared by the CuPy backend's tests (with and without a GPU)."""
from __future__ import annotations

import numpy as np

import engine.backends.cupy_backend as cb
from engine.backends.numpy_backend import NumpyBackend


class HostLogicBackend(cb.CupyBackend):
    """CupyBackend's own code with NumPy as the array module and fused_step_host as the kernel."""

    name = "cupy-logic-on-numpy"

    def _bind(self) -> None:
        self.xp = np

    def _fused_step(self, loss, losses, ok, i, scalars) -> None:
        cb.fused_step_host(self.p, self.m, self.v, self.g, loss, losses, ok, i, scalars)


def assert_same_state(a, b, rtol=1e-6, atol=1e-7):
    sa, sb = a.get_state(), b.get_state()
    assert sa.step == sb.step
    for name in ("params", "m", "v"):
        np.testing.assert_allclose(getattr(sa, name), getattr(sb, name), rtol=rtol, atol=atol,
                                   err_msg=name)


def poisoned_params(model, corpus, train, position):
    """init_params with one position embedding set to NaN: steps on documents that
    reach that position get a NaN loss, shorter ones train normally."""
    backend = NumpyBackend(model, train, corpus)
    params = backend.get_state().params
    wpe = next(s for s in backend.specs if s.name == "wpe")
    params[wpe.offset + position * model.n_embd] = np.nan
    return params
