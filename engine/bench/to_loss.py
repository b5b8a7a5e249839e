"""`microgpt-gui bench --to-loss X`: train one (backend, preset, batch) until the
held-out loss is at most X, and report how long the training took.

The run is the preset's own (its learning rate and step count, with the batch
size given), so the learning rate decays over the preset's steps. Training
runs in train(k) calls of about CHUNK_S seconds; between them the held-out
loss is evaluated on a HoldoutSchedule, and the run stops at the first
evaluation at or below X, at the time limit, or when its steps are done.
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
from ..training.heldout import HoldoutSchedule, evaluate_if_due

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


def train_to_loss(runner, goal: ToLoss, clock=time.perf_counter) -> tuple[bool, HoldoutSchedule]:
    """Train runner until an evaluation finds the held-out loss <= goal.target, the
    training time passes goal.time_limit, or the run ends: (reached, schedule)."""
    schedule = HoldoutSchedule(TO_LOSS_EVAL_SHARE)
    k = 1
    while True:
        start = clock()
        ran = len(runner.train(k))
        took = clock() - start
        schedule.trained(took)
        done = runner.finished or ran < k or schedule.train_seconds >= goal.time_limit
        loss = evaluate_if_due(runner, schedule, done, clock)
        if loss is not None and loss <= goal.target:
            return True, schedule
        if done:
            return False, schedule
        # the next call about CHUNK_S long, from this one's pace, and not past the time limit
        per_step = max(took / max(ran, 1), 1e-7)
        left = goal.time_limit - schedule.train_seconds
        k = max(1, int(min(CHUNK_S, left) / per_step))


def measure_to_loss(backend: str, preset_name: str, corpus: Corpus, goal: ToLoss, batch: int = 1) -> BenchResult:
    """One `bench --to-loss` row, in this process."""
    cores, load_before = os.cpu_count() or 1, load_average()
    preset = with_batch(get_preset(preset_name), batch)
    if goal.steps is not None:
        preset = preset.with_steps(goal.steps)
    runner = _open(backend, preset, corpus)
    try:
        if runner.holdout == 0:
            raise ValueError("the dataset holds out no documents (under 10 documents): no held-out loss")
        reached, schedule = train_to_loss(runner, goal)
        history = runner.heldout_history
        load, busy = row_load(load_before, cores)
        train_s = schedule.train_seconds
        return BenchResult(
            backend, preset_name, "ok", params=int(runner.num_params), steps=runner.step,
            seconds=train_s, steps_per_s=runner.step / train_s if train_s else 0.0,
            ms_per_step=1e3 * train_s / max(runner.step, 1), peak_rss_mb=peak_rss_mb(), load_avg=load,
            cores=cores, busy=busy, batch=batch,
            names_per_s=runner.names_seen / train_s if train_s else 0.0, target_loss=goal.target,
            reached=reached, train_s=train_s, eval_s=schedule.eval_seconds, evals=schedule.evaluations,
            names_seen=runner.names_seen, epochs=runner.epochs,
            heldout_loss=history[-1].loss if history else None)
    finally:
        runner.close()
