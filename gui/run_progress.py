"""The run's progress bar and the figures it shows: steps, rate and ETA while
training, "stopping… (waiting for: …)" while an ended run's worker finishes
its call, and what an opening is doing (a compiled backend builds its
kernels on first use, which can take minutes) and for how many seconds so
far. Also the small formats the status bar uses (rates, durations, the
end-of-run summary).
"""
from __future__ import annotations

import time
from typing import Callable

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QProgressBar

from engine.training.run_model import Phase, RunModel

from .plot_axes import epoch_text
from .sessions import Sessions

REFRESH_MS = 250  # how often "stopping…" and an opening's seconds are refreshed


def format_rate(rate: float) -> str:
    """Two significant digits: 6,667 -> '6,700', 41.3 -> '41', 0.432 -> '0.43'."""
    rounded = float(f"{rate:.2g}")
    return f"{rounded:,.0f}" if rounded >= 10 else f"{rounded:g}"


def format_duration(seconds: float) -> str:
    """'1:05' (m:ss) or '1:02:03' (h:mm:ss)."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def format_seconds(seconds: float) -> str:
    """'0.15 s' (two significant digits) under a minute, else '1:22 min' or '1:02:03'."""
    if seconds < 60:
        return f"{float(f'{seconds:.2g}'):g} s"
    return format_duration(seconds) + (" min" if seconds < 3600 else "")


def run_summary(steps: int, seconds: float) -> str:
    """'1,000 steps in 0.15 s (6,700 steps/s)'."""
    return f"{steps:,} steps in {format_seconds(seconds)} ({format_rate(steps / seconds)} steps/s)"


class ProgressView(QObject):
    """The progress bar of the run model's run, with the training rate it measures."""

    def __init__(self, parent: QObject, bar: QProgressBar, run: RunModel, sessions: Sessions,
                 note: Callable[[], str] = str):
        super().__init__(parent)
        self.bar, self.run, self.sessions = bar, run, sessions
        self._note = note  # () -> what else goes on ("building futhark-c in the background...: 12 s so far")
        self.rate: float | None = None          # steps per second, smoothed
        self.mark: tuple[float, int] | None = None  # (time, step) of the last rate measurement
        self._opening_since = 0.0
        self.batch_size, self.train_docs = 1, 0  # the run's names per step and training names
        self.stopping = False  # Stop asked, the step in progress not ended yet
        self._timer = QTimer(self, interval=REFRESH_MS)
        self._timer.timeout.connect(self.update_text)
        self.reset()

    def set_run(self, batch_size: int, train_docs: int) -> None:
        self.batch_size, self.train_docs = batch_size, train_docs

    def opening(self) -> None:
        self._opening_since = time.monotonic()

    def trained_to(self, step: int, running: bool) -> None:
        now = time.monotonic()
        if self.mark is not None and now > self.mark[0] and step > self.mark[1]:
            rate = (step - self.mark[1]) / (now - self.mark[0])
            self.rate = rate if self.rate is None else 0.8 * self.rate + 0.2 * rate
        if running:
            self.mark = (now, step)

    def stop_asked(self) -> None:
        self.stopping = True
        self.update_text()

    def phase_changed(self, phase: Phase) -> None:
        self.stopping = False
        if phase == Phase.RUNNING:
            self.mark = (time.monotonic(), self.bar.value())
        if phase in (Phase.FAILED, Phase.STOPPING, Phase.NONE):
            self.reset()  # stopping: an empty bar with "stopping… (waiting for: ...)"
        if phase in (Phase.STOPPING, Phase.OPENING):
            self._timer.start()
        else:
            self._timer.stop()
        self.update_text()

    def update_text(self) -> None:
        bar, phase = self.bar, self.run.phase
        if phase == Phase.STOPPING:
            waiting = self.sessions.waiting_for()
            bar.setFormat("stopping…" + (f" (waiting for: {waiting})" if waiting else ""))
            return
        if phase == Phase.OPENING:  # a compiled backend may build for minutes on first use: count them
            # not a busy bar (range 0..0): Qt draws no text on one
            bar.setRange(0, 1)
            bar.setValue(0)
            elapsed = time.monotonic() - self._opening_since
            session = self.sessions.current
            doing = (session.waiting_for if session is not None else "") or f"opening the {self.run.backend} backend"
            bar.setFormat(f"{doing}… {elapsed:.0f} s")
            return
        if self.run.train is None:
            return
        step, total = bar.value(), bar.maximum()
        text = f"{step:,} / {total:,} steps"
        epoch = epoch_text(step, self.batch_size, self.train_docs, always=True, names=True)
        text += f"  ·  {epoch}" if epoch else ""
        if phase in (Phase.RUNNING, Phase.PAUSED) and self.stopping:
            text += "  ·  stopping after this step…"
        elif phase == Phase.RUNNING and self.rate:
            text += f"  ·  {self.rate:,.0f} steps/s  ·  ETA {format_duration((total - step) / self.rate)}"
        elif phase in (Phase.PAUSED, Phase.DONE, Phase.READY):
            text += {Phase.PAUSED: "  ·  paused", Phase.DONE: "  ·  done" if step >= total else "  ·  stopped",
                     Phase.READY: "  ·  ready"}[phase]
        note = self._note() if phase in (Phase.RUNNING, Phase.PAUSED, Phase.DONE, Phase.READY) else ""
        bar.setFormat(text + (f"  ·  {note}" if note else ""))

    def reset(self) -> None:
        self.bar.setRange(0, 1)
        self.bar.setValue(0)
        self.bar.setFormat("no run")
        self.rate = self.mark = None
