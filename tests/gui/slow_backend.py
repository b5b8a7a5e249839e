"""A NumPy backend made artificially slow, for the never-freeze tests and the soak.

SlowBackend sleeps in `open`, in every `train(k)` call, in `sample`, in each
batch of the held-out evaluation and in get_state (a save), and announces a
first-use build as engine.futhark.build does, as a large model, a compile or a
long sampling run would. Its sampling honours `cancel` (polled
every 10 ms) unless `Delays.cancellable` is off, like a backend whose sampling
cannot be cut short. Above SMALL_MODEL parameters it
samples random names instead of computing them (only its timing matters there).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace

import numpy as np

import engine
from engine.backends import _REGISTRY, register_backend
from engine.backends.numpy_backend import NumpyBackend
from engine.futhark import build as futhark_build

NAME = "slow-numpy"
SMALL_MODEL = 200_000  # parameters; larger models sample fake names (real sampling takes minutes there)
POLL_S = 0.01


@dataclass
class Delays:
    open_s: float = 0.0
    train_s: float = 0.0    # per train(k) call
    sample_s: float = 0.0   # per sample() call
    heldout_s: float = 0.0  # per batch of held-out documents (the evaluation is cancelled between batches)
    state_s: float = 0.0    # per get_state() (a checkpoint's save, a snapshot)
    build_s: float = 0.0    # a first-use build announced as engine.futhark.build announces one
    cancellable: bool = True


class SlowBackend(NumpyBackend):
    name = NAME
    delays = Delays()
    calls: dict[str, int] = {"open": 0, "train": 0, "sample": 0, "sample_started": 0, "heldout_batch": 0}
    _lock = threading.Lock()

    def __init__(self, model, train, corpus, params=None):
        self._count("open")
        if self.delays.build_s:
            self._build()
        time.sleep(self.delays.open_s)
        super().__init__(model, train, corpus, params)

    def _build(self) -> None:
        """What engine.futhark.build does around a first-use build: its announcements
        to the build listeners, from this thread, and the time it takes."""
        start = futhark_build.BuildEvent("start", NAME, "shipped", "cc 1.0", "0.25.34",
                                         f"about {self.delays.build_s:g} s")
        futhark_build._announce(start)
        time.sleep(self.delays.build_s)
        futhark_build._announce(replace(start, phase="done", seconds=self.delays.build_s))

    @classmethod
    def _count(cls, what: str) -> None:
        with cls._lock:
            cls.calls[what] += 1

    def _train_steps(self, k: int) -> np.ndarray:
        self._count("train")
        time.sleep(self.delays.train_s)
        return super()._train_steps(k)

    def get_state(self):
        time.sleep(self.delays.state_s)
        return super().get_state()

    def _doc_losses(self, batch) -> np.ndarray:
        self._count("heldout_batch")
        time.sleep(self.delays.heldout_s)
        return super()._doc_losses(batch)

    def _sample_ids(self, num_samples, temperature, seed, prefix, cancel=None, *, max_length):
        self._count("sample_started")
        deadline = time.monotonic() + self.delays.sample_s
        while time.monotonic() < deadline:
            if self.delays.cancellable and cancel is not None and cancel():
                raise engine.Cancelled("sampling was cancelled")
            time.sleep(POLL_S)
        if not self.delays.cancellable:
            cancel = None
        if self.num_params <= SMALL_MODEL:
            ids = super()._sample_ids(num_samples, temperature, seed, prefix, cancel, max_length=max_length)
        else:
            rng = np.random.default_rng(seed)
            ids = [rng.integers(0, self.corpus.bos, rng.integers(1, 8)).tolist() for _ in range(num_samples)]
        self._count("sample")
        return ids


def register(delays: Delays) -> None:
    """Register SlowBackend (before the window is made: it lists backends once)."""
    SlowBackend.delays = delays
    SlowBackend.calls = dict.fromkeys(SlowBackend.calls, 0)
    register_backend(NAME, lambda: (True, "a NumPy backend made slow for tests"),
                     lambda model, train, corpus, params: SlowBackend(model, train, corpus, params))


def unregister() -> None:
    _REGISTRY.pop(NAME, None)
