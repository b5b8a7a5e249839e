"""A record of one training run for comparing runs: its configuration and
dataset, every step's loss and the wall-clock time each step took. Qt-free;
the window keeps one per run of the session (trained, stopped or loaded from
a checkpoint). A run that has ended is compacted to at most MAX_POINTS
points (block means), so a long session's records stay small. And the loss
history's CSV (the window's Export loss).
"""
from __future__ import annotations

import contextlib
import io
import math
import os
from dataclasses import dataclass, field

import numpy as np

from ..config import PRESETS, ModelConfig, TrainConfig
from ..memory import grown

CUSTOM = "custom"
LOSS_CSV_HEADER = "step,loss,smoothed,heldout"  # steps count from 1, as the window's do
MAX_POINTS = 8192  # what an ended run keeps of its curve


def preset_name(model: ModelConfig) -> str:
    """The preset whose network this is, or "custom"."""
    return next((name for name, preset in PRESETS.items() if preset.model == model), CUSTOM)


@dataclass(eq=False)
class RunRecord:
    """One run's losses and step times, grown chunk by chunk as they arrive.

    step_seconds[i] is the wall-clock time step i took (a chunk's time shared
    evenly among its steps), NaN where unknown (steps loaded from a checkpoint).
    """

    name: str
    backend: str
    model: ModelConfig
    train: TrainConfig
    status: str = "running"  # "running", "finished", "stopped", "diverged", "loaded"
    dataset: str = ""        # the dataset's name, as the window shows it
    dataset_hash: str = ""   # engine.training.run_model.DatasetIdentity.content_hash: runs of another are not comparable
    steps: int = field(default=0, init=False)
    block: int = field(default=1, init=False)  # steps per point (1 until compacted)
    _points: int = field(default=0, init=False, repr=False)
    _ms_per_step: float | None = field(default=None, init=False, repr=False)
    _losses: np.ndarray = field(default_factory=lambda: np.empty(256, dtype=np.float32), init=False, repr=False)
    _step_seconds: np.ndarray = field(default_factory=lambda: np.empty(256), init=False, repr=False)
    # held-out evaluations (engine.training.heldout.HeldoutPoint), by step: few, never compacted
    heldout: list = field(default_factory=list, init=False, repr=False)

    def add_heldout(self, points, replacing: bool = False) -> None:
        """Held-out points after the ones kept; replacing: the run's whole history (a
        checkpoint's). A point at or before a kept one's step replaces what follows."""
        if replacing:
            self.heldout = []
        for point in points:
            while self.heldout and self.heldout[-1].step >= point.step:
                self.heldout.pop()
            self.heldout.append(point)

    @property
    def best_heldout(self) -> float:
        return min((p.loss for p in self.heldout), default=float("nan"))

    @property
    def final_heldout(self) -> float:
        return self.heldout[-1].loss if self.heldout else float("nan")

    @property
    def names_per_second(self) -> float:
        """Training documents per second of training (NaN when no step was timed)."""
        return self.train.batch_size * 1e3 / self.ms_per_step

    @property
    def preset(self) -> str:
        return preset_name(self.model)

    @property
    def losses(self) -> np.ndarray:
        """Each point's loss: every step's, or block means once compacted."""
        return self._losses[: self._points]

    @property
    def step_seconds(self) -> np.ndarray:
        """Each point's wall-clock seconds (a block's total once compacted)."""
        return self._step_seconds[: self._points]

    @property
    def x(self) -> np.ndarray:
        """Each point's step (its block's first step once compacted)."""
        return np.arange(self._points, dtype=np.float64) * self.block

    def compact(self, max_points: int = MAX_POINTS) -> None:
        """Keep at most max_points points: losses averaged and seconds summed over
        blocks of steps (an ended run's curve; the record is not extended after).
        A shorter record keeps every step, in arrays trimmed to its length (a growing
        record's have room for up to as many again)."""
        if self._points <= max_points:
            self._losses = self._losses[: self._points].copy()
            self._step_seconds = self._step_seconds[: self._points].copy()
            return
        self._ms_per_step = self.ms_per_step
        block = math.ceil(self._points / max_points)
        n = self._points
        starts = np.arange(0, n, block)
        sizes = np.diff(np.append(starts, n))
        losses = np.add.reduceat(self.losses.astype(np.float64), starts) / sizes
        untimed = np.isnan(self.step_seconds)
        seconds = np.add.reduceat(np.where(untimed, 0.0, self.step_seconds), starts)
        seconds[np.add.reduceat(untimed, starts) == sizes] = np.nan  # a block of untimed steps only
        self._losses, self._step_seconds = losses.astype(np.float32), seconds
        self._points, self.block = len(starts), self.block * block

    def extend(self, losses, first_step: int, seconds: float | None = None) -> None:
        """Add the losses of steps first_step, first_step + 1, ... that took `seconds`
        together (None: unknown). A first_step before the end rewinds the record."""
        if not 0 <= first_step <= self.steps:
            raise ValueError(f"losses from step {first_step} cannot follow step {self.steps}")
        if self.block != 1:
            raise ValueError("a compacted record is not extended")
        losses = np.asarray(losses, dtype=np.float32).reshape(-1)
        end = first_step + len(losses)
        self._losses = grown(self._losses, end, first_step)
        self._step_seconds = grown(self._step_seconds, end, first_step)
        self._losses[first_step:end] = losses
        per_step = np.nan if seconds is None or not len(losses) else seconds / len(losses)
        self._step_seconds[first_step:end] = per_step
        self.steps = self._points = end

    def wall_seconds(self) -> np.ndarray:
        """Training time up to the end of each step (pauses excluded), NaN where unknown."""
        per_step = self.step_seconds
        total = np.cumsum(np.nan_to_num(per_step, nan=0.0))
        return np.where(np.isnan(per_step), np.nan, total)

    def seconds_at(self, steps) -> np.ndarray:
        """Training time after each of `steps` (counted from 1), interpolated between
        the points' ends; NaN where unknown (untimed, or past the record)."""
        ends = np.minimum(self.x + self.block, self.steps)  # the step each point ends at
        seconds = self.wall_seconds()
        timed = ~np.isnan(seconds)
        steps = np.asarray(steps, dtype=np.float64)
        if not timed.any():
            return np.full(len(steps), np.nan)
        return np.interp(steps, ends[timed], seconds[timed], left=np.nan, right=np.nan)

    @property
    def ms_per_step(self) -> float:
        """Mean wall-clock milliseconds per timed step; NaN when no step was timed."""
        if self._ms_per_step is not None:
            return self._ms_per_step
        timed = self.step_seconds[~np.isnan(self.step_seconds)]
        return float(1e3 * timed.mean()) if len(timed) else float("nan")


def loss_csv_lines(steps: np.ndarray, losses: np.ndarray, smoothed: np.ndarray, heldout=()) -> list[str]:
    """The CSV's rows: `step,loss,smoothed,heldout`, heldout empty but at the steps
    evaluated (heldout: HeldoutPoints; one after step s is on row s)."""
    body = io.StringIO()
    np.savetxt(body, np.column_stack([steps, losses, smoothed]), fmt=["%d", "%.6f", "%.6f"], delimiter=",")
    lines = [line + "," for line in body.getvalue().splitlines()]
    for point in heldout:
        i = int(np.searchsorted(steps, point.step))  # steps rise
        if i < len(steps) and steps[i] == point.step:
            lines[i] += f"{point.loss:.6f}"
    return [LOSS_CSV_HEADER, *lines]


def write_loss_csv(path: str | os.PathLike, steps: np.ndarray, losses: np.ndarray, smoothed: np.ndarray,
                   heldout=()) -> str:
    """The loss CSV (loss_csv_lines), written beside path and then renamed: a write cut
    short (the app quit meanwhile) never leaves a truncated CSV under the user's name."""
    path = os.fspath(path)
    partial = f"{path}.part"
    try:
        with open(partial, "w", encoding="utf-8", newline="\n") as f:
            f.write("\n".join(loss_csv_lines(steps, losses, smoothed, heldout)) + "\n")
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(partial)
        raise
    return path
