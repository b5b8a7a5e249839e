"""Training off the GUI thread: a TrainingWorker (a QObject living in a QThread)
that owns one backend, runs it in chunks of `backend.train(k)`, and reports by
signals. No widget is touched from here.

The backend is created, used and closed in the worker's thread only (Futhark
contexts are not thread-safe). The GUI talks to the worker through a command
queue that the worker reads between chunks, so a command waits at most one
chunk (about TARGET_CHUNK_S). The step and the loss history stay with the
backend; `step` and `loss_history()` read them under a lock.
"""
from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
from PySide6.QtCore import QObject, QThread, Signal, Slot

import engine

TARGET_CHUNK_S = 0.05  # each backend.train(k) call should take about this long
# While the worker computes in Python, the GUI thread waits for the GIL at each of
# its many short Qt calls, up to one switch interval (5 ms by default) every time;
# a shorter interval keeps the event loop's stalls small.
GIL_SWITCH_INTERVAL_S = 0.0005
MAX_STEPS_PER_CHUNK = 4096

# worker states (stateChanged carries one of these)
OPENING, READY, RUNNING, PAUSED, DONE, FAILED, CLOSED = (
    "opening", "ready", "running", "paused", "done", "failed", "closed")
HAS_MODEL = (READY, RUNNING, PAUSED, DONE)  # the backend is open: it can sample and save


@dataclass(frozen=True)
class RunInfo:
    """What the window shows about an opened run (sent once by `opened`)."""

    backend: str
    model: engine.ModelConfig
    train: engine.TrainConfig
    num_params: int
    vocab_size: int
    num_docs: int
    step: int


@dataclass(frozen=True)
class RunSpec:
    """How to open the run: a fresh one, or one resumed from a checkpoint."""

    backend: str
    corpus: engine.Corpus | None = None
    model: engine.ModelConfig | None = None
    train: engine.TrainConfig | None = None
    checkpoint: object | None = None  # an engine checkpoint, already read and checked
    autostart: bool = True


class TrainingWorker(QObject):
    opened = Signal(object)          # RunInfo
    losses = Signal(object, int)     # np.ndarray of losses, index of the first one's step
    samples = Signal(list, int)      # names, the step whose parameters made them
    saved = Signal(str)              # checkpoint path
    stateChanged = Signal(str)
    status = Signal(str)
    compiling = Signal(str)          # backend name: opening it may compile kernels
    error = Signal(str, str)         # message, details (e.g. a compiler log)
    finished = Signal()              # the backend is closed; the thread may end

    def __init__(self, spec: RunSpec):
        super().__init__()
        self.spec = spec
        self.backend: engine.Backend | None = None
        self.state = OPENING
        self._commands: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._k = 1
        self._seconds_per_step: float | None = None

    # called from the GUI thread ---------------------------------------------
    def pause(self) -> None:
        self._commands.put(("pause",))

    def resume(self) -> None:
        self._commands.put(("resume",))

    def stop(self) -> None:
        """End the training run; the model stays open for sampling and saving."""
        self._commands.put(("stop",))

    def quit(self) -> None:
        """End the run and the worker: close the backend and return from run()."""
        self._commands.put(("quit",))

    def request_samples(self, num_samples: int, temperature: float, seed: int) -> None:
        self._commands.put(("sample", num_samples, temperature, seed))

    def request_save(self, path: str) -> None:
        self._commands.put(("save", path))

    @property
    def step(self) -> int:
        with self._lock:
            return self.backend.step if self.backend is not None else 0

    def loss_history(self) -> np.ndarray:
        """The backend's loss history (a copy), read between chunks."""
        with self._lock:
            if self.backend is None:
                return np.empty(0, dtype=np.float32)
            return self.backend.loss_history

    @property
    def steps_per_chunk(self) -> int:
        return self._k

    # the worker's thread ----------------------------------------------------
    @Slot()
    def run(self) -> None:
        try:
            self.backend = self._open()
        except Exception as exc:  # compile failure, bad checkpoint, out of memory...
            self._set_state(FAILED)
            self.error.emit(_message(exc), getattr(exc, "log", "") or "")
            self.finished.emit()
            return
        b = self.backend
        self.opened.emit(RunInfo(b.name, b.model, b.train_config, b.num_params,
                                 b.corpus.vocab_size, len(b.corpus), b.step))
        if b.step:
            self.losses.emit(self.loss_history(), 0)
        self._set_state(DONE if b.finished else RUNNING if self.spec.autostart else READY)
        try:
            self._loop()
        finally:
            with self._lock:
                try:
                    b.close()
                except Exception:  # closing must not stop the thread from ending
                    pass
            self._set_state(CLOSED)
            self.finished.emit()

    def _open(self) -> engine.Backend:
        spec = self.spec
        self.compiling.emit(spec.backend)
        self.status.emit(f"Opening backend {spec.backend} (a compiled backend builds its kernels "
                         "on first use; that can take a while)...")
        if spec.checkpoint is not None:
            return engine.load_checkpoint(spec.checkpoint, backend=spec.backend)
        return engine.open_backend(spec.backend, spec.model, spec.train, spec.corpus)

    def _loop(self) -> None:
        while True:
            try:
                command = (self._commands.get_nowait() if self.state == RUNNING
                           else self._commands.get())
            except queue.Empty:
                command = None
            if command is not None:
                if command[0] == "quit":
                    return
                self._handle(command)
            elif self.state == RUNNING:
                self._train_chunk()
                time.sleep(0)  # hand the GIL to the GUI thread if it is waiting

    def _handle(self, command: tuple) -> None:
        name = command[0]
        if name == "pause" and self.state == RUNNING:
            self._set_state(PAUSED)
        elif name == "resume" and self.state in (PAUSED, READY):
            self._seconds_per_step = None  # re-measure: the machine may have changed
            self._set_state(RUNNING)
        elif name == "stop" and self.state in (RUNNING, PAUSED, READY):
            self._set_state(DONE)
        elif name == "sample":
            _, n, temperature, seed = command
            try:
                with self._lock:
                    names, step = self.backend.sample(n, temperature, seed), self.backend.step
                self.samples.emit(names, step)
            except Exception as exc:
                self.error.emit(f"sampling failed: {_message(exc)}", "")
        elif name == "save":
            try:
                with self._lock:
                    engine.save_checkpoint(command[1], self.backend)
                self.saved.emit(str(command[1]))
            except Exception as exc:
                self.error.emit(f"could not save the checkpoint {command[1]}: {_message(exc)}", "")

    def _train_chunk(self) -> None:
        backend = self.backend
        first = backend.step
        started = time.perf_counter()
        try:
            with self._lock:
                losses = backend.train(self._k)
        except engine.TrainingDiverged as exc:
            self.losses.emit(self.loss_history()[first:], first)
            self._set_state(DONE)
            self.error.emit(str(exc), "")
            return
        except MemoryError:
            self._set_state(DONE)
            self.error.emit("out of memory: choose a smaller model (preset) and train again", "")
            return
        except Exception as exc:
            self._set_state(DONE)
            self.error.emit(f"training failed: {_message(exc)}", getattr(exc, "log", "") or "")
            return
        elapsed = time.perf_counter() - started
        if len(losses):
            self.losses.emit(losses, first)
            self._adapt_chunk(elapsed / len(losses))
        if backend.finished:
            self._set_state(DONE)

    def _adapt_chunk(self, seconds_per_step: float) -> None:
        """Choose k so the next call takes about TARGET_CHUNK_S (growing at most 2x)."""
        if self._seconds_per_step is None:
            self._seconds_per_step = seconds_per_step
        else:  # smooth out single slow chunks (another process, a GC pause)
            self._seconds_per_step = 0.7 * self._seconds_per_step + 0.3 * seconds_per_step
        ideal = int(TARGET_CHUNK_S / max(self._seconds_per_step, 1e-7))
        self._k = max(1, min(ideal, 2 * self._k, MAX_STEPS_PER_CHUNK))

    def _set_state(self, state: str) -> None:
        self.state = state
        self.stateChanged.emit(state)


def _message(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


class Session:
    """One run: a TrainingWorker moved to its own QThread, and its clean shutdown."""

    def __init__(self, spec: RunSpec):
        self.worker = TrainingWorker(spec)
        self.thread = QThread()
        self.thread.setObjectName("training")
        self.worker.moveToThread(self.thread)
        self.thread.started.connect(self.worker.run)
        self.worker.finished.connect(self.thread.quit)

    def start(self) -> None:
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))
        self.thread.start()

    def shutdown(self, timeout_ms: int = 30000) -> bool:
        """Stop the worker and join its thread; True when the thread has ended."""
        self.worker.quit()
        self.thread.quit()
        return self.thread.wait(timeout_ms)
