"""One sweep trial, in a Ray worker: the engine's own training loop
(engine.training.loop.TrainingLoop) on one backend, reporting to Tune.

The loop runs in a thread of its own (it opens, trains and closes the backend
there); this function's thread turns the loop's events into Tune reports:
one per chunk of training (its losses, as block means) carrying the newest
held-out loss, the metric ASHA and the searcher compare. A chunk is reported
when the next one's losses arrive, so a held-out evaluation made after it
goes with it. Where ASHA's rungs count names seen, the loop ends a chunk at
each rung and evaluates there, and the rung's report waits for it: ASHA
compares trials on losses measured at the rung (the schedule alone spaces
evaluations by time, thousands of steps apart for a small model).
Checkpoints are the project's own (engine.training.checkpoint,
written by the loop on a Save command) in a Tune checkpoint directory, at
ASHA's rungs, every checkpoint_every_s and at the end, so any trial's model
loads, samples and trains on in the window, and a resumed sweep continues
an unfinished trial where its last checkpoint was.

A trial holds `cpus` CPUs and trains on that many threads: OpenBLAS's count,
and engine.backends.numpy_backend.CPUS_ENV, which bounds the Adam threads and
futhark-multicore's thread count.

Ending: a finished or diverged run reports once more and returns; an error
(a bad combination of fields, a backend that cannot run here, out of memory)
raises TrialFailed with its message, which Tune records without ending the
sweep. When Tune stops the trial (ASHA, Stop, the budget), its report call
exits the thread; the loop is then ended and joined.
"""
from __future__ import annotations

import json
import math
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .events import block_means
from .spec import run_configs

CHECKPOINT_FILE = "model.npz"    # the project's checkpoint, in a Tune checkpoint directory
TRIAL_STATE_FILE = "trial.json"  # what the checkpoint does not hold: the training seconds so far
JOIN_S = 30.0                    # how long an ending trial waits for its loop's thread
_CLOSED = object()               # put on the event queue when the loop's run() has returned
# A trial's evaluations may take this share of its training time (a window's run: a tenth):
# the held-out loss is what ASHA and the searcher compare, so it is measured more often.
HELDOUT_SHARE = 0.25
# Chunks shorter than this share of report_every_s (the loop's first chunks, one step and
# doubling) go into one report with the next
MIN_REPORT_SHARE = 0.5
SAVE_FAILED = "could not save the checkpoint"  # how the loop's Error for a failed Save begins


class TrialFailed(RuntimeError):
    """A trial that cannot go on; the message says why (shown in the trial table)."""


@dataclass(frozen=True)
class TrialBase:
    """What every trial of a sweep shares (sent once through Ray's object store)."""

    run: dict                    # the [run] table: fixed fields
    docs: tuple                  # the dataset, in training order (nodes need no copy of the file)
    chars: tuple
    cpus: int = 1
    report_every_s: float = 0.5
    checkpoint_every_s: float = 60.0
    milestones: tuple = ()       # ASHA's rungs, in time_attr units: a checkpoint where each is crossed
    time_attr: str = "names_seen"


def limit_threads(cpus: int) -> None:
    """One thread per CPU the trial holds: OpenBLAS, Adam's pool, futhark-multicore."""
    from ..backends.blas import set_blas_threads
    from ..backends.numpy_backend import CPUS_ENV

    os.environ[CPUS_ENV] = str(cpus)
    set_blas_threads(cpus)


def run_trial(config: dict, base: TrialBase) -> None:
    """Tune's function trainable: config is the sampled fields."""
    from ray import tune

    settings = {**base.run, **config}
    try:
        backend, model, train = run_configs(settings)
    except ValueError as exc:
        raise TrialFailed(f"these settings make no run: {exc}") from None
    limit_threads(base.cpus)
    import ray

    reporter = Reporter(base, tune.report, lambda path: tune.Checkpoint.from_directory(path),
                        node=ray.get_runtime_context().get_node_id())
    reporter.run(_open_spec(backend, model, train, base, tune.get_checkpoint(), reporter))


def _open_spec(backend, model, train, base: TrialBase, checkpoint, reporter: "Reporter"):
    from ..data.corpus import Corpus
    from ..training.checkpoint import read_checkpoint
    from ..training.protocol import RunSpec

    if checkpoint is not None:  # a resumed sweep: on from this trial's last checkpoint
        with checkpoint.as_directory() as folder:
            ck = read_checkpoint(Path(folder) / CHECKPOINT_FILE)
            state = Path(folder) / TRIAL_STATE_FILE
            if state.exists():
                reporter.train_seconds = float(json.loads(state.read_text())["train_seconds"])
        return RunSpec(backend, checkpoint=ck)
    corpus = Corpus.from_training_order(list(base.docs), list(base.chars))
    return RunSpec(backend, corpus, model, train)


class Reporter:
    """Turns a TrainingLoop's events into Tune reports (see the module's docstring).

    report(metrics, checkpoint=None) and make_checkpoint(folder) are Tune's (tests of
    the reporting itself may pass their own)."""

    def __init__(self, base: TrialBase, report, make_checkpoint, clock=time.monotonic, node: str = ""):
        self.base, self._report, self._make_checkpoint, self._clock = base, report, make_checkpoint, clock
        self.node = node  # the Ray node it runs on (its id)
        self.events: queue.Queue = queue.Queue()
        self.loop = None
        self.batch_size = 1
        self.num_steps = 0
        self.step = 0
        self.train_seconds = 0.0
        self.heldout_loss: float | None = None  # the newest evaluation
        self.finished = self.diverged = False
        self.error = ""
        self._losses: list[float] = []   # the pending report's losses
        self._first = 0                  # ...from this step
        self._new_heldout: list = []     # ...and its new held-out points
        self._pending = False            # a chunk waits to be reported
        self._pending_s = 0.0            # ...of this many seconds of training
        self._end_reported = False       # a report said finished or diverged
        self._replaying = False          # a checkpoint's history is coming (a resumed trial)
        self._heldout_step = -1          # the step of the newest held-out evaluation
        self._finishing = False          # trained to the end; waiting for its last evaluation
        self._save_dir: str | None = None  # a Save sent, its Saved not come yet
        self._last_checkpoint = clock()
        self._milestones = sorted(base.milestones)
        self._save_after_heldout: int | None = None  # a rung's checkpoint waits for its evaluation

    # the loop ---------------------------------------------------------------
    def run(self, spec) -> None:
        from ..training.loop import LoopSettings, TrainingLoop
        from ..training.protocol import End

        settings = LoopSettings(target_chunk_s=self.base.report_every_s, heldout_share=HELDOUT_SHARE,
                                heldout_at_names=self._rungs_in_names())
        self.loop = TrainingLoop(spec, self.events.put, settings)
        thread = threading.Thread(target=self._run_loop, name="trial-loop", daemon=True)
        thread.start()
        try:
            self._drain()
        finally:
            self.loop.send(End(serve_saves=True))
            thread.join(JOIN_S)
            if self._save_dir is not None:
                shutil.rmtree(self._save_dir, ignore_errors=True)
        if self.error and not self.diverged:
            raise TrialFailed(self.error)

    def _run_loop(self) -> None:
        try:
            self.loop.run()
        except Exception as exc:  # a bug: the trial fails with it, the sweep goes on
            self.error = f"the training loop failed: {type(exc).__name__}: {exc}"
        finally:
            self.events.put(_CLOSED)

    def _drain(self) -> None:
        from ..training import protocol as rs

        while True:
            event = self.events.get()
            if event is _CLOSED:
                self._final_report()
                return
            if isinstance(event, rs.Opened):
                info = event.info
                self.batch_size, self.num_steps, self.step = info.train.batch_size, info.train.num_steps, info.step
                self._first = info.step
                self._replaying = info.step > 0
                if info.holdout == 0:
                    self.error = "the run holds out no documents: a sweep needs a held-out loss"
                    self._end_loop()
            elif isinstance(event, rs.Losses):
                if self._replaying:
                    continue  # a checkpoint's history: reported before it was saved
                if self._save_after_heldout is not None:  # the rung's evaluation did not come
                    self._save_after_heldout = None
                    self._save()
                if self._report_due():
                    self._flush()
                self._add_losses(event)
            elif isinstance(event, rs.PhaseChanged):
                self._replaying = False
                if event.phase == "done" and self.step >= self.num_steps and not self.finished:
                    self._finish_when_evaluated()
            elif isinstance(event, rs.Heldout):
                self._add_heldout(event)
                if self._save_after_heldout is not None and self._heldout_step >= self._save_after_heldout:
                    self._save_after_heldout = None
                    self._save()
                if self._finishing and self._heldout_step >= self.step:
                    self._finish()
            elif isinstance(event, rs.Status) and self._finishing:
                self._finish()  # e.g. "Cannot evaluate the held-out loss": no evaluation is coming
            elif isinstance(event, rs.Saved):
                self._flush(checkpoint=True)
            elif isinstance(event, rs.Finished) and not self.finished:
                self._finish_when_evaluated()
            elif isinstance(event, rs.Diverged):
                self.diverged = True
                self._end_loop()
            elif isinstance(event, rs.Error):
                if self._save_dir is not None and event.message.startswith(SAVE_FAILED):
                    print(f"trial: {event.message}; training goes on", file=sys.stderr, flush=True)
                    self._drop_save()
                elif not self.diverged:
                    self.error = event.message
                    self._end_loop()
            elif isinstance(event, rs.Failed):
                self.error = self.error or "the run could not be opened"
                self._end_loop()

    def _report_due(self) -> bool:
        """A pending chunk goes out when the next comes, unless a checkpoint is being
        written for it or it is too short to be worth a report of its own."""
        return (self._pending and self._save_dir is None
                and self._pending_s >= MIN_REPORT_SHARE * self.base.report_every_s)

    def _finish_when_evaluated(self) -> None:
        """The run trained its last step: finish once its held-out loss is evaluated there
        (a Save sent meanwhile cuts the loop's last evaluation short; the loop makes it
        again once the Save is written, while nothing else waits)."""
        self._finishing = True
        if self._heldout_step >= self.step:
            self._finish()

    def _finish(self) -> None:
        """The run trained its last step (and the loop evaluated it): the final checkpoint,
        then the loop ends."""
        if self.finished:
            return
        self.finished = True
        self._save()
        self._end_loop()

    def _end_loop(self) -> None:
        from ..training.protocol import End

        self.loop.send(End(serve_saves=True))

    # reports ------------------------------------------------------------------
    def _add_losses(self, event) -> None:
        if not self._losses:
            self._first = event.first_step
        self._losses.extend(float(x) for x in event.losses)
        self.step = event.first_step + len(event.losses)
        if not math.isnan(event.seconds):  # NaN: a diverged chunk's, not timed
            self.train_seconds += event.seconds
            self._pending_s += event.seconds
        self._pending = True
        if self._checkpoint_due():
            self._save()

    def _add_heldout(self, event) -> None:
        points = list(event.points)
        if event.replacing:  # a checkpoint's history: its newest is where the trial stands
            if points:
                self.heldout_loss, self._heldout_step = points[-1].loss, int(points[-1].step)
            return
        for point in points:
            self._new_heldout.append([int(point.step), float(point.loss)])
            self.heldout_loss = float(point.loss)
            self._heldout_step = int(point.step)

    def _rungs_in_names(self) -> tuple[int, ...]:
        """ASHA's rungs where the loop evaluates the held-out loss (LoopSettings.heldout_at_names):
        all of them when they count names seen; none when they count seconds."""
        if self.base.time_attr != "names_seen":
            return ()
        return tuple(math.ceil(m) for m in self.base.milestones)

    def _checkpoint_due(self) -> bool:
        """Whether to save now: a rung crossed (counted in seconds; a rung counted in names
        saves once the loop's evaluation there has come, so that the report ASHA compares at
        the rung carries it), or checkpoint_every_s since the last checkpoint."""
        if self._save_dir is not None or self.heldout_loss is None and not self._new_heldout:
            return False
        progress = self.names_seen if self.base.time_attr == "names_seen" else self.train_seconds
        crossed = False
        while self._milestones and progress >= self._milestones[0]:
            self._milestones.pop(0)
            crossed = True
        if crossed and self._rungs_in_names() and self._heldout_step < self.step:
            self._save_after_heldout = self.step  # the rung's save (and any other due) waits
            return False
        return crossed or self._clock() - self._last_checkpoint >= self.base.checkpoint_every_s

    def _save(self) -> None:
        from ..training.protocol import Save

        if self._save_dir is not None:
            return
        self._save_dir = tempfile.mkdtemp(prefix="microgpt-trial-")
        self.loop.send(Save(str(Path(self._save_dir) / CHECKPOINT_FILE)))

    def _drop_save(self) -> None:
        shutil.rmtree(self._save_dir, ignore_errors=True)
        self._save_dir = None

    def _eval_seconds(self) -> float:
        """Held-out evaluations' time in this process (the loop's schedule keeps it)."""
        schedule = getattr(self.loop, "holdout_schedule", None)
        return float(schedule.eval_seconds) if schedule is not None else 0.0

    @property
    def names_seen(self) -> int:
        return self.step * self.batch_size

    def _metrics(self) -> dict:
        losses, block = block_means(self._losses)
        heldout = self.heldout_loss
        if self.diverged or heldout is None:
            heldout = math.inf  # the worst: ASHA cuts it, TPE learns to avoid its settings
        return {"heldout_loss": heldout, "train_loss": losses[-1] if losses else math.nan,
                "step": self.step, "num_steps": self.num_steps, "names_seen": self.names_seen,
                "train_seconds": self.train_seconds, "eval_seconds": self._eval_seconds(),
                "first_step": self._first, "losses": losses,
                "block": block, "heldout": self._new_heldout, "finished": self.finished,
                "diverged": self.diverged, "node": self.node}

    def _flush(self, checkpoint: bool = False) -> None:
        """Report the pending chunk (with the checkpoint just saved)."""
        if not checkpoint and self.heldout_loss is None and not self.finished and not self.diverged:
            return  # no held-out loss yet: the chunks wait for the first evaluation
        metrics = self._metrics()
        self._losses, self._new_heldout, self._pending, self._pending_s = [], [], False, 0.0
        self._end_reported = self.finished or self.diverged
        self._first = self.step
        if not checkpoint:
            self._report(metrics)
            return
        folder, self._save_dir = self._save_dir, None
        self._last_checkpoint = self._clock()
        Path(folder, TRIAL_STATE_FILE).write_text(json.dumps({"train_seconds": self.train_seconds}))
        try:
            self._report(metrics, checkpoint=self._make_checkpoint(folder))
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # Tune has copied it into the sweep's folder

    def _final_report(self) -> None:
        if self.error and not self.diverged:
            return  # raised by run(): Tune records the error
        if self._pending or self._new_heldout or (self.finished or self.diverged) and not self._end_reported:
            self._flush()
