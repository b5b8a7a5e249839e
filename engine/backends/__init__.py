"""Backend registry: what can run here (and why not), and opening one by name."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from ..training.checkpoint import Checkpoint, read_checkpoint
from ..config import ModelConfig, TrainConfig
from ..data.corpus import Corpus
from ..errors import BackendError, TrainingDiverged
from .base import Backend, TrainState


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
    from .cupy_probe import probe

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


def backend_names() -> tuple[str, ...]:
    """Every backend's name, without probing any."""
    return tuple(_REGISTRY)


def list_backends() -> list[BackendInfo]:
    return [BackendInfo(name, *probe_backend(name)) for name in _REGISTRY]


def probe_backend(name: str) -> tuple[bool, str]:
    """(available, reason) of one backend, probing only that one; ValueError for a
    name that is no backend."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(_REGISTRY)}")
    try:
        available, reason = _REGISTRY[name][0]()
    except Exception as exc:  # a probe must never take the app down
        return False, f"{name} check failed: {exc}"
    return bool(available), reason


def open_backend(name: str, model: ModelConfig, train: TrainConfig, corpus: Corpus,
                 params=None) -> Backend:
    """A ready backend starting from init_params (or the given flat params)."""
    available, reason = probe_backend(name)
    if not available:
        raise BackendError(f"backend {name} is not available: {reason}")
    return _REGISTRY[name][1](model, train, corpus, params)


def load_checkpoint(checkpoint, backend: str = "numpy", num_steps: int | None = None):
    """Open `backend` with the checkpoint's state, ready to resume training.

    checkpoint is a path, or a Checkpoint that read_checkpoint already returned
    (so a caller that validated the file does not read it twice).
    num_steps, if given, extends (or shortens, not below the current step) the run.
    """
    ck = checkpoint if isinstance(checkpoint, Checkpoint) else read_checkpoint(checkpoint)
    train = ck.train if num_steps is None else replace(ck.train, num_steps=num_steps)
    if ck.step > train.num_steps:
        raise ValueError(f"num_steps {train.num_steps} is below the checkpoint's step {ck.step}")
    opened = open_backend(backend, ck.model, train, ck.corpus, params=ck.params)
    opened.set_state(TrainState(ck.params, ck.m, ck.v, ck.step), losses=ck.losses, heldout=ck.heldout)
    return opened


__all__ = ["Backend", "BackendError", "BackendInfo", "TrainingDiverged", "TrainState",
           "backend_names", "list_backends", "load_checkpoint", "open_backend", "probe_backend", "register_backend"]

from .futhark_backend import FUTHARK_BACKENDS  # noqa: E402  (imports nothing heavy)

for _name, (_probe, _opener) in FUTHARK_BACKENDS.items():
    register_backend(_name, _probe, _opener)
