"""The live loss plot: every step's loss as a thin curve, its exponential moving
average (TensorBoard's smoothing, debiased) on top, a dashed line at ln(vocab)
(the loss of guessing uniformly), a log-y toggle and a hover read-out.

The curve data is a display copy of the worker's losses in growing numpy
buffers (amortized doubling); redraws are throttled, and pyqtgraph clips to
the view and downsamples, so a million points stay smooth.
"""
from __future__ import annotations

import functools
import math
import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QCheckBox, QHBoxLayout, QLabel, QSlider, QVBoxLayout, QWidget

from engine.memory import grown

from .controls import plot_widget

MIN_REDRAW_MS = 40  # at most 25 redraws a second; fewer if a redraw gets slow
EMA_BLOCK = 256


def ema(values: np.ndarray, weight: float, carry: float = 0.0, start: int = 0) -> tuple[np.ndarray, float]:
    """TensorBoard's debiased EMA of values that continue a series at index start.

    s_i = weight * s_{i-1} + (1 - weight) * x_i (s_{-1} = 0), shown as s_i / (1 - weight^(i+1)).
    carry is s_{start-1}; returns (the debiased values, s at the last index). Vectorized in
    blocks: within a block s_j = weight^(j+1) carry + (1 - weight) sum_i weight^(j-i) x_i.
    """
    x = np.asarray(values, dtype=np.float64)
    out = np.empty(len(x))
    if not len(x):
        return out, carry
    decay, powers = _ema_kernel(weight)
    for lo in range(0, len(x), EMA_BLOCK):
        block = x[lo:lo + EMA_BLOCK]
        n = len(block)
        biased = (1 - weight) * (decay[:n, :n] @ block) + powers[:n] * carry
        carry = float(biased[-1])
        index = start + lo + np.arange(n)
        out[lo:lo + n] = biased / (1 - weight ** (index + 1.0)) if weight > 0 else biased
    return out, carry


@functools.lru_cache(maxsize=4)
def _ema_kernel(weight: float) -> tuple[np.ndarray, np.ndarray]:
    """The block's lower-triangular decay matrix weight^(j-i) and weight^(j+1)."""
    lags = np.arange(EMA_BLOCK)
    gaps = lags[:, None] - lags[None, :]
    decay = np.where(gaps >= 0, weight ** np.maximum(gaps, 0), 0.0)
    return decay, weight ** (lags + 1.0)


class GrowingSeries:
    """x = step, y = loss and its EMA, in buffers that double when full."""

    def __init__(self):
        self.n = 0
        self.x = np.empty(1024, dtype=np.float64)  # x[i] == i: filled once, not per redraw
        self.y = np.empty(1024, dtype=np.float64)
        self.smooth = np.empty(1024, dtype=np.float64)
        self._carry = 0.0

    def _reserve(self, n: int) -> None:
        for name in ("x", "y", "smooth"):
            setattr(self, name, grown(getattr(self, name), n, self.n))

    def extend(self, losses: np.ndarray, first_step: int, weight: float) -> None:
        if first_step != self.n:  # a rewound run (checkpoint): drop what follows first_step
            self.truncate(first_step, weight)
        end = first_step + len(losses)
        self._reserve(end)
        self.x[first_step:end] = np.arange(first_step, end)
        self.y[first_step:end] = losses
        self.smooth[first_step:end], self._carry = ema(losses, weight, self._carry, first_step)
        self.n = end

    def truncate(self, n: int, weight: float) -> None:
        self.n = min(n, self.n)
        self.resmooth(weight)

    def resmooth(self, weight: float) -> None:
        self.smooth[: self.n], self._carry = ema(self.y[: self.n], weight)

    @property
    def steps(self) -> np.ndarray:
        return self.x[: self.n]


class LossPlot(QWidget):
    """The plot widget with its controls; `plot` is the pyqtgraph PlotWidget (lossPlot)."""

    smoothingChanged = Signal(float)
    redrawn = Signal()  # the curves show every step received so far

    def __init__(self, parent=None):
        super().__init__(parent)
        self.series = GrowingSeries()
        self.redraws = 0  # counted for the responsiveness probe
        self._vocab_size = 0

        self.plot = plot_widget("lossPlot", "")
        item = self.plot.getPlotItem()
        item.setLabel("bottom", "step")
        item.setLabel("left", "loss")
        # room above the view box, or the top y tick label is drawn half outside the widget
        item.layout.setContentsMargins(2, 10, 12, 2)
        # no grid: pyqtgraph replays the axes' grid lines on every paint, half its cost
        self.legend = item.addLegend(offset=(-10, 10))
        # one downsampled bin per pixel column (peak keeps each bin's min and max):
        # pyqtgraph's default of 5 costs twice the paint time for no visible gain
        self.raw_curve = item.plot(name="loss", pen=pg.mkPen((165, 190, 232), width=1),
                                   autoDownsampleFactor=1.0)
        self.smooth_curve = item.plot(name="smoothed", pen=pg.mkPen((20, 70, 170), width=2),
                                      autoDownsampleFactor=1.0)
        for curve in (self.raw_curve, self.smooth_curve):
            curve.setClipToView(True)
            curve.setDownsampling(auto=True, method="peak")
        dashed = pg.mkPen((200, 60, 60), width=1, style=Qt.DashLine)
        self.uniform_line = pg.InfiniteLine(angle=0, movable=False, pen=dashed)
        self.uniform_line.setVisible(False)
        item.addItem(self.uniform_line, ignoreBounds=True)
        # the legend draws its samples from data items: an empty curve with the line's pen
        self.uniform_sample = pg.PlotDataItem(pen=dashed)
        self.plot.scene().sigMouseMoved.connect(self._on_mouse_moved)

        self.smoothing_slider = QSlider(Qt.Horizontal, objectName="smoothingSlider")
        self.smoothing_slider.setRange(0, 999)
        self.smoothing_slider.setValue(950)
        self.smoothing_slider.setToolTip("Smoothing weight of the exponential moving average (0 to 0.999)")
        self.smoothing_label = QLabel()
        self.log_y = QCheckBox("log y", objectName="logYCheck")
        self.readout = QLabel(" ", objectName="plotReadout")
        self.readout.setTextInteractionFlags(Qt.TextSelectableByMouse)

        controls = QHBoxLayout()
        controls.addWidget(QLabel("Smoothing"))
        controls.addWidget(self.smoothing_slider, 1)
        controls.addWidget(self.smoothing_label)
        controls.addSpacing(12)
        controls.addWidget(self.log_y)
        controls.addSpacing(12)
        controls.addWidget(self.readout, 2)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.plot, 1)
        layout.addLayout(controls)

        self._min_interval_ms = MIN_REDRAW_MS
        self._last_redraw = 0.0
        self._timer = QTimer(self, singleShot=True)
        self._timer.timeout.connect(self.redraw)
        self.smoothing_slider.valueChanged.connect(self._on_smoothing)
        self.log_y.toggled.connect(self.set_log_y)
        self._on_smoothing(self.smoothing_slider.value())

    # data -------------------------------------------------------------------
    @property
    def smoothing(self) -> float:
        return self.smoothing_slider.value() / 1000

    def append(self, losses: np.ndarray, first_step: int) -> None:
        self.series.extend(losses, first_step, self.smoothing)
        self._schedule()

    def clear(self) -> None:
        self.series = GrowingSeries()
        view = self.plot.getPlotItem().vb
        view.setRange(xRange=(0, 1), yRange=(0, 1), padding=0, disableAutoRange=False)  # as at start
        view.enableAutoRange(x=True, y=True)
        self.redraw()

    def follow_run(self, num_steps: int) -> None:
        """Span the run's whole length on x, so the curve is seen arriving from the left
        (the y axis keeps fitting the losses; zooming or "A" work as usual)."""
        view = self.plot.getPlotItem().vb
        view.enableAutoRange(x=False, y=True)
        view.setXRange(0, max(num_steps, 1), padding=0.02)

    def set_vocab_size(self, vocab_size: int) -> None:
        self._vocab_size = vocab_size
        self._place_uniform_line()

    def last(self) -> tuple[float, float] | None:
        """(last loss, last smoothed loss), or None before the first step."""
        s = self.series
        return (float(s.y[s.n - 1]), float(s.smooth[s.n - 1])) if s.n else None

    def data(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies of (steps, losses, smoothed losses) as displayed."""
        s = self.series
        return s.steps.copy(), s.y[: s.n].copy(), s.smooth[: s.n].copy()

    # drawing ----------------------------------------------------------------
    def _schedule(self) -> None:
        """Redraw now, or as soon as the minimum interval since the last redraw has passed."""
        if self._timer.isActive():
            return
        wait_ms = self._min_interval_ms - 1000 * (time.monotonic() - self._last_redraw)
        if wait_ms <= 0:
            self.redraw()
        else:
            self._timer.start(int(wait_ms) + 1)

    def flush(self) -> None:
        """Draw pending data now (a run paused or ended: show every step)."""
        if self._timer.isActive():
            self._timer.stop()
            self.redraw()

    def redraw(self) -> None:
        started = time.thread_time()  # CPU time: waiting for the GIL or a core is not cost
        s = self.series
        x = s.steps
        self.raw_curve.setData(x, s.y[: s.n])
        self.smooth_curve.setData(x, s.smooth[: s.n])
        self.redraws += 1
        # a slow redraw (huge series, slow machine) gets more room before the next one
        spent_ms = 1000 * (time.thread_time() - started)
        self._min_interval_ms = max(MIN_REDRAW_MS, 3 * spent_ms)
        self._last_redraw = time.monotonic()
        self.redrawn.emit()

    def _on_smoothing(self, value: int) -> None:
        self.smoothing_label.setText(f"{value / 1000:.3f}")
        self.series.resmooth(self.smoothing)
        self._schedule()
        self.smoothingChanged.emit(self.smoothing)

    def set_log_y(self, on: bool) -> None:
        if self.log_y.isChecked() != on:
            self.log_y.setChecked(on)  # comes back here through toggled
            return
        self.plot.getPlotItem().setLogMode(x=False, y=on)
        self._place_uniform_line()

    def _place_uniform_line(self) -> None:
        self.legend.removeItem(self.uniform_sample)
        if self._vocab_size < 2:
            self.uniform_line.setVisible(False)
            return
        level = math.log(self._vocab_size)  # cross-entropy of a uniform guess
        self.uniform_line.setPos(math.log10(level) if self.log_y.isChecked() else level)
        self.uniform_line.setToolTip(f"ln({self._vocab_size}) = {level:.3f}: the loss of guessing uniformly")
        self.uniform_line.setVisible(True)
        self.legend.addItem(self.uniform_sample, self.uniform_label())

    def uniform_label(self) -> str:
        return f"uniform guess, ln {self._vocab_size}"

    def _on_mouse_moved(self, pos) -> None:
        s = self.series
        view = self.plot.getPlotItem().vb
        if not s.n or not view.sceneBoundingRect().contains(pos):
            return
        step = int(round(view.mapSceneToView(pos).x()))
        step = min(max(step, 0), s.n - 1)
        self.readout.setText(f"step {step}: loss {s.y[step]:.4f}, smoothed {s.smooth[step]:.4f}")
