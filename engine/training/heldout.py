"""Learning, not only stepping: the held-out loss's record and when to measure it.

A run holds out documents (engine.data.split.DataSplit) and evaluates their mean
per-token loss now and then (Backend.heldout_loss). Evaluation is a forward
pass over every held-out document, so it costs time the run would otherwise
train with: HoldoutSchedule spaces the evaluations so that they take at
most a set share of the training time, and asks for one at the end.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

EVAL_SHARE = 0.1  # evaluation may take at most this share of the training time
FORWARD_SHARE = 1 / 3  # a forward pass's share of a training step (the backward pass is about twice it)


@dataclass(frozen=True)
class HeldoutPoint:
    """One evaluation of the held-out loss: after `step` steps, at the parameters then."""

    step: int
    loss: float


class HoldoutSchedule:
    """When to evaluate the held-out loss: after the first chunk, then whenever
    the evaluation time so far plus one more (as long as the last took) stays
    within `share` of the training time so far, and at the end of the run.

    Feed it the seconds each train(k) call and each evaluation took; due()
    says whether to evaluate now. Qt-free, shared by the CLI, bench and the window.
    """

    def __init__(self, share: float = EVAL_SHARE):
        if not 0 < share <= 1:
            raise ValueError(f"the evaluation share must be in (0, 1], got {share!r}")
        self.share = share
        self.train_seconds = 0.0
        self.eval_seconds = 0.0
        self.last_eval_seconds = 0.0
        self.evaluations = 0
        self._trained_since = False  # steps ran since the last evaluation

    def trained(self, seconds: float) -> None:
        self.train_seconds += seconds
        self._trained_since = True

    def evaluated(self, seconds: float) -> None:
        self.eval_seconds += seconds
        self.last_eval_seconds = seconds
        self.evaluations += 1
        self._trained_since = False

    def due(self, finished: bool = False) -> bool:
        """Whether to evaluate now: at the end of a run (once), the first time,
        or while the time budget allows another."""
        if self.evaluations and not self._trained_since:
            return False  # nothing changed since the last one
        if finished or not self.evaluations:
            return True
        return self.eval_seconds + self.last_eval_seconds <= self.share * self.train_seconds


def evaluation_estimate(split, seconds_per_step: float) -> float:
    """A guess at one evaluation's seconds before any has run: a forward pass over
    the held-out positions at the training steps' speed (batched evaluation is
    faster, so this errs towards evaluating later). split: an engine.data.split.DataSplit."""
    heldout = float(split.positions[split.heldout_documents()].sum())
    per_step = float(split.positions[: split.n_train].mean()) * split.batch_size
    return FORWARD_SHARE * seconds_per_step * heldout / max(per_step, 1.0)


def evaluate_if_due(runner, schedule: HoldoutSchedule, finished: bool = False,
                    clock=time.perf_counter, cancel=None) -> float | None:
    """The held-out loss when the schedule says it is due (timed into it), else
    None; None also for a run that holds out nothing. runner: a Backend or
    TorchReference (engine.backends.base.HeldoutEvaluation). cancel: passed to
    heldout_loss (Cancelled propagates; the schedule counts nothing then)."""
    if runner.holdout == 0 or not schedule.due(finished):
        return None
    start = clock()
    loss = runner.heldout_loss(cancel=cancel)
    schedule.evaluated(clock() - start)
    return loss
