"""`microgpt-gui bench --to-loss X`: train one (backend, preset, batch) until the
held-out loss is at most X, and report how long the training took.

The run is the preset's own (its learning rate and step count, with the batch
size given), so the learning rate decays over the preset's steps. Training
runs in the training loop (engine.training.loop), in train(k) calls of about
CHUNK_S seconds; between them the held-out loss is evaluated on a
HoldoutSchedule, and the run stops at the first evaluation at or below X, at
the time limit, or when its steps are done.
Training seconds count the train(k) calls only; evaluation is timed apart.
No warm-up is excluded: the figure is the time a person would wait.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

from .timing import BenchResult, _open, load_average, peak_rss_mb, row_load, with_batch
from ..config import get_preset
from ..data.corpus import Corpus
from ..training import protocol as rs
from ..training.heldout import HoldoutSchedule
from ..training.loop import LoopSettings, TrainingLoop
from ..training.protocol import RunSpec

CHUNK_S = 0.25  # seconds of training between two chances to evaluate
# Evaluation is excluded from the training time, so it may take a larger share
# than in a window's run: evaluating more often finds the crossing sooner.
TO_LOSS_EVAL_SHARE = 0.25
DEFAULT_TIME_LIMIT_S = 600.0


@dataclass(frozen=True)
class ToLoss:
    """The goal of a `bench --to-loss` run."""

    target: float  # held-out loss to reach
    time_limit: float = DEFAULT_TIME_LIMIT_S  # training seconds at most
    steps: int | None = None  # the run's length (learning-rate decay); None: the preset's

    def __post_init__(self) -> None:
        if not (math.isfinite(self.target) and self.target > 0):
            raise ValueError(f"the target held-out loss must be a positive number, got {self.target!r}")
        if not self.time_limit > 0:
            raise ValueError(f"the time limit must be positive, got {self.time_limit!r}")


class ToLossPlan:
    """bench --to-loss's run as a TrainingLoop chunk plan and emit: calls of about
    CHUNK_S seconds (from the last call's pace, never past the time limit), held-out
    evaluations on a HoldoutSchedule of TO_LOSS_EVAL_SHARE, and a Stop at the first
    evaluation at or below the target; at the time limit the plan ends the run
    (after a last evaluation), and the run ends by itself at its last step."""

    def __init__(self, goal: ToLoss, clock=time.perf_counter):
        self.goal, self.clock = goal, clock
        self.reached = False
        self.info = None  # the run's RunInfo, once open
        self.heldout: list = []  # every held-out point
        self.error: BaseException | None = None
        self.loop: TrainingLoop | None = None
        self._last: tuple[int, float] | None = None  # the last call's (steps, seconds)

    def next_chunk(self, loop) -> int:
        if loop.train_seconds >= self.goal.time_limit:
            return 0
        if self._last is None:
            return 1
        ran, took = self._last
        per_step = max(took / max(ran, 1), 1e-7)
        left = self.goal.time_limit - loop.train_seconds
        return max(1, int(min(CHUNK_S, left) / per_step))

    def __call__(self, event) -> None:
        if isinstance(event, rs.Opened):
            self.info = event.info
        elif isinstance(event, rs.Losses):
            self._last = (len(event.losses), event.seconds)
        elif isinstance(event, rs.Heldout):
            self.heldout.extend(event.points)
            if not self.reached and event.points[-1].loss <= self.goal.target:
                self.reached = True
                self.loop.send(rs.Stop())
        elif isinstance(event, rs.Error) and self.error is None:
            self.error = event.exception or RuntimeError(event.message)

    def run(self, spec: RunSpec, opener) -> "ToLossPlan":
        """Train the runner opener(spec) gives in a TrainingLoop in this thread; raise what failed."""
        settings = LoopSettings(end_when_finished=True, chunk_steps=self.next_chunk, heldout_share=TO_LOSS_EVAL_SHARE,
                                delay_first_evaluation=False, opener=opener, clock=self.clock)
        self.loop = TrainingLoop(spec, self, settings)
        self.loop.run()
        if self.error is not None:
            raise self.error
        return self


def train_to_loss(runner, goal: ToLoss, clock=time.perf_counter) -> tuple[bool, HoldoutSchedule]:
    """Train runner until an evaluation finds the held-out loss <= goal.target, the
    training time passes goal.time_limit, or the run ends: (reached, schedule)."""
    plan = ToLossPlan(goal, clock).run(RunSpec(runner.name), lambda spec: runner)
    return plan.reached, plan.loop.holdout_schedule


def measure_to_loss(backend: str, preset_name: str, corpus: Corpus, goal: ToLoss, batch: int = 1) -> BenchResult:
    """One `bench --to-loss` row, in this process."""
    cores, load_before = os.cpu_count() or 1, load_average()
    preset = with_batch(get_preset(preset_name), batch)
    if goal.steps is not None:
        preset = preset.with_steps(goal.steps)

    def opener(spec):
        runner = _open(backend, preset, corpus)
        if runner.holdout == 0:
            runner.close()
            raise ValueError("the dataset holds out no documents (under 10 documents): no held-out loss")
        return runner

    plan = ToLossPlan(goal).run(RunSpec(backend, corpus, preset.model, preset.train), opener)
    loop, info = plan.loop, plan.info
    schedule, steps = loop.holdout_schedule, loop.step
    names_seen = steps * info.train.batch_size
    load, busy = row_load(load_before, cores)
    train_s = schedule.train_seconds
    return BenchResult(
        backend, preset_name, "ok", params=int(info.num_params), steps=steps,
        seconds=train_s, steps_per_s=steps / train_s if train_s else 0.0,
        ms_per_step=1e3 * train_s / max(steps, 1), peak_rss_mb=peak_rss_mb(), load_avg=load,
        cores=cores, busy=busy, batch=batch,
        names_per_s=names_seen / train_s if train_s else 0.0, target_loss=goal.target,
        reached=plan.reached, train_s=train_s, eval_s=schedule.eval_seconds, evals=schedule.evaluations,
        names_seen=names_seen, epochs=names_seen / info.train_docs,
        heldout_loss=plan.heldout[-1].loss if plan.heldout else None)
