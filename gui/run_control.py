"""Runs: the Run menu (whose actions own the keyboard shortcuts; the Train,
Stop, Reset and Sample buttons only mirror them), starting, pausing,
stopping, resuming, continuing and ending runs, and the worker's events.

A RunController is given the application model (engine.app.AppModel: the
dataset, the settings, the backend and the run), the sessions and the widgets
it drives. It moves the run model by its own starts and endings, and hands
every worker event to the application model first (which moves the run
model, grows the run's record and passes results such as snapshots on to the
explore tabs), then shows it.
What Train means comes from the model (pause, resume, continue to the Steps
setting's total, or a new run with the settings, on the backend selected or
the one "auto" chose). Anything that would discard an
unsaved model goes through the SaveGuard's question first.

Nothing here waits for the worker. Ending a run (Reset, Train a new run, Load
checkpoint, a new dataset, closing the window) asks the worker to end, shows
"stopping…" with the call it is inside, and carries on when gui.sessions says
it has finished; until then what needs a model is disabled.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMainWindow, QProgressBar, QPushButton

import engine
from engine.app import AppModel, Change
from engine.app.runs import RunChange
from engine.training import protocol as rs
from engine.training.run_model import ACTIVE, DatasetIdentity, Phase, RunModel, TrainChoice
from engine.training.records import preset_name

from .config_panel import ConfigPanel
from .loss_plot import LossPlot
from .run_guard import Autosaver, SaveGuard
from .run_progress import ProgressView, run_summary
from .sample_panel import SamplePanel
from .sessions import Session, Sessions

EDITABLE = (Phase.NONE, Phase.READY, Phase.DONE, Phase.FAILED, Phase.STOPPING)  # settings can change
STATE_MESSAGES = {Phase.RUNNING: "Training...", Phase.PAUSED: "Paused", Phase.READY: "Ready to resume training",
                  Phase.DONE: "Run ended: you can sample, save a checkpoint, continue to more steps or train again"}
STOPPED_MESSAGE = "Stopped at step {step:,}: Resume trains on; you can also sample or save a checkpoint"


def train_label(choice: TrainChoice, phase: Phase, num_steps: int) -> str:
    if choice == TrainChoice.WAIT:
        return "Opening..." if phase == Phase.OPENING else "Stopping..."
    return {TrainChoice.PAUSE: "Pause", TrainChoice.RESUME: "Resume", TrainChoice.NEW: "Train",
            TrainChoice.CONTINUE: f"Continue to {num_steps:,} steps"}[choice]


def mirror(button, action: QAction) -> None:
    """A button that triggers the action and follows its text and enabled state
    (the shortcut stays on the action: QPushButton.setText would clear the button's)."""
    button.clicked.connect(action.trigger)

    def follow() -> None:
        button.setEnabled(action.isEnabled())
        button.setText(action.text().replace("&", ""))

    action.changed.connect(follow)
    follow()


@dataclass
class RunWidgets:
    config_panel: ConfigPanel
    train_button: QPushButton
    stop_button: QPushButton
    reset_button: QPushButton
    progress_bar: QProgressBar
    loss_plot: LossPlot
    sample_panel: SamplePanel


@dataclass
class Notifier:
    """How a controller tells the user: a message box and a status-bar line."""

    show_message: Callable[..., None]        # (kind, title, text, details="", status="")
    status: Callable[[str, int], None]       # (text, milliseconds; 0: until replaced)


class RunController(QObject):
    def __init__(self, host: QMainWindow, app: AppModel, sessions: Sessions, widgets: RunWidgets,
                 notify: Notifier, ask_save_path: Callable[[], str]):
        super().__init__(host)
        self.app, self.run, self.sessions, self.w, self.notify = app, app.run, sessions, widgets, notify
        run = app.run
        self.guard = SaveGuard(host, run, self.send, ask_save_path)
        self.autosaver = Autosaver(self, run, lambda: self.session.worker if self.session else None)
        self._after_ending: Callable | None = None  # what to do once every ended worker has finished
        self._warned = False        # engine.loss_warning shown for this run
        self._told_after_end = False  # a checkpoint's outcome shown while the run was stopping
        self._stop_asked = False      # Stop sent, the worker has not stopped yet
        self.progress = ProgressView(self, widgets.progress_bar, run, sessions, note=app.build_status)
        sessions.allEnded.connect(self._on_sessions_ended)
        run.subscribe(self._on_model)
        widgets.loss_plot.redrawn.connect(self._on_redrawn)
        app.subscribe(self._on_app)
        self._host = host

    def build_menu(self) -> None:
        host = self._host
        menu = host.menuBar().addMenu("&Run")

        def action(text, slot, keys, name, tip):
            act = QAction(text, host, objectName=name, shortcut=QKeySequence(keys), toolTip=tip)
            act.triggered.connect(lambda checked=False: slot())
            menu.addAction(act)
            host.addAction(act)  # the window's: the key works wherever the focus is
            return act

        w = self.w
        self.train_action = action("&Train", self.train_or_pause, "F5", "trainAction",
                                   "Start, pause, resume or continue training (F5)")
        self.stop_action = action("&Stop", self.stop, "Shift+F5", "stopAction",
                                  "Stop training (Shift+F5); the run stays: sample, save or resume it")
        self.reset_action = action("&Reset", self.reset, "Ctrl+R", "resetAction",
                                   "Forget the run and clear the plot (Ctrl+R)")
        menu.addSeparator()
        self.sample_action = action("Sa&mple", w.sample_panel.request, "Ctrl+G", "sampleAction",
                                    "Generate names from the current parameters (Ctrl+G)")
        for button, act in ((w.train_button, self.train_action), (w.stop_button, self.stop_action),
                            (w.reset_button, self.reset_action), (w.sample_panel.sample_button, self.sample_action)):
            mirror(button, act)
            button.setToolTip(act.toolTip())
        w.sample_panel.sampleRequested.connect(self.request_samples)

    @property
    def session(self) -> Session | None:
        """The current run's Session (None with no run; ended runs are not current)."""
        return self.sessions.current

    def send(self, command: rs.Command) -> bool:
        """command to the current run's worker, if the run's phase allows it."""
        if self.session is None or not self.run.allows(command):
            return False
        self.session.worker.send(command)
        return True

    # actions ------------------------------------------------------------------
    def train_or_pause(self) -> None:
        """Train: pause or resume this run, continue it to the Steps box's total,
        or start a new one (after the save question)."""
        choice, _ = self._train_choice()
        if choice == TrainChoice.PAUSE:
            self.send(rs.Pause())
        elif choice == TrainChoice.RESUME:
            self.send(rs.Resume())
        elif choice == TrainChoice.CONTINUE:
            self.continue_to(self.app.settings.train.num_steps)
        elif choice == TrainChoice.NEW:
            self.start_run()

    def continue_to(self, num_steps: int) -> bool:
        """Extend the run to num_steps (its decay recomputed over them) and resume it."""
        if not self.send(rs.Extend(num_steps)):
            return False
        self.session.worker.send(rs.Resume())  # the model is finished until Extended: the worker decides
        return True

    def start_run(self) -> bool:
        """A new run with the current settings (once the previous one has ended, and
        after the save question); False (with a message) when it cannot start."""
        problem = self.train_problem()
        if problem:
            self.notify.show_message("warning", "Cannot train", problem)
            return False
        self.guard.confirm("Training a new run", self._open_new_run)
        return True

    def _open_new_run(self) -> None:
        identity = self.app.dataset.identity
        spec, lines = self.app.new_run()  # auto: its choice, a build started, what trains meanwhile
        self.open_run(spec, identity, None)
        if lines:
            self.notify.status(" ".join(lines[1:]) or lines[0], 0)

    def stop(self) -> None:
        """Stop after the call in progress (a large model's step cannot be cut short):
        said at once, the Stop action off until the worker has stopped."""
        if self.send(rs.Stop()):
            self._stop_asked = True
            self.notify.status("Stopping after the step in progress...", 0)
            self.progress.stop_asked()
            self.update_actions()

    def reset(self) -> None:
        """Forget the run (after the save question): its worker ends (requests it still
        has queued are dropped, but for checkpoints asked for) and the display is cleared."""
        self.guard.confirm("Reset", self.discard)

    def discard(self) -> None:
        self.clear_run()
        self.end_run(then=None)

    def request_samples(self, num_samples: int, temperature: float, seed: int,
                        max_length: int | None = None) -> None:
        """The Samples panel's names; max_length None: the backend's default."""
        if not self.send(rs.Sample(num_samples, temperature, seed, max_length=max_length)):
            self.notify.show_message("info", "Nothing to sample from", "Train a model or load a checkpoint first.")

    def train_problem(self) -> str:
        if self.run.phase == Phase.STOPPING:
            waiting = self.sessions.waiting_for()
            return "waiting for the previous run to stop" + (f" ({waiting})" if waiting else "")
        return self.app.train_problem()

    def _train_choice(self) -> tuple[TrainChoice, int]:
        train = self.app.settings.train
        return self.app.train_choice(), train.num_steps if train is not None else 0

    # sessions -------------------------------------------------------------------
    def open_run(self, spec: rs.RunSpec, dataset: DatasetIdentity | None, path: str | None) -> None:
        """End the current run, then open spec's once its worker has finished."""
        self.clear_run()
        self.end_run(then=lambda: self._open_session(spec, dataset, path))

    def _open_session(self, spec: rs.RunSpec, dataset: DatasetIdentity | None, path: str | None) -> None:
        session = self.sessions.start(spec)
        session.reports.reported.connect(self._on_event)  # on the GUI thread; silent once ended
        session.reports.reportedAfterEnd.connect(self._on_report_after_end)
        self._warned = False
        self.app.opening(dataset, path)
        self.progress.opening()
        self.run.apply(rs.Open(spec))
        session.start()

    def end_run(self, then=None, serve_saves: bool = True) -> None:
        """Ask the current run's worker to end; `then()` runs once every ended worker has
        finished (replacing what was waiting: a request superseded is dropped)."""
        self.sessions.end_current(serve_saves)
        self._after_ending = then
        self.run.apply(rs.End())
        if not self.sessions.busy_ending:
            self._on_sessions_ended()

    def _on_sessions_ended(self) -> None:
        then, self._after_ending = self._after_ending, None
        if self.run.phase == Phase.STOPPING:
            self.run.apply(rs.Closed())
        if then is not None:
            then()

    def clear_run(self) -> None:
        self.app.discard()
        w = self.w
        w.loss_plot.clear()
        w.sample_panel.clear()
        self.progress.reset()

    # the worker's events --------------------------------------------------------
    def _on_event(self, event: rs.Event) -> None:
        self.app.report(event)  # the model first (the run, its record, results); the widgets show it
        handler = self._HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    def _on_opened(self, event: rs.Opened) -> None:
        info, w = event.info, self.w
        w.loss_plot.show_run(self.app.runs.current)  # the plot reads the losses from the run's record
        w.loss_plot.set_vocab_size(info.vocab_size)
        w.loss_plot.set_run(info.train.batch_size, info.train_docs)
        w.loss_plot.follow_run(info.train.num_steps)
        self.progress.set_run(info.train.batch_size, info.train_docs)
        w.progress_bar.setRange(0, info.train.num_steps)
        w.progress_bar.setValue(info.step)
        w.sample_panel.set_block_size(info.model.block_size)  # no name is longer than the model's context

    def _on_losses(self, event: rs.Losses) -> None:
        self.w.loss_plot.append(event.losses, event.first_step, event.seconds)  # progress, status follow its redraw
        step = event.first_step + len(event.losses)
        self.progress.trained_to(step, self.run.phase == Phase.RUNNING)

    def _on_heldout(self, event: rs.Heldout) -> None:
        self.w.loss_plot.add_heldout(event.points, event.replacing)

    def _on_samples(self, event: rs.Samples) -> None:
        if event.prefix is None:
            self.w.sample_panel.show_samples(event.names, event.step)

    def _on_saved(self, event: rs.Saved) -> None:
        if event.autosave:
            self.autosaver.on_saved()
            self.notify.status(f"Autosaved to {event.path}", 10000)
            return
        self.notify.status(f"Checkpoint saved to {event.path}", 10000)
        self.guard.on_saved(event.path)

    def _on_report_after_end(self, event: rs.Event) -> None:
        """A checkpoint asked for before the run ended, written after it (or not: its
        error). The run model has moved on: only the user is told."""
        self._told_after_end = True
        if isinstance(event, rs.Saved):
            if not event.autosave:
                self.notify.status(f"Checkpoint saved to {event.path}", 10000)
        elif isinstance(event, rs.Error):
            self.notify.show_message("error", "microgpt-gui", event.message, event.details)

    def _on_extended(self, event: rs.Extended) -> None:
        self.w.progress_bar.setMaximum(event.num_steps)
        self.w.loss_plot.follow_run(event.num_steps)

    def _on_status(self, event: rs.Status) -> None:
        opening = self.run.phase == Phase.OPENING
        self.notify.status(event.text, 0 if opening else 10000)  # an opening's: until the run opens
        if opening:
            self.progress.update_text()

    def _on_error(self, event: rs.Error) -> None:
        self.guard.on_error()
        self.notify.show_message("error", "microgpt-gui", event.message, event.details)

    _HANDLERS = {rs.Opened: _on_opened, rs.Losses: _on_losses, rs.Heldout: _on_heldout, rs.Samples: _on_samples,
                 rs.Saved: _on_saved,
                 rs.Extended: _on_extended, rs.Status: _on_status, rs.Error: _on_error}

    # the model's changes --------------------------------------------------------
    def _on_app(self, app: AppModel, change: Change, subject) -> None:
        if change == Change.RUNS and subject[0] == RunChange.ENDING:
            self.w.loss_plot.let_go(subject[1])  # compacted next: the plot keeps what it shows
        elif change in (Change.DATASET, Change.SETTINGS, Change.BACKEND):
            self.update_actions()

    def _on_model(self, run: RunModel, what: str) -> None:
        if what == "phase":
            self._on_phase_changed(run.phase)
        elif what == "run" and run.phase == Phase.OPENING:
            self.autosaver.restart(f"{preset_name(run.model)}-{run.backend}" if run.model else run.backend)
        if what != "step":
            self.update_actions()

    def _on_phase_changed(self, phase: Phase) -> None:
        w = self.w
        self._stop_asked = False
        if phase != Phase.RUNNING:
            w.loss_plot.flush()
        summarize = phase == Phase.DONE and self.progress.mark is not None  # it trained here
        self.progress.phase_changed(phase)
        if phase == Phase.STOPPING:
            self._told_after_end = False
            waiting = self.sessions.waiting_for()
            self.notify.status("Stopping the run" + (f": waiting for the worker ({waiting})..."
                                                     if waiting else "..."), 0)
        if phase in STATE_MESSAGES:
            message = STATE_MESSAGES[phase]
            if phase == Phase.DONE and not self.run.finished:  # stopped: it can resume
                message = STOPPED_MESSAGE.format(step=self.run.step)
            if summarize:
                summary = self._run_summary()
                message = f"{summary}. {message}" if summary else message
            if phase == Phase.RUNNING and self.app.build_status():  # said as long as it builds
                message = (f"Training on {self.run.backend} while {self.app.build.backend} builds in the "
                           f"background; the next run uses it")
            self.notify.status(message, 0 if phase != Phase.RUNNING else 5000)
        elif phase == Phase.NONE and not self._told_after_end:  # "Stopping the run..." goes
            self.notify.status("", 0)

    def _run_summary(self) -> str:
        worker, opened_at = self.session.worker, self.run.saved_step if self.run.from_checkpoint else 0
        steps = worker.step - opened_at
        return run_summary(steps, worker.train_seconds) if steps and worker.train_seconds > 0 else ""

    def _on_redrawn(self) -> None:
        if self.run.train is not None and self.run.phase not in (Phase.OPENING, Phase.STOPPING):
            self.w.progress_bar.setValue(self.w.loss_plot.series.n)
            self.progress.update_text()
            self._warn_if_diverging()

    def _warn_if_diverging(self) -> None:
        """engine.loss_warning once per run: a finite loss far above ln(V) is a warning, not an error."""
        s = self.w.loss_plot.series
        if self._warned or not s.n or self._dataset_vocab() is None:
            return
        text = engine.loss_warning(s.y[: s.n], self._dataset_vocab())
        if text:
            self._warned = True
            self.notify.show_message("warning", "The run is diverging", text[0].upper() + text[1:])

    def _dataset_vocab(self) -> int | None:
        dataset = self.run.dataset or self.app.dataset.identity
        return dataset.vocab_size if dataset is not None else None

    # display ----------------------------------------------------------------------
    def update_actions(self, *_) -> None:
        phase, problem = self.run.phase, self.train_problem()
        choice, num_steps = self._train_choice()
        self.train_action.setText("&" + train_label(choice, phase, num_steps))
        enabled = choice in (TrainChoice.PAUSE, TrainChoice.RESUME, TrainChoice.CONTINUE) or (
            choice == TrainChoice.NEW and not problem)
        self.train_action.setEnabled(enabled)
        self.w.train_button.setToolTip(problem if choice in (TrainChoice.NEW, TrainChoice.WAIT) and problem
                                       else self.train_action.toolTip())
        self.stop_action.setEnabled(phase in ACTIVE and not self._stop_asked)
        self.reset_action.setEnabled(self.session is not None or self.w.loss_plot.series.n > 0
                                     or self._after_ending is not None)
        self.sample_action.setEnabled(self.run.has_model)
        self.w.config_panel.set_editable(phase in EDITABLE)
