"""The one training loop, Qt-free: commands in (`send`), events out (`emit`).

A TrainingLoop opens one backend (fresh, or from a checkpoint) in the thread
that calls `run()`, trains it in chunks of `backend.train(k)` calls, and
reports everything as engine.training.protocol events through the `emit`
callable it was given. The window's worker, `microgpt-gui demo`, `bench`,
`bench --to-loss` and sweep trials all drive this one loop.

    loop = TrainingLoop(RunSpec("numpy", corpus, model, train), print,
                        LoopSettings(end_when_finished=True))
    loop.run()  # trains to the last step, evaluates the held-out loss, closes

The interface (agreed with the sweep runner; fields are only ever added):
- `send(command)` from any thread, also from inside `emit`; it never waits.
  A command takes effect between calls into the backend: after the current
  chunk (about `target_chunk_s`, or one step of a large model), an opening or
  a save that cannot be cut short. Stop and End also cancel a sample in
  progress at once; any command cancels a held-out evaluation between batches.
- `run()` in the thread that owns the backend (Futhark contexts are not
  thread-safe): it opens, trains and closes it, and returns after End; at
  once when opening failed; with `end_when_finished`, also once the run is no
  longer training (finished, diverged, failed, stopped by its chunk plan or
  by Stop) and no command is waiting. Its last event is always Closed.
- Snapshots readable from other threads without waiting: `phase`, `call`
  (the long call the loop is inside, "" between calls; SAVING while a
  checkpoint is written), `step`, `train_seconds` (time inside train() calls:
  the autosave clock and the ms/step figure), `steps_per_chunk`,
  `loss_history()`, `saves_pending` (a Save sent is not yet written or
  refused, and the loop has not closed).
- Phases move by engine.training.run_model's TRANSITIONS (the loop's own:
  opening, ready, running, paused, done, failed), each reported by
  PhaseChanged. End does not move the phase (stopping and none are the
  window's); Closed follows the backend's closing.
- A Save queued before End(serve_saves=True), or before an
  end_when_finished run ends, is always written, even one the loop had just
  taken off the queue when End came.

Extensions beyond the first agreed interface: LoopSettings' `heldout`,
`heldout_share`, `delay_first_evaluation`, `chunk_steps` (a caller's own
chunking, as bench and demo time theirs), `autosave`, `opener`, `clock` and
`report_builds` (a Futhark library built while the loop opens its backend is
named by `call` and reported by Status events, as the window shows it);
`saves_pending`;
Error events carry the exception (`Error.exception`), so a command line can
report it as it always did.

Held-out evaluation follows engine.training.heldout's HoldoutSchedule (within
a share of the training time, and at the end); a stopped run's held-out loss
is brought up to its step while the loop waits for commands.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import Cancelled, TrainingDiverged, error_details
from . import protocol as rs
from .heldout import EVAL_SHARE, HeldoutPoint, HoldoutSchedule, evaluate_if_due, evaluation_estimate
from .protocol import RunInfo, RunSpec
from .run_model import Phase, allows, extend_backend, next_phase

SAVING = "saving the checkpoint"  # `call` while a checkpoint is written


def open_runner(spec: RunSpec):
    """The engine's backend for spec: resumed from its checkpoint, or fresh."""
    from ..backends import load_checkpoint, open_backend  # the registry imports every backend

    if spec.checkpoint is not None:
        return load_checkpoint(spec.checkpoint, backend=spec.backend)
    return open_backend(spec.backend, spec.model, spec.train, spec.corpus)


@dataclass(frozen=True)
class LoopSettings:
    target_chunk_s: float = 0.05      # each backend.train(k) call takes about this long
    max_steps_per_chunk: int = 4096
    end_when_finished: bool = False   # headless callers: run() returns once the run stops training
    heldout: bool = True              # evaluate the held-out loss on its schedule (bench's timing: no)
    heldout_share: float = EVAL_SHARE  # of the training time, at most, for evaluations
    # the first evaluation not before its guessed cost fits the share (a large model's
    # first chunk is one step); False: after the first chunk, as the schedule alone says
    delay_first_evaluation: bool = True
    # While snapshots are wanted (WantSnapshots), one after a chunk at most this often,
    # and never costing more than snapshot_share of the training time
    snapshot_interval_s: float = 0.25
    snapshot_share: float = 0.05
    # autosave(step, train_seconds) after each chunk: a path to save to now
    # (Saved(..., autosave=True) follows), or None
    autosave: Callable[[int, float], str | None] | None = None
    # chunk_steps(loop) before each chunk: steps for the next train(k) call, or 0 to stop
    # training here (the run is done, as by Stop, after a final held-out evaluation);
    # None: k adapts so that a call takes about target_chunk_s
    chunk_steps: Callable[["TrainingLoop"], int] | None = None
    opener: Callable[[RunSpec], object] = open_runner  # the backend (or a runner like it) for a spec
    clock: Callable[[], float] = time.perf_counter
    # a Futhark library built on first use while opening (tens of seconds): named by `call`,
    # its start and end reported as Status (engine.futhark.build's announcements)
    report_builds: bool = False
    # names seen (steps x batch size) at which a chunk ends and the held-out loss is
    # evaluated whatever the schedule says: a sweep's ASHA rungs, so that trials are
    # compared on losses measured there, not thousands of steps before
    heldout_at_names: tuple[int, ...] = ()


class TrainingLoop:
    """The one training loop, Qt-free: commands in (send), events out (emit)."""

    def __init__(self, spec: RunSpec, emit: Callable[[rs.Event], None], settings: LoopSettings = LoopSettings()):
        self.spec, self.settings = spec, settings
        self._emit_to = emit
        # The backend: for code in the loop's own thread only (inside emit, or a chunk plan)
        self.backend = None
        self.phase = Phase.OPENING
        self.call = ""             # the long call the loop is inside ("" between calls)
        self.step = 0              # steps trained so far, as of the last finished call
        self.train_seconds = 0.0   # time spent inside train() calls
        self.holdout_schedule = HoldoutSchedule(settings.heldout_share)  # evaluations so far, and their time
        self._commands: queue.Queue = queue.Queue()
        self._interrupt = threading.Event()  # Stop or End: cancel a sample in progress
        self._ending = threading.Event()     # End: close the backend and return
        self._serve_saves = True             # when ending: still write queued checkpoints
        self._saves_taken: list[rs.Save] = []  # Saves taken off the queue as End came
        self._k = 1
        self._seconds_per_step: float | None = None
        self._snapshots_wanted = threading.Event()
        self._next_snapshot = 0.0  # time.monotonic() after which the next snapshot may be taken
        self._snapshot_cost = 0.0
        self._evaluating = settings.heldout  # False once an evaluation failed: training goes on
        self._diverged = False  # a diverged run's parameters are not evaluated
        # Saves sent, and those written or refused: each count has one writer thread
        self._saves_sent = 0     # the sender's (send)
        self._saves_settled = 0  # the loop's
        self._closed = False     # run() has returned: nothing more is written

    # from any thread (never waits) ------------------------------------------------------
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
        self._commands.put(command)  # an End wakes a loop waiting for commands

    def loss_history(self) -> np.ndarray:
        """A copy of the run's losses so far, taken without waiting for the loop
        (empty before the backend opens and after it closes)."""
        backend = self.backend
        history = getattr(backend, "loss_history", None) if backend is not None else None
        return history if history is not None else np.empty(0, dtype=np.float32)

    @property
    def steps_per_chunk(self) -> int:
        return self._k

    @property
    def saves_pending(self) -> bool:
        """A Save sent is not written yet (queued, or being written); False once
        run() has returned (an End that did not serve saves dropped them)."""
        return not self._closed and self._saves_sent > self._saves_settled

    @property
    def seconds_per_step(self) -> float | None:
        """The training speed measured so far (smoothed), or None before a chunk."""
        return self._seconds_per_step

    # the loop's thread -------------------------------------------------------------------
    def run(self) -> None:
        """Open, train and close the backend (see the module's docstring)."""
        try:
            self._run()
        finally:
            self.call = ""
            self._closed = True
            self._emit(rs.Closed())

    def _emit(self, event: rs.Event) -> None:
        self._emit_to(event)

    def _run(self) -> None:
        try:
            self.backend = self._open()
        except Exception as exc:  # compile failure, bad checkpoint, out of memory...
            if not self._ending.is_set():
                self._move(rs.Failed())
                self._emit(rs.Error(_message(exc), error_details(exc), exc))
            return
        try:
            b = self.backend
            if self._ending.is_set():  # ended while it was opening: nobody waits for it
                return
            if self._evaluating and (prepare := getattr(b, "prepare_heldout", None)) is not None:
                prepare()
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
            self._serve()
            if self._serve_saves:
                self._write_queued_saves()
        finally:
            self.call = "closing the backend"
            self._close(self.backend)
            self.backend = None  # its memory goes now, not when the caller lets go of the loop

    def _open(self):
        spec = self.spec
        self.call = f"opening the {spec.backend} backend"
        self._emit(rs.Status(f"Opening backend {spec.backend} (a compiled backend builds its kernels "
                             "on first use; that can take a while)..."))
        remove = self._listen_to_builds() if self.settings.report_builds else None
        try:
            return self.settings.opener(spec)
        finally:
            if remove is not None:
                remove()
            self.call = ""

    def _listen_to_builds(self) -> Callable[[], None]:
        """Report the builds this thread starts (not another run's) until the returned
        callable is called."""
        from ..futhark.build import add_build_listener

        opener = threading.get_ident()

        def on_build(event) -> None:
            if threading.get_ident() != opener:
                return
            self.call = (f"building {event.backend} (first use, {event.estimate})" if event.phase == "start"
                         else f"opening the {self.spec.backend} backend")  # the Status says from what
            self._emit(rs.Status(event.message()))

        return add_build_listener(on_build)

    @staticmethod
    def _close(backend) -> None:
        if backend is None:
            return
        try:
            backend.close()
        except Exception:  # closing must not stop the loop from ending
            pass

    def _serve(self) -> None:
        """Commands and chunks until End (or, with end_when_finished, until the run
        stops training and no command waits)."""
        while not self._ending.is_set():
            if self.phase == Phase.DONE and self._commands.empty() and not self._heldout_current():
                # a stopped run's held-out loss where it ended, or a finished run's whose
                # last evaluation a command cut short
                self._evaluate(finished=True)
            if self.settings.end_when_finished and self.phase == Phase.DONE and self._commands.empty():
                return
            try:
                command = (self._commands.get_nowait() if self.phase == Phase.RUNNING
                           else self._commands.get())
            except queue.Empty:
                command = None
            if self._ending.is_set():
                if isinstance(command, rs.Save):  # taken just as End came: still the user's to have
                    self._saves_taken.append(command)
                return
            if command is not None:
                self._handle(command)
            elif self.phase == Phase.RUNNING:
                self._train_chunk()
                if threading.active_count() > 1:
                    time.sleep(0)  # hand the GIL to another thread (a window's) if it is waiting

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
            self._k = 1  # the first step at once; the chunk grows to its length from there
            self._diverged = False
        if isinstance(command, (rs.Pause, rs.Resume, rs.Stop)):
            self._move(command)
        elif isinstance(command, rs.Sample):
            self._sample(command)
        elif isinstance(command, rs.TakeSnapshot):
            self._send_snapshot()
        elif isinstance(command, rs.Extend):
            self._extend(command.num_steps)

    # training ------------------------------------------------------------------------------
    def _next_chunk(self) -> int:
        plan = self.settings.chunk_steps
        return self._k if plan is None else int(plan(self))

    def _next_heldout_step(self) -> int | None:
        """The first step after this one at which heldout_at_names asks for an evaluation."""
        if not self.settings.heldout_at_names:
            return None
        batch, step = self.backend.train_config.batch_size, self.backend.step
        steps = [-(-int(names) // batch) for names in self.settings.heldout_at_names]
        return min((s for s in steps if s > step), default=None)

    def _train_chunk(self) -> None:
        k = self._next_chunk()
        if k <= 0:  # the caller's plan stops the run here
            self._evaluate(finished=True)
            self._move(rs.Stop())
            return
        self._k = k  # the pace's; a chunk cut short at an evaluation step does not shrink it
        backend, clock = self.backend, self.settings.clock
        first = backend.step
        at = self._next_heldout_step()
        if at is not None:
            k = min(k, at - first)
        self.call = f"training (step {first + 1:,}, {k:,} per call)"
        started = clock()
        try:
            losses = backend.train(k)
        except TrainingDiverged as exc:
            self.step = backend.step
            self._emit(rs.Losses(self.loss_history()[first:], first, float("nan")))
            self._move(rs.Stop())
            self._diverged = True
            self._emit(rs.Diverged(exc.step))
            self._emit(rs.Error(str(exc), "", exc))
            return
        except MemoryError as exc:
            self._evaluating = False  # the error says what to do; an evaluation would only add to it
            self._move(rs.Stop())
            self._emit(rs.Error("out of memory: choose a smaller model (preset) and train again", "", exc))
            return
        except Exception as exc:
            self._evaluating = False  # e.g. a Futhark call that used up the weights
            self._move(rs.Stop())
            self._emit(rs.Error(f"training failed: {_message(exc)}", error_details(exc), exc))
            return
        finally:
            self.call = ""
        elapsed = clock() - started
        self.train_seconds += elapsed
        self.step = backend.step
        if len(losses):
            self._emit(rs.Losses(losses, first, elapsed))
            self._measured(elapsed / len(losses))
        self.holdout_schedule.trained(elapsed)
        self._evaluate(finished=backend.finished or backend.step == at)
        self._maybe_autosave()
        if backend.finished:
            self._move(rs.Finished())
        else:
            self._maybe_send_snapshot()

    def _measured(self, seconds_per_step: float) -> None:
        """Smooth the pace (a single slow chunk: another process, a GC pause) and,
        without a chunk plan, choose k so the next call takes about target_chunk_s
        (growing at most 2x a chunk)."""
        if self._seconds_per_step is None:
            self._seconds_per_step = seconds_per_step
        else:
            self._seconds_per_step = 0.7 * self._seconds_per_step + 0.3 * seconds_per_step
        if self.settings.chunk_steps is None:
            ideal = int(self.settings.target_chunk_s / max(self._seconds_per_step, 1e-7))
            self._k = max(1, min(ideal, 2 * self._k, self.settings.max_steps_per_chunk))

    def _maybe_autosave(self) -> None:
        hook = self.settings.autosave
        if hook is None:
            return
        path = hook(self.step, self.train_seconds)
        if path is not None:
            self._save(rs.Save(str(path), autosave=True))

    # held-out evaluation -------------------------------------------------------------------
    def _evaluate(self, finished: bool) -> None:
        """The held-out loss, when the schedule says it is due (after a chunk within
        its share of the training time, and once at the end), reported as Heldout.
        finished: evaluate now (the end of the run, or a step of heldout_at_names)."""
        if not self._evaluating or self.backend is None or not self._first_evaluation_affordable(finished):
            return
        self.call = "evaluating the held-out loss"
        try:
            loss = evaluate_if_due(self.backend, self.holdout_schedule, finished, self.settings.clock,
                                   cancel=self._evaluation_cancelled)
        except Cancelled:  # a command came: it goes first, the evaluation comes again later
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
            self._emit(rs.Heldout((HeldoutPoint(self.backend.step, loss),)))

    def _heldout_current(self) -> bool:
        """Whether the held-out curve needs no point at this step: it has one (a
        checkpoint's, or evaluated), nothing is held out, evaluation is off or
        failed, or the run diverged."""
        b = self.backend
        if self._diverged or not self._evaluating or b.holdout == 0:
            return True
        history = b.heldout_history
        return bool(history and history[-1].step == b.step)

    def _evaluation_cancelled(self) -> bool:
        """An evaluation gives way to any command (Pause, Stop, Save, Sample, End):
        a large model's held-out pass can take minutes."""
        return self._ending.is_set() or not self._commands.empty()

    def _first_evaluation_affordable(self, finished: bool) -> bool:
        """Without delay_first_evaluation, the schedule's word; with it, the first
        evaluation waits until its guessed cost fits in the schedule's share."""
        schedule = self.holdout_schedule
        if finished or schedule.evaluations or not self.settings.delay_first_evaluation:
            return True
        if self._seconds_per_step is None:
            return False
        guess = evaluation_estimate(self.backend.split, self._seconds_per_step)
        return guess <= schedule.share * schedule.train_seconds

    # requests ------------------------------------------------------------------------------
    def _sample(self, command: rs.Sample) -> None:
        self.call = f"sampling {command.num_samples} names"
        try:
            names = self.backend.sample(command.num_samples, command.temperature, command.seed,
                                        prefix=command.prefix or "", cancel=self._interrupt.is_set,
                                        max_length=command.max_length)
        except Cancelled:
            self._emit(rs.Status("Sampling cancelled"))
            return
        except Exception as exc:
            self._emit(rs.Error(f"sampling failed: {_message(exc)}", error_details(exc), exc))
            return
        finally:
            self.call = ""
        self._emit(rs.Samples(names, self.backend.step, command.prefix))

    def _save(self, command: rs.Save) -> None:
        from .checkpoint import save_checkpoint

        self.call = SAVING
        try:
            save_checkpoint(command.path, self.backend)
        except Exception as exc:
            self._emit(rs.Error(f"could not save the checkpoint {command.path}: {_message(exc)}",
                                error_details(exc), exc))
            return
        finally:
            self.call = ""
        self._emit(rs.Saved(str(command.path), self.backend.step, command.autosave))

    def _write_queued_saves(self) -> None:
        """Ending: checkpoints asked for are still written (one taken off the queue as
        End came, then the queue's, in order); every other request is dropped."""
        taken, self._saves_taken = self._saves_taken, []
        for command in taken:
            self._settle(command, True)
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, rs.Save):
                self._settle(command, True)

    def _settle(self, command: rs.Save, write: bool) -> None:
        """A Save sent, written (or refused: not in this phase), and counted."""
        try:
            if write:
                self._save(command)
        finally:
            self._saves_settled += 1

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
                                    error_details(exc), exc))
                return
            finally:
                self.call = ""
            old, self.backend = self.backend, extended
            self._close(old)
        self._emit(rs.Extended(num_steps))

    # snapshots (the inspect panels) -----------------------------------------------------------
    def _send_snapshot(self) -> None:
        from ..model.introspect import Snapshot

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
        """After a chunk: a snapshot when wanted, at most every snapshot_interval_s and
        never more than snapshot_share of the time (a large model's copy is slow)."""
        now = time.monotonic()
        if not self._snapshots_wanted.is_set() or now < self._next_snapshot:
            return
        self._send_snapshot()
        spacing = max(self.settings.snapshot_interval_s, self._snapshot_cost / self.settings.snapshot_share)
        self._next_snapshot = time.monotonic() + spacing

    def _move(self, trigger) -> None:
        """The next phase by engine.training.run_model's table, reported."""
        self.phase = next_phase(self.phase, trigger)
        self._emit(rs.PhaseChanged(self.phase))
        if (self.phase in (Phase.READY, Phase.PAUSED, Phase.DONE) and self.backend is not None
                and self._snapshots_wanted.is_set()):
            self._send_snapshot()  # the parameters training stopped at


def _message(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
