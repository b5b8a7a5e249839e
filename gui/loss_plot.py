"""The live loss plot: every step's loss as a thin curve, its exponential moving
average (TensorBoard's smoothing, debiased) on top, the held-out loss as its
own curve with markers (one per evaluation), a dashed line at ln(vocab) (the
loss of guessing uniformly), an x axis of steps, names seen or training time
(gui/plot_axes.py), a log-y toggle and a hover read-out.

The curve's losses are the run's record's (the application model's copy,
engine.app.runs); the plot keeps the steps and the smoothed curve in growing
numpy buffers (amortized doubling, gui/loss_series.py); redraws are throttled, and
pyqtgraph clips to the view and downsamples, so a million points stay smooth.
A new smoothing weight is applied off the GUI thread once the run is long
(loss_series.Resmoother), so the slider costs the window the same at any
run length.
"""
from __future__ import annotations

import math
import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QCheckBox, QComboBox, QHBoxLayout, QLabel, QSlider, QVBoxLayout, QWidget

from .controls import buddy, plot_widget
from .loss_series import GrowingSeries, Resmoother
from .plot_axes import AXES, SECONDS, STEP, StepClock, axis_label, epoch_text, step_of_x, x_values

MIN_REDRAW_MS = 40  # at most 25 redraws a second; fewer if a redraw gets slow
HELDOUT_COLOR = (213, 94, 0)  # vermilion: apart from the blues of the training curves


class LossPlot(QWidget):
    """The plot widget with its controls; `plot` is the pyqtgraph PlotWidget (lossPlot)."""

    smoothingChanged = Signal(float)
    redrawn = Signal()  # the curves show every step received so far

    def __init__(self, parent=None):
        super().__init__(parent)
        self.series = GrowingSeries()
        self._resmoother = Resmoother(self)
        self._resmoother.done.connect(self._schedule)
        self.redraws = 0  # counted for the responsiveness probe
        self._vocab_size = 0
        self.clock = StepClock()  # each step's training time, for the time axis
        self._heldout: list = []  # engine.training.heldout.HeldoutPoint, by step (with no record shown)
        self.batch_size, self.train_docs, self._num_steps = 1, 0, 0

        self.plot = plot_widget("lossPlot", "")
        item = self.plot.getPlotItem()
        item.setLabel("bottom", "step")
        item.setLabel("left", "loss")
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
        # few points (an evaluation takes at most a tenth of the training time): drawn whole, markers on
        self.heldout_curve = pg.PlotDataItem(pen=pg.mkPen(HELDOUT_COLOR, width=2), symbol="o", symbolSize=7,
                                             symbolPen=pg.mkPen(HELDOUT_COLOR), symbolBrush=pg.mkBrush(HELDOUT_COLOR))
        item.addItem(self.heldout_curve)  # in the legend once it has a point
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
        self.x_axis_combo = QComboBox(objectName="lossXAxisCombo")
        for key, text in AXES:
            self.x_axis_combo.addItem(text, key)
        self.x_axis_combo.setToolTip("Plot the losses by step, by names seen (step x batch; an epoch is every "
                                     "training name once) or by training time (pauses and evaluations left out)")
        self.readout = QLabel(" ", objectName="plotReadout")
        self.readout.setTextInteractionFlags(Qt.TextSelectableByMouse)

        controls = QHBoxLayout()
        controls.addWidget(QLabel("Smoothing"))
        controls.addWidget(self.smoothing_slider, 1)
        controls.addWidget(self.smoothing_label)
        controls.addSpacing(12)
        controls.addWidget(self.log_y)
        controls.addSpacing(12)
        controls.addWidget(buddy("&X axis", self.x_axis_combo))
        controls.addWidget(self.x_axis_combo)
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
        self.x_axis_combo.currentIndexChanged.connect(self._on_x_axis)
        self._on_smoothing(self.smoothing_slider.value())

    # data -------------------------------------------------------------------
    @property
    def smoothing(self) -> float:
        return self.smoothing_slider.value() / 1000

    def append(self, losses: np.ndarray, first_step: int, seconds: float = float("nan")) -> None:
        """Losses of steps first_step + 1, ... that took `seconds` of training (NaN: unknown)."""
        self.series.extend(losses, first_step)
        self.clock.extend(first_step, len(losses), seconds)
        self._schedule()

    def show_run(self, record) -> None:
        """The losses to come are `record`'s (engine.training.records.RunRecord, the
        application model's copy): the plot reads them there, keeping only its
        steps and smoothed curve (called on a cleared plot, as a run opens)."""
        self.series = GrowingSeries(self.smoothing, source=record)
        self._show_heldout_in_legend()

    def let_go(self, record) -> None:
        """`record` is about to be compacted (its run ended): keep a copy of what is shown."""
        if self.series.source is record:
            self._heldout = list(record.heldout)
            self.series.detach()

    @property
    def heldout(self) -> list:
        """The held-out points shown: the record's, or the plot's own."""
        return self.series.source.heldout if self.series.source is not None else self._heldout

    def add_heldout(self, points, replacing: bool = False) -> None:
        """Held-out evaluations (HeldoutPoints); replacing: the run's whole history. With
        a record shown, it holds them already (the model took the event first)."""
        if self.series.source is None:
            if replacing:
                self._heldout = []
            for point in points:
                while self._heldout and self._heldout[-1].step >= point.step:  # rewound: a new history
                    self._heldout.pop()
                self._heldout.append(point)
        self._show_heldout_in_legend()
        self._schedule()

    def set_run(self, batch_size: int, train_docs: int) -> None:
        """The run's names per step and training names (the names-seen axis)."""
        self.batch_size, self.train_docs = batch_size, train_docs
        self._set_axis_label()

    def clear(self) -> None:
        self.series = GrowingSeries(self.smoothing)
        self.clock = StepClock()
        self._heldout = []
        self._num_steps = 0
        self.set_run(1, 0)  # no run: no epoch on the names axis
        self._show_heldout_in_legend()
        view = self.plot.getPlotItem().vb
        view.setRange(xRange=(0, 1), yRange=(0, 1), padding=0, disableAutoRange=False)  # as at start
        view.enableAutoRange(x=True, y=True)
        self._place_uniform_line()  # y spans it again
        self.redraw()

    def follow_run(self, num_steps: int) -> None:
        """Span the run's whole length on x, so the curve is seen arriving from the left
        (the y axis keeps fitting the losses; zooming or "A" work as usual). The
        time axis, whose end is not known, fits the curve."""
        self._num_steps = num_steps
        view = self.plot.getPlotItem().vb
        if self.x_axis == SECONDS:
            view.enableAutoRange(x=True, y=True)
            return
        view.enableAutoRange(x=False, y=True)
        end = x_values(self.x_axis, np.array([max(num_steps, 1)]), self.batch_size, self.clock)[0]
        view.setXRange(0, end, padding=0.02)

    @property
    def x_axis(self) -> str:
        return self.x_axis_combo.currentData()

    def set_x_axis(self, axis: str) -> None:
        index = self.x_axis_combo.findData(axis)
        if index >= 0:  # a hand-edited setting names no axis: keep the one shown
            self.x_axis_combo.setCurrentIndex(index)

    def heldout_xy(self) -> tuple[np.ndarray, np.ndarray]:
        """The held-out points as drawn: x on the current axis, and their losses."""
        steps = np.array([p.step for p in self.heldout], dtype=np.int64)
        x = x_values(self.x_axis, steps, self.batch_size, self.clock)
        y = np.array([p.loss for p in self.heldout], dtype=np.float64)
        shown = ~np.isnan(x)  # the time axis has no time for a checkpoint's steps
        return x[shown], y[shown]

    def set_vocab_size(self, vocab_size: int) -> None:
        self._vocab_size = vocab_size
        self._place_uniform_line()

    def last(self) -> tuple[float, float] | None:
        """(last loss, last smoothed loss), or None before the first step."""
        s = self.series
        return (float(s.y[s.n - 1]), float(s.smooth[s.n - 1])) if s.n else None

    def data(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies of (steps, losses, smoothed losses) at the slider's weight (applied
        here if the background one has not come yet: an export is worth the wait)."""
        s = self.series
        if s.weight != self.smoothing:
            s.set_weight(self.smoothing)
        return s.steps.copy(), s.losses.copy(), s.smoothed.copy()

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
        if self.x_axis == STEP:  # the common case: no copies
            self.raw_curve.setData(s.steps, s.losses)
            self.smooth_curve.setData(s.steps, s.smoothed)
        elif self.x_axis == SECONDS:  # slices, no copies: a checkpoint's untimed steps are left off
            timed = self.clock.timed
            self.raw_curve.setData(self.clock.t[timed], s.y[timed])
            self.smooth_curve.setData(self.clock.t[timed], s.smooth[timed])
        else:
            x = x_values(self.x_axis, s.steps, self.batch_size, self.clock)
            self.raw_curve.setData(x, s.losses)
            self.smooth_curve.setData(x, s.smoothed)
        self.heldout_curve.setData(*self.heldout_xy())
        self.redraws += 1
        # a slow redraw (huge series, slow machine) gets more room before the next one
        spent_ms = 1000 * (time.thread_time() - started)
        self._min_interval_ms = max(MIN_REDRAW_MS, 3 * spent_ms)
        self._last_redraw = time.monotonic()
        self.redrawn.emit()

    def _on_smoothing(self, value: int) -> None:
        self.smoothing_label.setText(f"{value / 1000:.3f}")
        self._resmoother.resmooth([self.series], self.smoothing)  # redrawn when done
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
        y = math.log10(level) if self.log_y.isChecked() else level
        self.uniform_line.setPos(y)
        self.uniform_line.setToolTip(f"ln({self._vocab_size}) = {level:.3f}: the loss of guessing uniformly")
        self.uniform_line.setVisible(True)
        self.legend.addItem(self.uniform_sample, self.uniform_label())
        if not self.series.n:  # an empty plot: the line its legend names is on its axes (where losses start)
            low = math.log10(level / 4) if self.log_y.isChecked() else 0.0
            self.plot.getPlotItem().vb.setYRange(low, y + 0.2 * (y - low), padding=0, update=True)
            self.plot.getPlotItem().vb.enableAutoRange(y=True)  # the first losses fit it again

    def _show_heldout_in_legend(self) -> None:
        """The held-out entry is in the legend while there is a held-out point."""
        self.legend.removeItem(self.heldout_curve)
        if self.heldout:
            self.legend.addItem(self.heldout_curve, "held-out")

    def _on_x_axis(self, *_) -> None:
        self._set_axis_label()
        self.redraw()
        if self._num_steps:
            self.follow_run(self._num_steps)
        else:
            self.plot.getPlotItem().vb.enableAutoRange(x=True, y=True)

    def _set_axis_label(self) -> None:
        label, units = axis_label(self.x_axis, self.train_docs)
        self.plot.getPlotItem().setLabel("bottom", label, units=units)

    def uniform_label(self) -> str:
        return f"uniform guess, ln {self._vocab_size}"

    def _on_mouse_moved(self, pos) -> None:
        s = self.series
        view = self.plot.getPlotItem().vb
        if not s.n or not view.sceneBoundingRect().contains(pos):
            return
        step = step_of_x(self.x_axis, view.mapSceneToView(pos).x(), self.batch_size, self.clock)
        i = min(max(step - 1, 0), s.n - 1)  # steps count from 1
        text = f"step {i + 1:,}: loss {s.y[i]:.4f}, smoothed {s.smooth[i]:.4f}"
        epoch = epoch_text(i + 1, self.batch_size, self.train_docs)  # as the status bar
        text += f", {epoch}" if epoch else ""
        before = [p for p in self.heldout if p.step <= i + 1]
        if before:
            text += f"; held-out {before[-1].loss:.4f} at step {before[-1].step:,}"
        self.readout.setText(text)
