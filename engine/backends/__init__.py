"""Backend registry: what can run here (and why not), and opening one by name."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..config import ModelConfig, TrainConfig
from ..data import Corpus
from .base import Backend, BackendError, TrainingDiverged, TrainState


@dataclass(frozen=True)
class BackendInfo:
    name: str
    available: bool
    reason: str  # why not, when unavailable; a short description otherwise


def _numpy_probe() -> tuple[bool, str]:
    return True, "NumPy on the CPU (reference, always available)"


def _numpy_open(model, train, corpus, params):
    from .numpy_backend import NumpyBackend

    return NumpyBackend(model, train, corpus, params)


def _cupy_probe() -> tuple[bool, str]:
    from .cupy_backend import probe

    return probe()


def _cupy_open(model, train, corpus, params):
    from .cupy_backend import CupyBackend

    return CupyBackend(model, train, corpus, params)


# name -> (probe() -> (available, reason), opener(model, train, corpus, params))
_REGISTRY: dict[str, tuple[Callable[[], tuple[bool, str]], Callable]] = {
    "numpy": (_numpy_probe, _numpy_open),
    "cupy": (_cupy_probe, _cupy_open),
}


def register_backend(name: str, probe, opener) -> None:
    _REGISTRY[name] = (probe, opener)


def list_backends() -> list[BackendInfo]:
    infos = []
    for name, (probe, _) in _REGISTRY.items():
        try:
            available, reason = probe()
        except Exception as exc:  # a probe must never take the app down
            available, reason = False, f"{name} check failed: {exc}"
        infos.append(BackendInfo(name, bool(available), reason))
    return infos


def open_backend(name: str, model: ModelConfig, train: TrainConfig, corpus: Corpus,
                 params=None) -> Backend:
    """A ready backend starting from init_params (or the given flat params)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(_REGISTRY)}")
    probe, opener = _REGISTRY[name]
    available, reason = probe()
    if not available:
        raise BackendError(f"backend {name} is not available: {reason}")
    return opener(model, train, corpus, params)


__all__ = ["Backend", "BackendError", "BackendInfo", "TrainingDiverged", "TrainState",
           "list_backends", "open_backend", "register_backend"]

from .futhark_backend import FUTHARK_BACKENDS  # noqa: E402  (imports nothing heavy)

for _name, (_probe, _opener) in FUTHARK_BACKENDS.items():
    register_backend(_name, _probe, _opener)
