"""The loss plot's x axes: the step, the names seen (step x batch size, read in
epochs) or the training time (pauses and held-out evaluations left out).
StepClock keeps each step's cumulative training time as chunks arrive, so a
curve or a held-out point can be placed on the time axis. epoch_text is the
one wording of the epoch and names seen (progress bar, status bar, read-out).
"""
from __future__ import annotations

import numpy as np

from engine.memory import grown

STEP, NAMES, SECONDS = "step", "names", "seconds"
AXES = ((STEP, "step"), (NAMES, "names seen"), (SECONDS, "training time"))


class StepClock:
    """Training seconds up to the end of each step (step i + 1 at index i). The
    first `untimed` steps have none (NaN: loaded from a checkpoint); a later
    chunk without a time (never in a run) is placed at the last known time, so
    the timed steps' times never fall and the plot draws them as slices. A
    chunk's time is shared evenly among its steps, as engine.training.records.RunRecord does."""

    def __init__(self):
        self.n = 0
        self.untimed = 0
        self.t = np.empty(1024, dtype=np.float64)
        self._end = 0.0  # the last known time (a chunk's steps continue from it)

    def extend(self, first: int, count: int, seconds: float) -> None:
        """Steps first + 1 .. first + count took `seconds` (NaN: unknown); a first
        before the end rewinds."""
        if first < self.n:  # rewound (a checkpoint): the time so far is the kept steps' last
            self.n, self.untimed = first, min(self.untimed, first)
            self._end = float(self.t[first - 1]) if first > self.untimed else 0.0
        first, count = self.n, first + count - self.n  # a gap (never in a run) counts as the chunk's
        end = first + count
        self.t = grown(self.t, end, self.n)
        if not (count and np.isfinite(seconds)):
            if first == self.untimed:
                self.t[first:end] = np.nan
                self.untimed = end
            else:
                self.t[first:end] = self._end
        else:
            self.t[first:end] = self._end + seconds / count * np.arange(1, count + 1)
            self._end = float(self.t[end - 1])
        self.n = end

    @property
    def timed(self) -> slice:
        """The steps (as indices) that have a time."""
        return slice(self.untimed, self.n)

    @property
    def seconds(self) -> np.ndarray:
        return self.t[: self.n]

    def at_steps(self, steps: np.ndarray) -> np.ndarray:
        """The training time after each of `steps` (NaN where unknown or not trained yet)."""
        steps = np.asarray(steps, dtype=np.int64)
        out = np.full(len(steps), np.nan)
        inside = (steps >= 1) & (steps <= self.n)
        out[inside] = self.t[steps[inside] - 1]
        return out

    def step_at(self, seconds: float) -> int:
        """The first step whose end is at or after `seconds` (1 if none is timed)."""
        return self.untimed + int(np.searchsorted(self.t[self.timed], seconds)) + 1


def x_values(axis: str, steps: np.ndarray, batch_size: int, clock: StepClock) -> np.ndarray:
    """Steps' positions on `axis` (NaN where the time axis has no time for them)."""
    if axis == NAMES:
        return np.asarray(steps, dtype=np.float64) * batch_size
    if axis == SECONDS:
        return clock.at_steps(steps)
    return np.asarray(steps, dtype=np.float64)


def step_of_x(axis: str, x: float, batch_size: int, clock: StepClock) -> int:
    """The step at position x on `axis` (the hover read-out's inverse of x_values)."""
    if axis == NAMES:
        return int(round(x / max(batch_size, 1)))
    if axis == SECONDS:
        return clock.step_at(x)
    return int(round(x))


def axis_label(axis: str, train_docs: int) -> tuple[str, str | None]:
    """(label, units) of the bottom axis; names seen say how many make an epoch."""
    if axis == NAMES:
        return (f"names seen (an epoch is {train_docs:,})" if train_docs else "names seen"), None
    if axis == SECONDS:
        return "training time", "s"  # pyqtgraph picks ms, s or ks from the range
    return "step", None


def names_seen(step: int, batch_size: int) -> int:
    """The names trained on by the end of `step` (step x batch size)."""
    return step * batch_size


def epoch_text(step: int, batch_size: int, train_docs: int, always: bool = False, names: bool = False) -> str:
    """'epoch 1.24', or 'epoch 1.24 (38,400 names)' with names: the passes over the
    training names by the end of `step`. '' without training names and, unless
    `always`, while it would say no more than the step does (batches of one, in
    the first epoch)."""
    seen = names_seen(step, batch_size)
    if not train_docs or not (always or batch_size > 1 or seen >= train_docs):
        return ""
    text = f"epoch {seen / train_docs:.2f}"
    return text + f" ({seen:,} names)" if names else text
