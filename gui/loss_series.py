"""A run's losses and their smoothed curve, as the loss plot and the run
overlay draw them: TensorBoard's debiased exponential moving average, kept
incrementally as steps arrive, and recomputed at a new weight (the Smoothing
slider) off the GUI thread once the series is long.

Step numbers count from 1, as the window does: loss i (from 0) is step i + 1.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from PySide6.QtCore import QObject, Signal

import engine
from engine.memory import grown

from .background import Background

EMA_BLOCK = 64  # the block matrix costs EMA_BLOCK multiply-adds per value
SYNC_STEPS = 50_000  # up to this many values in all, a new weight is applied at once (about a millisecond)
RESMOOTH_KEY = "resmooth"


def ema(values: np.ndarray, weight: float, carry: float = 0.0, start: int = 0) -> tuple[np.ndarray, float]:
    """TensorBoard's debiased EMA of values that continue a series at index start.

    s_i = weight * s_{i-1} + (1 - weight) * x_i (s_{-1} = 0), shown as s_i / (1 - weight^(i+1)).
    carry is s_{start-1}; returns (the debiased values, s at the last index).
    """
    x = np.asarray(values, dtype=np.float64)
    if not len(x):
        return np.empty(0), carry
    biased = decayed_sums((1 - weight) * x, weight, carry)
    return debias(biased, weight, start), float(biased[-1])


def decayed_sums(u: np.ndarray, a: float, carry: float) -> np.ndarray:
    """s_i = a * s_{i-1} + u_i with s_{-1} = carry, without a Python loop over i.

    Blocks of EMA_BLOCK values each get their own sums from zero in one matrix
    product; block k's start value is then block k-1's end, a recurrence of the
    same form (factor a^EMA_BLOCK) over the block ends, solved the same way:
    n * EMA_BLOCK multiply-adds in all, in log_EMA_BLOCK(n) levels.
    """
    n = len(u)
    decay, powers = _block_kernel(a)
    if n <= EMA_BLOCK:
        return decay[:n, :n] @ u + powers[:n] * carry
    blocks = -(-n // EMA_BLOCK)
    padded = np.zeros(blocks * EMA_BLOCK)  # zeros after the end change nothing before it
    padded[:n] = u
    local = padded.reshape(blocks, EMA_BLOCK) @ decay.T  # each block's sums from zero
    ends = decayed_sums(local[:, -1], float(powers[-1]), carry)  # s at each block's last value
    starts = np.concatenate(([carry], ends[:-1]))
    local += starts[:, None] * powers[None, :]
    return local.reshape(-1)[:n]


@functools.lru_cache(maxsize=16)
def _block_kernel(a: float) -> tuple[np.ndarray, np.ndarray]:
    """The block's lower-triangular decay matrix a^(j-i), and a^(j+1)."""
    lags = np.arange(EMA_BLOCK)
    gaps = lags[:, None] - lags[None, :]
    decay = np.where(gaps >= 0, a ** np.maximum(gaps, 0), 0.0)
    return decay, a ** (lags + 1.0)


def faded_after(weight: float) -> int:
    """The lag k (0 < weight < 1) at which weight^k < 2^-54, half an ulp of 1: a value
    that far back no longer changes a double of the EMA, nor 1 - weight^k its debiasing."""
    return math.ceil(-54 * math.log(2) / math.log(weight)) + 1


def ema_last(values: np.ndarray, weight: float) -> float | None:
    """ema(values, weight)'s last value (None with no values), from only the values still
    felt in it (the last faded_after(weight)), so a long run's costs what a short one's
    does; bit for bit the full EMA's while there are fewer values than that. An inf or
    NaN never fades from the full EMA: after one, it is the full EMA's."""
    n = len(values)
    if not n:
        return None
    start = max(0, n - faded_after(weight)) if weight > 0 else n - 1  # weight 0: the last value itself
    if not np.isfinite(values[:start]).all():
        start = 0
    return float(ema(values[start:], weight, 0.0, start)[0][-1])


def debias(biased: np.ndarray, weight: float, start: int) -> np.ndarray:
    """biased_i / (1 - weight^(start+i+1)). Once weight^(i+1) is below half an ulp
    of 1 the divisor is exactly 1.0, so only the values before that are divided."""
    out = biased.copy()
    if not 0 < weight < 1:
        return out
    last = max(0, min(len(out), faded_after(weight) - start))
    if last:
        index = start + np.arange(last)
        out[:last] /= 1 - weight ** (index + 1.0)
    return out


class GrowingSeries:
    """Steps (from 1), losses and their EMA at `weight`, in buffers that double when full.

    With a `source` (an engine.training.records.RunRecord, the application model's
    copy of a run's losses), the losses are the source's, read where they are: the
    series keeps only the steps and the EMA, and its owner extends it after the
    source has the values (the run's record grows first). detach() takes a copy of
    them (the record is about to be compacted)."""

    def __init__(self, weight: float = 0.0, source=None):
        self.weight = float(weight)
        self.n = 0
        self.epoch = 0  # counts rewinds: a resmooth computed before one is stale
        self.source = source
        self.x = np.empty(1024, dtype=np.float64)  # x[i] == i + 1: filled once, not per redraw
        self._y = np.empty(1024, dtype=np.float64) if source is None else None
        self.smooth = np.empty(1024, dtype=np.float64)
        self._carry = 0.0  # the biased EMA at the last value

    @property
    def y(self) -> np.ndarray:
        """The losses: this series' own buffer, or its source's (its first n are this series')."""
        return self._y if self.source is None else self.source.losses

    def detach(self) -> None:
        """Keep a copy of the source's losses and let go of it."""
        if self.source is not None:
            held = len(self.source.losses)
            if self.n > held:  # the source was rewound since this series last followed it
                self.truncate(held)
            self._y = np.empty(len(self.x), dtype=np.float64)
            self._y[: self.n] = self.source.losses[: self.n]
            self.source = None

    def _reserve(self, n: int) -> None:
        for name in ("x", "smooth") if self.source is not None else ("x", "_y", "smooth"):
            setattr(self, name, grown(getattr(self, name), n, self.n))

    def extend(self, losses: np.ndarray, first: int) -> None:
        """Losses of values first, first + 1, ... (from 0); a first before the end rewinds."""
        if first != self.n:  # a rewound run (checkpoint): drop what follows first
            self.truncate(first)
        end = first + len(losses)
        self._reserve(end)
        self.x[first:end] = np.arange(first + 1, end + 1)
        if self.source is None:
            self._y[first:end] = losses
        self.smooth[first:end], self._carry = ema(losses, self.weight, self._carry, first)
        self.n = end

    def truncate(self, n: int) -> None:
        """Keep the first n values. The EMA looks only backwards, so theirs stands;
        the carry is the last kept value with its debiasing undone."""
        self.n = max(0, min(n, self.n))
        self.epoch += 1
        bias = 1 - self.weight ** self.n if 0 < self.weight < 1 else 1.0
        self._carry = float(self.smooth[self.n - 1]) * bias if self.n else 0.0

    def set_weight(self, weight: float) -> None:
        """Smooth every value again at weight, here and now."""
        smooth, carry = ema(self.y[: self.n], weight)
        self.adopt(weight, self.n, self.epoch, smooth, carry)

    def adopt(self, weight: float, n: int, epoch: int, smooth: np.ndarray, carry: float) -> bool:
        """Take the EMA at weight of the first n values, computed elsewhere; the values
        that came since are smoothed here. False (nothing changed) after a rewind."""
        if epoch != self.epoch or n > self.n:
            return False
        self.weight = float(weight)
        self.smooth[:n] = smooth
        self._carry = carry
        if self.n > n:
            self.smooth[n:self.n], self._carry = ema(self.y[n:self.n], self.weight, carry, n)
        return True

    @property
    def steps(self) -> np.ndarray:
        return self.x[: self.n]

    @property
    def losses(self) -> np.ndarray:
        return self.y[: self.n]

    @property
    def smoothed(self) -> np.ndarray:
        return self.smooth[: self.n]


def _smooth_all(weight: float, jobs: list[tuple[np.ndarray, int, int]], cancel) -> list[tuple]:
    """In the worker thread: the EMA of each job's values (a buffer and its length,
    read only: the GUI thread writes only past the length, or after a rewind,
    which the epoch check then catches)."""
    out = []
    for values, n, epoch in jobs:
        if cancel():
            raise engine.Cancelled("a newer smoothing weight came")
        out.append((n, epoch, *ema(values[:n], weight)))
    return out


class Resmoother(QObject):
    """Puts series on a new smoothing weight: at once when they are short, else
    in a background thread where only the newest weight counts (a slider drag
    computes the weights it can, never a queue of old ones). Until a result
    comes, the series keep their old weight and keep growing; `done` follows
    once every series asked for shows the newest weight."""

    done = Signal()

    def __init__(self, parent: QObject | None = None, name: str = "resmooth"):
        super().__init__(parent)
        self._name = name
        self._worker: Background | None = None  # made on the first long series
        self._pending: tuple[float, list[GrowingSeries]] | None = None

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def resmooth(self, series: list[GrowingSeries], weight: float) -> None:
        if sum(s.n for s in series) <= SYNC_STEPS:
            if self._worker is not None:
                self._worker.cancel(RESMOOTH_KEY)
            self._pending = None
            for s in series:
                s.set_weight(weight)
            self.done.emit()
            return
        if self._worker is None:
            self._worker = Background(self, self._name, newest_wins=True, one_thread=True, cancellable=True)
            self._worker.done.connect(self._on_result)
        self._pending = (weight, series)
        jobs = [(s.y, s.n, s.epoch) for s in series]
        self._worker.start(_smooth_all, weight, jobs, key=RESMOOTH_KEY)

    def _on_result(self, _key: str, results: list[tuple]) -> None:
        if self._pending is None:
            return
        weight, series = self._pending
        stale = [s for s, (n, epoch, smooth, carry) in zip(series, results)
                 if not s.adopt(weight, n, epoch, smooth, carry)]
        if stale:  # rewound meanwhile: their values changed, smooth them again
            self.resmooth(stale, weight)
            return
        self._pending = None
        self.done.emit()
