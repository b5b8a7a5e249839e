"""Runs, for MainWindow (a mixin): the Run menu (whose actions own the keyboard
shortcuts; the Train, Stop, Reset and Sample buttons only mirror them),
starting, pausing, stopping and ending runs, and what the worker reports.

Nothing here waits for the worker. Ending a run (Reset, Train again, Load
checkpoint, a new dataset, closing the window) asks the worker to end, shows
"stopping…" with the call it is inside, and carries on when gui.sessions says
it has finished; until then what needs a model is disabled. A closed window
hides at once and closes when the worker has finished, or gives up after
sessions.END_BOUND_S (exit_hook).
"""
from __future__ import annotations

import time

import numpy as np
from PySide6.QtCore import QTimer
from PySide6.QtGui import QAction, QKeySequence

import engine

from . import worker as w
from . import sessions

STOPPING = "stopping"  # the window's own state while an ended run's worker finishes its call
ACTIVE = (w.RUNNING, w.PAUSED)
IDLE = ("none", w.DONE, w.FAILED)  # no run going: settings are editable and Train starts one
STOPPING_REFRESH_MS = 250  # how often "stopping… (waiting for: ...)" is refreshed
TRAIN_LABELS = {w.RUNNING: "Pause", w.PAUSED: "Resume", w.READY: "Resume", w.OPENING: "Opening...",
                STOPPING: "Stopping..."}
STATE_MESSAGES = {w.RUNNING: "Training...", w.PAUSED: "Paused", w.READY: "Ready to resume training",
                  w.DONE: "Run ended: you can sample, save a checkpoint, or train again"}


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


def mirror(button, action: QAction) -> None:
    """A button that triggers the action and follows its text and enabled state
    (the shortcut stays on the action: QPushButton.setText would clear the button's)."""
    button.clicked.connect(action.trigger)

    def follow() -> None:
        button.setEnabled(action.isEnabled())
        button.setText(action.text().replace("&", ""))

    action.changed.connect(follow)
    follow()


class RunControl:
    """Run menu, runs and worker reports, for MainWindow."""

    def _init_run_control(self) -> None:
        self._after_ending = None   # what to do once every ended run's worker has finished
        self._closing = False
        self._rate: float | None = None
        self._rate_mark: tuple[float, int] | None = None
        self._warned = False        # engine.loss_warning shown for this run
        self._checkpoint_read = None  # the latest Load checkpoint, until it reports
        self._stopping_timer = QTimer(self, interval=STOPPING_REFRESH_MS)
        self._stopping_timer.timeout.connect(self._update_progress_text)
        self._exit_timer = QTimer(self, singleShot=True)
        self._exit_timer.timeout.connect(self._give_up_waiting)
        self.sessions.allEnded.connect(self._on_sessions_ended)

    def _build_run_menu(self) -> None:
        menu = self.menuBar().addMenu("&Run")

        def action(text, slot, keys, name, tip):
            act = QAction(text, self, objectName=name, shortcut=QKeySequence(keys), toolTip=tip)
            act.triggered.connect(lambda checked=False: slot())
            menu.addAction(act)
            self.addAction(act)  # the window's: the key works wherever the focus is
            return act

        self.train_action = action("&Train", self.train_or_pause, "F5", "trainAction",
                                   "Start, pause or resume training (F5)")
        self.stop_action = action("&Stop", self.stop, "Shift+F5", "stopAction",
                                  "Stop the run (Shift+F5); you can still sample and save")
        self.reset_action = action("&Reset", self.reset, "Ctrl+R", "resetAction",
                                   "Forget the run and clear the plot (Ctrl+R)")
        menu.addSeparator()
        self.sample_action = action("Sa&mple", self.sample_panel.request, "Ctrl+G", "sampleAction",
                                    "Generate names from the current parameters (Ctrl+G)")
        for button, act in ((self.train_button, self.train_action), (self.stop_button, self.stop_action),
                            (self.reset_button, self.reset_action),
                            (self.sample_panel.sample_button, self.sample_action)):
            mirror(button, act)
            button.setToolTip(act.toolTip())
        self.sample_panel.sampleRequested.connect(self.request_samples)

    @property
    def session(self):
        """The current run's Session (None with no run; ended runs are not current)."""
        return self.sessions.current

    # actions ------------------------------------------------------------------
    def train_or_pause(self) -> None:
        """Train starts a run; while it runs the same action pauses and resumes."""
        if self.state == w.RUNNING:
            self.session.worker.pause()
        elif self.state in (w.PAUSED, w.READY):
            self.session.worker.resume()
        elif self.state in IDLE:
            self.start_run()

    def start_run(self) -> bool:
        """Start a run with the current settings (once a previous run has ended)."""
        problem = self._train_problem()
        if problem:
            self.show_message("warning", "Cannot train", problem)
            return False
        cp = self.config_panel
        self._start_session(w.RunSpec(cp.backend_name(), self.corpus, cp.model_config(), cp.train_config()))
        return True

    def stop(self) -> None:
        if self.session is not None:
            self.session.worker.stop()

    def reset(self) -> None:
        """Forget the run: its worker ends (requests it still has queued are dropped,
        a checkpoint being read is not loaded) and the display is cleared."""
        self._checkpoint_read = None
        self._clear_run()
        self._end_run(then=None, serve_saves=False)

    def request_samples(self, num_samples: int, temperature: float, seed: int,
                        max_length: int | None = None) -> None:
        if self.session is None or self.state not in w.HAS_MODEL:
            self.show_message("info", "Nothing to sample from", "Train a model or load a checkpoint first.")
            return
        self.session.worker.request_samples(num_samples, temperature, seed, max_length=max_length)

    def _train_problem(self) -> str:
        if self.state == STOPPING:
            waiting = self.sessions.waiting_for()
            return "waiting for the previous run to stop" + (f" ({waiting})" if waiting else "")
        if self.corpus is None:
            return ("reading the dataset..." if self.reading_dataset
                    else "open a dataset first (File > Open dataset...)")
        return self.config_panel.problem()

    # sessions -------------------------------------------------------------------
    def _start_session(self, spec: w.RunSpec) -> None:
        """End the current run, then open spec's once its worker has finished."""
        self._clear_run()
        self._end_run(then=lambda: self._open_session(spec))

    def _open_session(self, spec: w.RunSpec) -> None:
        session = self.sessions.start(spec)
        reports = session.reports  # on the GUI thread, and silent once the session has ended
        reports.opened.connect(self._on_opened)
        reports.losses.connect(self._on_losses)
        reports.samples.connect(self._on_samples)
        reports.saved.connect(self._on_saved)
        reports.stateChanged.connect(self._on_state)
        reports.status.connect(self._on_status)
        reports.error.connect(self._on_error)
        self._explore_session_started(session)
        self._warned = False
        self._set_state(w.OPENING)
        session.start()

    def _end_run(self, then=None, serve_saves: bool = True) -> None:
        """Ask the current run's worker to end; `then()` runs once every ended worker has
        finished (replacing what was waiting: a request superseded is dropped)."""
        self.sessions.end_current(serve_saves)
        self._after_ending = then
        if self.sessions.busy_ending:
            self._set_state(STOPPING)
            return
        self._after_ending = None
        self._set_state("none")
        if then is not None:
            then()

    def _on_sessions_ended(self) -> None:
        if self._closing:
            self.close()
            return
        then, self._after_ending = self._after_ending, None
        if self.state == STOPPING:
            self._set_state("none")
        if then is not None:
            then()

    def _clear_run(self) -> None:
        self._explore_cleared()
        self.run_info = None
        self.loss_plot.clear()
        self.sample_panel.clear()
        self._show_dataset_info()
        self._reset_progress()
        self._update_status()

    # closing ----------------------------------------------------------------------
    def closeEvent(self, event) -> None:
        if not self._closing:
            self._closing = True
            self.save_settings()
            self._explore_close()
            self._checkpoint_read = self._dataset_read = None
            self._end_run()
        if self.sessions.busy_ending:  # hide now, close when the worker has finished
            event.ignore()
            self.hide()
            if not self._exit_timer.isActive():
                self._exit_timer.start(int(1000 * sessions.END_BOUND_S))
            return
        self._exit_timer.stop()
        super().closeEvent(event)
        self.closed.emit()

    def _give_up_waiting(self) -> None:
        if self.sessions.busy_ending:
            self.exit_hook(f"the training thread is still busy ({self.sessions.waiting_for() or 'ending'}) "
                           f"{sessions.END_BOUND_S:g} s after the window was closed; exiting without waiting for it")

    # worker reports -----------------------------------------------------------
    def _on_opened(self, info: w.RunInfo) -> None:
        self.run_info = info
        self.config_panel.set_configs(info.model, info.train)
        self.config_panel.select_backend(info.backend)
        self.loss_plot.set_vocab_size(info.vocab_size)
        self.loss_plot.follow_run(info.train.num_steps)
        from_checkpoint = self.session.worker.spec.checkpoint is not None
        self._show_dataset_info(info if from_checkpoint else None)
        self.progress_bar.setRange(0, info.train.num_steps)
        self.progress_bar.setValue(info.step)
        self._update_status()
        self._explore_opened(info, from_checkpoint)

    def _on_losses(self, losses: np.ndarray, first_step: int, seconds: float) -> None:
        self.loss_plot.append(losses, first_step)  # progress and status follow its redraw
        self._explore_losses(losses, first_step, seconds)
        step, now = first_step + len(losses), time.monotonic()
        if self._rate_mark is not None and now > self._rate_mark[0] and step > self._rate_mark[1]:
            rate = (step - self._rate_mark[1]) / (now - self._rate_mark[0])
            self._rate = rate if self._rate is None else 0.8 * self._rate + 0.2 * rate
        if self.state == w.RUNNING:
            self._rate_mark = (now, step)

    def _on_redrawn(self) -> None:
        if self.run_info is not None and self.state not in (w.OPENING, STOPPING):
            self.progress_bar.setValue(self.loss_plot.series.n)
            self._update_progress_text()
            self._warn_if_diverging()
        self._update_status()

    def _warn_if_diverging(self) -> None:
        """engine.loss_warning once per run: a finite loss far above ln(V) is a warning, not an error."""
        s = self.loss_plot.series
        if self._warned or not s.n:
            return
        text = engine.loss_warning(s.y[: s.n], self.run_info.vocab_size)
        if text:
            self._warned = True
            self.show_message("warning", "The run is diverging", text[0].upper() + text[1:])

    def _on_samples(self, names: list, step: int) -> None:
        self.sample_panel.show_samples(names, step)

    def _on_saved(self, path: str) -> None:
        self.statusBar().showMessage(f"Checkpoint saved to {path}", 10000)

    def _on_status(self, text: str) -> None:
        self.statusBar().showMessage(text, 10000)
        if self.state == w.OPENING:
            self.progress_bar.setRange(0, 0)
            self.progress_bar.setFormat(text)

    def _on_error(self, message: str, details: str) -> None:
        self.show_message("error", "microgpt-gui", message, details)

    def _on_state(self, state: str) -> None:
        if state != w.CLOSED:
            self._set_state(state)

    def _set_state(self, state: str) -> None:
        before, self.state = self.state, state
        if state != w.RUNNING:
            self.loss_plot.flush()
        if state == w.RUNNING:
            self._rate_mark = (time.monotonic(), self.progress_bar.value())
        if state == w.FAILED:
            self._reset_progress()
        if state == STOPPING:
            self._reset_progress()  # an empty bar with "stopping… (waiting for: ...)" as its text
            self._stopping_timer.start()
            waiting = self.sessions.waiting_for()
            self.statusBar().showMessage("Stopping the run" + (f": waiting for the worker ({waiting})..."
                                                               if waiting else "..."))
        elif before == STOPPING:
            self._stopping_timer.stop()
            self._reset_progress()
            self.statusBar().clearMessage()
        self._update_progress_text()
        self._update_controls()
        if state in STATE_MESSAGES:
            message = STATE_MESSAGES[state]
            if state == w.DONE and before in ACTIVE:
                message = f"{self._run_summary()}. {message}"
            self.statusBar().showMessage(message, 0 if state != w.RUNNING else 5000)
        self._explore_state(state)
        self.stateChanged.emit(state)

    def _run_summary(self) -> str:
        worker, info = self.session.worker, self.run_info
        steps = worker.step - (info.step if info else 0)
        return run_summary(steps, worker.train_seconds) if steps and worker.train_seconds > 0 else "Stopped"

    def _update_run_actions(self, state: str, problem: str) -> None:
        self.train_action.setText("&" + TRAIN_LABELS.get(state, "Train"))
        can_start = state in IDLE and not problem
        self.train_action.setEnabled(state in (w.RUNNING, w.PAUSED, w.READY) or can_start)
        self.train_button.setToolTip(problem if state in IDLE + (STOPPING,) and problem
                                     else self.train_action.toolTip())
        self.stop_action.setEnabled(state in ACTIVE)
        self.reset_action.setEnabled(self.session is not None or self.loss_plot.series.n > 0
                                     or self._after_ending is not None)
        self.sample_action.setEnabled(state in w.HAS_MODEL)
