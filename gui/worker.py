"""Training off the GUI thread: a TrainingWorker (a QObject living in a QThread)
that owns one backend, runs it in chunks of `backend.train(k)`, and reports by
signals. No widget is touched from here.

The backend is created, used and closed in the worker's thread only (Futhark
contexts are not thread-safe). The GUI talks to the worker through a command
queue that the worker reads between calls, and two flags it may set at any
time: `interrupt` (Stop or an ending: a sample in progress is cancelled) and
`ending` (close the backend and finish; queued requests are dropped). So the
GUI never waits for the worker: a command takes effect after the current
call, which is a chunk of about TARGET_CHUNK_S, one step of a large model, or
an opening or a save that cannot be cut short. `call` names the call the
worker is inside, for the window to show while it waits. The GUI reads no
backend state: `step` and `loss_history()` are lock-free snapshots.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
from PySide6.QtCore import QObject, Signal, Slot

import engine
from engine.introspect import Snapshot

TARGET_CHUNK_S = 0.05  # each backend.train(k) call should take about this long
MAX_STEPS_PER_CHUNK = 4096
# While an inspect panel is on screen, a parameter snapshot after a chunk at most
# this often, and never costing more than SNAPSHOT_SHARE of the training time
SNAPSHOT_INTERVAL_S = 0.25
SNAPSHOT_SHARE = 0.05

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
    losses = Signal(object, int, float)  # np.ndarray of losses, index of the first one's step,
                                         # seconds they took (NaN: not timed, e.g. from a checkpoint)
    samples = Signal(list, int)      # names, the step whose parameters made them
    prefixSamples = Signal(list, int)  # the same, for a sample request with a prefix
    snapshot = Signal(object)        # an engine.inspect.Snapshot of the parameters (when wanted)
    saved = Signal(str)              # checkpoint path
    stateChanged = Signal(str)
    status = Signal(str)
    error = Signal(str, str)         # message, details (e.g. a compiler log)
    diverged = Signal(int)           # training stopped at this step on a non-finite loss
    finished = Signal()              # the backend is closed; the thread ends next

    def __init__(self, spec: RunSpec):
        super().__init__()
        self.spec = spec
        self.backend: engine.Backend | None = None
        self.state = OPENING
        self.call = ""  # the long call the worker is inside ("" between calls)
        self.step = 0   # steps trained so far, as of the last finished call
        self.train_seconds = 0.0  # time spent inside train() calls (for the end-of-run summary)
        self._commands: queue.Queue = queue.Queue()
        self._interrupt = threading.Event()  # Stop or ending: cancel a sample in progress
        self._ending = threading.Event()     # close the backend and finish
        self._serve_saves = True             # when ending: still write queued checkpoints
        self._k = 1
        self._seconds_per_step: float | None = None
        self._snapshots_wanted = threading.Event()  # an inspect panel is on screen
        self._next_snapshot = 0.0  # time.monotonic() after which the next one may be taken
        self._snapshot_cost = 0.0  # seconds the last snapshot took

    # called from the GUI thread (never waits) ---------------------------------
    def pause(self) -> None:
        self._commands.put(("pause",))

    def resume(self) -> None:
        self._commands.put(("resume",))

    def stop(self) -> None:
        """End the training run; the model stays open for sampling and saving."""
        self._interrupt.set()
        self._commands.put(("stop",))

    def end(self, serve_saves: bool = True) -> None:
        """End the worker: cancel a sample in progress, drop queued requests (but
        write queued checkpoints when serve_saves), close the backend, finish."""
        self._serve_saves = serve_saves
        self._ending.set()
        self._interrupt.set()
        self._commands.put(("end",))  # wakes a worker waiting for commands

    def request_samples(self, num_samples: int, temperature: float, seed: int,
                        prefix: str | None = None, max_length: int | None = None) -> None:
        """Names by `samples`; with a prefix (even ""), names that start with it by `prefixSamples`.
        max_length None: the backend's default."""
        self._commands.put(("sample", num_samples, temperature, seed, prefix, max_length))

    def want_snapshots(self, wanted: bool) -> None:
        """Whether to send parameter snapshots while training (an inspect panel is shown)."""
        if wanted:
            self._snapshots_wanted.set()
        else:
            self._snapshots_wanted.clear()

    def request_snapshot(self) -> None:
        """One snapshot of the current parameters, after the current call."""
        self._commands.put(("snapshot",))

    def request_save(self, path: str) -> None:
        self._commands.put(("save", path))

    def loss_history(self) -> np.ndarray:
        """A copy of the backend's loss history, taken without waiting for the worker
        (empty once the worker has ended)."""
        backend = self.backend
        return backend.loss_history if backend is not None else np.empty(0, dtype=np.float32)

    @property
    def steps_per_chunk(self) -> int:
        return self._k

    # the worker's thread ----------------------------------------------------
    @Slot()
    def run(self) -> None:
        try:
            self._run()
        finally:
            self.call = ""
            self._set_state(CLOSED)
            self.finished.emit()

    def _run(self) -> None:
        try:
            self.backend = self._open()
        except Exception as exc:  # compile failure, bad checkpoint, out of memory...
            if not self._ending.is_set():
                self._set_state(FAILED)
                self.error.emit(_message(exc), getattr(exc, "log", "") or "")
            return
        b = self.backend
        try:
            if self._ending.is_set():  # ended while it was opening: nobody waits for it
                return
            self.step = b.step
            self.opened.emit(RunInfo(b.name, b.model, b.train_config, b.num_params,
                                     b.corpus.vocab_size, len(b.corpus), b.step))
            if b.step:
                self.losses.emit(self.loss_history(), 0, float("nan"))
            self._set_state(DONE if b.finished else RUNNING if self.spec.autostart else READY)
            self._loop()
            if self._serve_saves:
                self._write_queued_saves()
        finally:
            self.call = "closing the backend"
            try:
                b.close()
            except Exception:  # closing must not stop the thread from ending
                pass
            self.backend = None  # its memory goes now, not when the window lets go of this worker

    def _open(self) -> engine.Backend:
        spec = self.spec
        self.call = f"opening the {spec.backend} backend"
        self.status.emit(f"Opening backend {spec.backend} (a compiled backend builds its kernels "
                         "on first use; that can take a while)...")
        try:
            if spec.checkpoint is not None:
                return engine.load_checkpoint(spec.checkpoint, backend=spec.backend)
            return engine.open_backend(spec.backend, spec.model, spec.train, spec.corpus)
        finally:
            self.call = ""

    def _loop(self) -> None:
        while not self._ending.is_set():
            try:
                command = (self._commands.get_nowait() if self.state == RUNNING
                           else self._commands.get())
            except queue.Empty:
                command = None
            if self._ending.is_set():
                return
            if command is not None:
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
        elif name == "stop":
            if self.state in (RUNNING, PAUSED, READY):
                self._set_state(DONE)
            self._interrupt.clear()
        elif name == "sample":
            self._sample(*command[1:])
        elif name == "save":
            self._save(command[1])
        elif name == "snapshot":
            self._send_snapshot()

    def _sample(self, num_samples: int, temperature: float, seed: int, prefix: str | None,
                max_length: int | None) -> None:
        self.call = f"sampling {num_samples} names"
        try:
            names = self.backend.sample(num_samples, temperature, seed, prefix=prefix or "",
                                        cancel=self._interrupt.is_set, max_length=max_length)
        except engine.Cancelled:
            self.status.emit("Sampling cancelled")
            return
        except Exception as exc:
            self.error.emit(f"sampling failed: {_message(exc)}", "")
            return
        finally:
            self.call = ""
        (self.samples if prefix is None else self.prefixSamples).emit(names, self.backend.step)

    def _send_snapshot(self) -> None:
        started = time.perf_counter()
        try:
            snapshot = Snapshot.from_backend(self.backend)
        except MemoryError:  # the panels are a view: training goes on without them
            self.status.emit("Not enough memory for a copy of the parameters to inspect")
            return
        except Exception as exc:  # e.g. a backend left unusable by a failed call
            self.status.emit(f"Cannot inspect the parameters: {_message(exc)}")
            return
        self._snapshot_cost = time.perf_counter() - started
        self.snapshot.emit(snapshot)

    def _maybe_send_snapshot(self) -> None:
        """After a chunk: a snapshot when wanted, at most every SNAPSHOT_INTERVAL_S and
        never more than SNAPSHOT_SHARE of the time (a large model's copy is slow)."""
        now = time.monotonic()
        if not self._snapshots_wanted.is_set() or now < self._next_snapshot:
            return
        self._send_snapshot()
        spacing = max(SNAPSHOT_INTERVAL_S, self._snapshot_cost / SNAPSHOT_SHARE)
        self._next_snapshot = time.monotonic() + spacing

    def _save(self, path: str) -> None:
        self.call = "saving the checkpoint"
        try:
            engine.save_checkpoint(path, self.backend)
        except Exception as exc:
            self.error.emit(f"could not save the checkpoint {path}: {_message(exc)}", "")
            return
        finally:
            self.call = ""
        self.saved.emit(str(path))

    def _write_queued_saves(self) -> None:
        """Ending: checkpoints the user asked for are still written; the rest is dropped."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "save":
                self._save(command[1])

    def _train_chunk(self) -> None:
        backend = self.backend
        first = backend.step
        self.call = f"training (step {first + 1:,}, {self._k:,} per call)"
        started = time.perf_counter()
        try:
            losses = backend.train(self._k)
        except engine.TrainingDiverged as exc:
            self.step = backend.step
            self.losses.emit(self.loss_history()[first:], first, float("nan"))
            self._set_state(DONE)
            self.diverged.emit(exc.step)
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
        finally:
            self.call = ""
        elapsed = time.perf_counter() - started
        self.train_seconds += elapsed
        self.step = backend.step
        if len(losses):
            self.losses.emit(losses, first, elapsed)
            self._adapt_chunk(elapsed / len(losses))
        if backend.finished:
            self._set_state(DONE)
        else:
            self._maybe_send_snapshot()

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
        if state in (READY, PAUSED, DONE) and self.backend is not None and self._snapshots_wanted.is_set():
            self._send_snapshot()  # the parameters training stopped at


def _message(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
