"""Training off the GUI thread: a TrainingWorker (a QObject living in a QThread)
that owns one backend, runs it in chunks of `backend.train(k)`, and reports
by one signal, `reported`, carrying engine.training.protocol events. No widget is
touched from here.

The backend is created, used and closed in the worker's thread only (Futhark
contexts are not thread-safe). The GUI talks to the worker with `send(command)`
(engine.training.protocol commands): most are queued and read between calls; Stop
and End also set flags at once (`interrupt`: a sample in progress is
cancelled; `ending`: close the backend and finish, queued requests dropped
but for the checkpoints asked for, which are written first).
So the GUI never waits for the worker: a command takes effect after the
current call, which is a chunk of about TARGET_CHUNK_S, one step of a large
model, or an opening or a save that cannot be cut short. The worker's phase
moves by engine.training.run_model's table. `call` names the call the worker is inside, for
the window to show while it waits. The GUI reads no backend state: `step`,
`train_seconds` and `loss_history()` are lock-free snapshots.

Between chunks the worker also evaluates the held-out loss when
engine.training.heldout's HoldoutSchedule says it is due (within a tenth of the
training time, and at the end), reported as Heldout events; a command that
comes meanwhile cancels the evaluation between batches of documents.
"""
from __future__ import annotations

import queue
import threading
import time

import numpy as np
from PySide6.QtCore import QCoreApplication, QObject, Signal, Slot

import engine
from engine.futhark.build import BuildEvent, add_build_listener
from engine.training import protocol as rs
from engine.model.introspect import Snapshot
from engine.training.heldout import HoldoutSchedule, evaluate_if_due, evaluation_estimate
from engine.training.run_model import Phase, allows, extend_backend, next_phase
from engine.training.protocol import RunInfo, RunSpec

TARGET_CHUNK_S = 0.05  # each backend.train(k) call should take about this long
MAX_STEPS_PER_CHUNK = 4096
# While an inspect panel is on screen, a parameter snapshot after a chunk at most
# this often, and never costing more than SNAPSHOT_SHARE of the training time
SNAPSHOT_INTERVAL_S = 0.25
SNAPSHOT_SHARE = 0.05
SAVING = "saving the checkpoint"  # `call` while a checkpoint is written


class TrainingWorker(QObject):
    reported = Signal(object)  # a protocol event (named so: see gui.sessions.WorkerReports)
    finished = Signal()     # the backend is closed; the thread ends next

    def __init__(self, spec: RunSpec):
        super().__init__()
        self.spec = spec
        self.backend: engine.Backend | None = None
        self.phase = Phase.OPENING
        self.call = ""  # the long call the worker is inside ("" between calls)
        self.step = 0   # steps trained so far, as of the last finished call
        self.train_seconds = 0.0  # time spent inside train() calls (summary, autosave clock)
        self._commands: queue.Queue = queue.Queue()
        self._interrupt = threading.Event()  # Stop or ending: cancel a sample in progress
        self._ending = threading.Event()     # close the backend and finish
        self._serve_saves = True             # when ending: still write queued checkpoints
        self._k = 1
        self._seconds_per_step: float | None = None
        self._snapshots_wanted = threading.Event()  # an inspect panel is on screen
        self._next_snapshot = 0.0  # time.monotonic() after which the next one may be taken
        self._snapshot_cost = 0.0  # seconds the last snapshot took
        self._holdout = HoldoutSchedule()  # held-out evaluations: at most its share of the training time
        self._evaluating = True  # False once an evaluation failed: training goes on without them
        self._diverged = False     # a diverged run's parameters are not evaluated
        # checkpoints asked for, and those written (or refused): each count has one writer thread
        self._saves_sent = 0     # the GUI thread's
        self._saves_settled = 0  # this worker's

    # called from the GUI thread (never waits) ---------------------------------
    def send(self, command: rs.Command) -> None:
        """Ask for `command`; it takes effect after the current call (Stop and End
        cancel a sample in progress at once)."""
        if isinstance(command, rs.WantSnapshots):
            (self._snapshots_wanted.set if command.wanted else self._snapshots_wanted.clear)()
            return
        if isinstance(command, rs.Save):
            self._saves_sent += 1
        if isinstance(command, rs.End):
            self._serve_saves = command.serve_saves
            self._ending.set()
        if isinstance(command, (rs.Stop, rs.End)):
            self._interrupt.set()
        self._commands.put(command)  # an End wakes a worker waiting for commands

    def loss_history(self) -> np.ndarray:
        """A copy of the backend's loss history, taken without waiting for the worker
        (empty once the worker has ended)."""
        backend = self.backend
        return backend.loss_history if backend is not None else np.empty(0, dtype=np.float32)

    @property
    def steps_per_chunk(self) -> int:
        return self._k

    @property
    def saves_pending(self) -> bool:
        """A checkpoint asked for is not written yet (queued, or being written)."""
        return self._saves_sent > self._saves_settled

    # the worker's thread ----------------------------------------------------
    @Slot()
    def run(self) -> None:
        try:
            self._run()
        finally:
            self.call = ""
            # back to the GUI thread, where the session lets go of this object once the
            # thread has ended: a QObject is deleted in its own thread, never another's
            app = QCoreApplication.instance()
            if app is not None:
                self.moveToThread(app.thread())
            self.finished.emit()

    def _emit(self, event: rs.Event) -> None:
        self.reported.emit(event)

    def _run(self) -> None:
        try:
            self.backend = self._open()
        except Exception as exc:  # compile failure, bad checkpoint, out of memory...
            if not self._ending.is_set():
                self._move(rs.Failed())
                self._emit(rs.Error(_message(exc), engine.error_details(exc)))
            return
        b = self.backend
        try:
            if self._ending.is_set():  # ended while it was opening: nobody waits for it
                return
            self.step = b.step
            self._emit(rs.Opened(RunInfo(b.name, b.model, b.train_config, b.num_params, b.corpus.vocab_size,
                                         len(b.corpus), b.step, b.holdout), self.spec.checkpoint is not None))
            if b.step:
                self._emit(rs.Losses(self.loss_history(), 0, float("nan")))
                self._emit(rs.Heldout(tuple(b.heldout_history), replacing=True))  # a checkpoint's curve
            self._move(rs.Opened)
            if b.finished:
                self._move(rs.Finished())
            elif self.spec.autostart:
                self._move(rs.Resume())
            taken = self._loop()
            if self._serve_saves:
                self._write_queued_saves(taken)
        finally:
            self.call = "closing the backend"
            self._close(self.backend)
            self.backend = None  # its memory goes now, not when the window lets go of this worker

    @staticmethod
    def _close(backend) -> None:
        try:
            backend.close()
        except Exception:  # closing must not stop the thread from ending
            pass

    def _open(self) -> engine.Backend:
        spec = self.spec
        self.call = f"opening the {spec.backend} backend"
        self._emit(rs.Status(f"Opening backend {spec.backend} (a compiled backend builds its kernels "
                             "on first use; that can take a while)..."))
        opener = threading.get_ident()
        # a Futhark library built on first use (tens of seconds): said as the command line says it
        remove = add_build_listener(lambda event: threading.get_ident() == opener and self._on_build(event))
        try:
            if spec.checkpoint is not None:
                return engine.load_checkpoint(spec.checkpoint, backend=spec.backend)
            return engine.open_backend(spec.backend, spec.model, spec.train, spec.corpus)
        finally:
            remove()
            self.call = ""

    def _on_build(self, event: BuildEvent) -> None:
        """A build this opening started, or ended (engine.futhark.build's announcement)."""
        if event.phase == "start":
            self.call = f"building {event.backend} (first use, {event.estimate})"  # the status says from what
        else:
            self.call = f"opening the {self.spec.backend} backend"
        self._emit(rs.Status(event.message()))

    def _loop(self) -> rs.Command | None:
        """Commands and training chunks until the end; returns the command taken off
        the queue when the end came, not carried out (a Save is still written)."""
        while not self._ending.is_set():
            if self.phase == Phase.DONE and self._commands.empty() and not self._heldout_current():
                # a stopped run's held-out loss where it ended, or a finished run's whose last
                # evaluation a command cut short
                self._evaluate(finished=True)
            try:
                command = (self._commands.get_nowait() if self.phase == Phase.RUNNING
                           else self._commands.get())
            except queue.Empty:
                command = None
            if self._ending.is_set():
                return command
            if command is not None:
                self._handle(command)
            elif self.phase == Phase.RUNNING:
                self._train_chunk()
                time.sleep(0)  # hand the GIL to the GUI thread if it is waiting

    def _handle(self, command: rs.Command) -> None:
        if isinstance(command, rs.Save):
            self._settle(command, allows(self.phase, command))
            return
        if isinstance(command, rs.Stop):
            self._interrupt.clear()
        if not allows(self.phase, command):
            return  # e.g. a Pause that arrived after the run finished
        if isinstance(command, rs.Resume):
            if self.backend.finished:
                return
            self._seconds_per_step = None  # re-measure: the machine may have changed
            self._diverged = False
        if isinstance(command, (rs.Pause, rs.Resume, rs.Stop)):
            self._move(command)
        elif isinstance(command, rs.Sample):
            self._sample(command)
        elif isinstance(command, rs.TakeSnapshot):
            self._send_snapshot()
        elif isinstance(command, rs.Extend):
            self._extend(command.num_steps)

    def _sample(self, command: rs.Sample) -> None:
        self.call = f"sampling {command.num_samples} names"
        try:
            names = self.backend.sample(command.num_samples, command.temperature, command.seed,
                                        prefix=command.prefix or "", cancel=self._interrupt.is_set,
                                        max_length=command.max_length)
        except engine.Cancelled:
            self._emit(rs.Status("Sampling cancelled"))
            return
        except Exception as exc:
            self._emit(rs.Error(f"sampling failed: {_message(exc)}", engine.error_details(exc)))
            return
        finally:
            self.call = ""
        self._emit(rs.Samples(names, self.backend.step, command.prefix))

    def _extend(self, num_steps: int) -> None:
        """Continue to num_steps: the backend reopened with the longer schedule (as a
        checkpoint resumed with num_steps); on failure the run stays as it was."""
        if num_steps != self.backend.train_config.num_steps:
            self.call = f"reopening the backend for {num_steps:,} steps"
            self._emit(rs.Status(f"Continuing to {num_steps:,} steps: reopening the {self.backend.name} backend..."))
            try:
                extended = extend_backend(self.backend, num_steps)
            except Exception as exc:
                self._emit(rs.Error(f"cannot continue to {num_steps:,} steps: {_message(exc)}",
                                    engine.error_details(exc)))
                return
            finally:
                self.call = ""
            old, self.backend = self.backend, extended
            self._close(old)
        self._emit(rs.Extended(num_steps))

    def _send_snapshot(self) -> None:
        started = time.perf_counter()
        try:
            snapshot = Snapshot.from_backend(self.backend)
        except MemoryError:  # the panels are a view: training goes on without them
            self._emit(rs.Status("Not enough memory for a copy of the parameters to inspect"))
            return
        except Exception as exc:  # e.g. a backend left unusable by a failed call
            self._emit(rs.Status(f"Cannot inspect the parameters: {_message(exc)}"))
            return
        self._snapshot_cost = time.perf_counter() - started
        self._emit(rs.SnapshotReady(snapshot))

    def _maybe_send_snapshot(self) -> None:
        """After a chunk: a snapshot when wanted, at most every SNAPSHOT_INTERVAL_S and
        never more than SNAPSHOT_SHARE of the time (a large model's copy is slow)."""
        now = time.monotonic()
        if not self._snapshots_wanted.is_set() or now < self._next_snapshot:
            return
        self._send_snapshot()
        spacing = max(SNAPSHOT_INTERVAL_S, self._snapshot_cost / SNAPSHOT_SHARE)
        self._next_snapshot = time.monotonic() + spacing

    def _save(self, command: rs.Save) -> None:
        self.call = SAVING
        try:
            engine.save_checkpoint(command.path, self.backend)
        except Exception as exc:
            self._emit(rs.Error(f"could not save the checkpoint {command.path}: {_message(exc)}",
                                engine.error_details(exc)))
            return
        finally:
            self.call = ""
        self._emit(rs.Saved(str(command.path), self.backend.step, command.autosave))

    def _write_queued_saves(self, taken: rs.Command | None = None) -> None:
        """Ending: checkpoints asked for (`taken`, the command the loop had taken
        when the end came, and those still queued) are still written; the rest is
        dropped."""
        commands = [taken] if taken is not None else []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                break
        for command in commands:
            if isinstance(command, rs.Save):
                self._settle(command, True)

    def _settle(self, command: rs.Save, write: bool) -> None:
        """A checkpoint asked for, written (or refused: not in this phase), and counted."""
        try:
            if write:
                self._save(command)
        finally:
            self._saves_settled += 1

    def _train_chunk(self) -> None:
        backend = self.backend
        first = backend.step
        self.call = f"training (step {first + 1:,}, {self._k:,} per call)"
        started = time.perf_counter()
        try:
            losses = backend.train(self._k)
        except engine.TrainingDiverged as exc:
            self.step = backend.step
            self._emit(rs.Losses(self.loss_history()[first:], first, float("nan")))
            self._move(rs.Stop())
            self._diverged = True
            self._emit(rs.Diverged(exc.step))
            self._emit(rs.Error(str(exc)))
            return
        except MemoryError:
            self._evaluating = False  # the error says what to do; an evaluation would only add to it
            self._move(rs.Stop())
            self._emit(rs.Error("out of memory: choose a smaller model (preset) and train again"))
            return
        except Exception as exc:
            self._evaluating = False  # e.g. a Futhark call that used up the weights
            self._move(rs.Stop())
            self._emit(rs.Error(f"training failed: {_message(exc)}", engine.error_details(exc)))
            return
        finally:
            self.call = ""
        elapsed = time.perf_counter() - started
        self.train_seconds += elapsed
        self.step = backend.step
        if len(losses):
            self._emit(rs.Losses(losses, first, elapsed))
            self._adapt_chunk(elapsed / len(losses))
        self._holdout.trained(elapsed)
        self._evaluate(finished=backend.finished)
        if backend.finished:
            self._move(rs.Finished())
        else:
            self._maybe_send_snapshot()

    def _evaluate(self, finished: bool) -> None:
        """The held-out loss, when the schedule says it is due (after a chunk within
        its share of the training time, and once at the end), reported as Heldout."""
        if not self._evaluating or self.backend is None or not self._first_evaluation_affordable(finished):
            return
        self.call = "evaluating the held-out loss"
        try:
            loss = evaluate_if_due(self.backend, self._holdout, finished, cancel=self._evaluation_cancelled)
        except engine.Cancelled:  # a command came: it goes first, the evaluation comes again later
            return
        except MemoryError:
            self._evaluating = False
            self._emit(rs.Status("Not enough memory to evaluate the held-out loss: training goes on without it"))
            return
        except Exception as exc:  # training goes on: the held-out curve is a view of it
            self._evaluating = False
            self._emit(rs.Status(f"Cannot evaluate the held-out loss: {_message(exc)}"))
            return
        finally:
            self.call = ""
        if loss is not None:
            self._emit(rs.Heldout((self.backend.heldout_history[-1],)))

    def _heldout_current(self) -> bool:
        """Whether the held-out curve needs no point at this step: it has one (a
        checkpoint's, or evaluated), nothing is held out, or the run diverged."""
        b = self.backend
        history = b.heldout_history
        return self._diverged or b.holdout == 0 or bool(history and history[-1].step == b.step)

    def _evaluation_cancelled(self) -> bool:
        """An evaluation gives way to any command (Pause, Stop, Save, Sample, End):
        a large model's held-out pass can take minutes."""
        return self._ending.is_set() or not self._commands.empty()

    def _first_evaluation_affordable(self, finished: bool) -> bool:
        """The schedule evaluates first after one chunk; here not before its guessed
        cost fits in the schedule's share (a large model's first chunk is one step)."""
        schedule = self._holdout
        if finished or schedule.evaluations:
            return True
        if self._seconds_per_step is None:
            return False
        guess = evaluation_estimate(self.backend.split, self._seconds_per_step)
        return guess <= schedule.share * schedule.train_seconds

    def _adapt_chunk(self, seconds_per_step: float) -> None:
        """Choose k so the next call takes about TARGET_CHUNK_S (growing at most 2x)."""
        if self._seconds_per_step is None:
            self._seconds_per_step = seconds_per_step
        else:  # smooth out single slow chunks (another process, a GC pause)
            self._seconds_per_step = 0.7 * self._seconds_per_step + 0.3 * seconds_per_step
        ideal = int(TARGET_CHUNK_S / max(self._seconds_per_step, 1e-7))
        self._k = max(1, min(ideal, 2 * self._k, MAX_STEPS_PER_CHUNK))

    def _move(self, trigger) -> None:
        """The next phase by engine.training.run_model's table, reported."""
        self.phase = next_phase(self.phase, trigger)
        self._emit(rs.PhaseChanged(self.phase))
        if (self.phase in (Phase.READY, Phase.PAUSED, Phase.DONE) and self.backend is not None
                and self._snapshots_wanted.is_set()):
            self._send_snapshot()  # the parameters training stopped at


def _message(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
