"""Never lose a run: the Save / Discard / Cancel question before an action
would discard a model that trained since it was last saved or loaded, and
the autosave clock.

SaveGuard.confirm(doing, then) calls then() at once when nothing would be
lost (or the question is turned off); otherwise it asks, window-modal and
non-blocking (the worker keeps training meanwhile). Save writes a checkpoint
first (to the file the run was last saved to or loaded from, else one the
user picks) and goes on once the worker reports it written (an action asked
for meanwhile, say Quit, goes on instead); a failed save goes no further.
Discard goes on; Cancel leaves everything as it was.

Autosaver sends an autosave Save every N minutes of training (the worker's
own train_seconds: pauses and stopped runs do not count) into the data
directory, and prunes the autosaves there to the newest few, off the GUI
thread.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QWidget

from engine.training import protocol as rs
from engine.training.autosave import DEFAULT_KEEP, AutosaveClock, autosave_dir, autosave_path, prune_autosaves
from engine.training.run_model import RunModel

from .background import run_in_background
from .dialogs import DISCARD, SAVE, ask_to_save

AUTOSAVE_POLL_MS = 2000  # how often the autosave clock is read


class SaveGuard(QObject):
    def __init__(self, parent: QWidget, run: RunModel, send: Callable[[rs.Command], None],
                 ask_save_path: Callable[[], str]):
        super().__init__(parent)
        self._parent, self._run, self._send, self._ask_save_path = parent, run, send, ask_save_path
        self.enabled = True
        self.question = None              # the open question box
        self._waiting: tuple[str, Callable] | None = None  # (checkpoint path, then) until it is written

    @property
    def busy(self) -> bool:
        """A question is open or its save is being written."""
        return self.question is not None or self._waiting is not None

    def needed(self) -> bool:
        return self.enabled and self._run.unsaved

    def confirm(self, doing: str, then: Callable[[], None]) -> bool:
        """then() now (True) or after the question's Save or Discard (False)."""
        if not self.needed():
            then()
            return True
        if self.question is not None:  # one question at a time: the newer action is dropped
            return False
        if self._waiting is not None:  # a save is being written: the newest action follows it
            self._waiting = (self._waiting[0], then)
            return False
        run = self._run
        since = Path(run.saved_path).name if run.saved_path else ""
        if run.step == run.saved_step:  # running: its first steps are not reported yet
            text = (f"The model is training on from {since}." if since
                    else "The model is training and has not been saved.")
        elif since:
            text = (f"The model has trained {run.step - run.saved_step:,} steps since {since} "
                    f"(it is at step {run.step:,}).")
        else:
            text = f"The model has trained {run.step:,} steps and has not been saved."
        text += f" {doing} discards it."
        self.question = ask_to_save(self._parent, text, lambda answer: self._answered(answer, then))
        return False

    def forget(self) -> None:
        """The window is going: no continuation runs after this."""
        self._waiting = None
        if self.question is not None:
            question, self.question = self.question, None
            question.finished.disconnect()
            question.close()

    def _answered(self, answer: str, then: Callable[[], None]) -> None:
        self.question = None
        if answer == DISCARD or (answer == SAVE and not self._run.has_model):
            then()  # (the run ended meanwhile: nothing left to save)
        elif answer == SAVE:
            path = self._run.saved_path or self._ask_save_path()
            if not path:
                return  # no file chosen: as Cancel
            self._waiting = (str(path), then)
            self._send(rs.Save(str(path)))

    def on_saved(self, path: str) -> None:
        if self._waiting is not None and self._waiting[0] == path:
            then, self._waiting = self._waiting[1], None
            then()

    def on_error(self) -> None:
        """An error while a save was awaited: the save failed; go no further."""
        self._waiting = None


class Autosaver(QObject):
    """Every N minutes of training, a checkpoint into `folder`, the newest `keep` kept."""

    def __init__(self, parent: QObject, run: RunModel, worker: Callable[[], object]):
        super().__init__(parent)
        self._run, self._worker = run, worker  # worker(): the current run's TrainingWorker or None
        self.clock = AutosaveClock()
        self.keep = DEFAULT_KEEP
        self.folder: Path = autosave_dir()
        self.run_name = "run"
        self._timer = QTimer(self, interval=AUTOSAVE_POLL_MS)
        self._timer.timeout.connect(self.poll)
        self._timer.start()

    def set_minutes(self, minutes: float) -> None:
        self.clock.minutes = float(minutes)

    def restart(self, name: str) -> None:
        """A new run: its clock starts at its first step."""
        self.run_name = name
        self.clock.restart(0.0)

    def poll(self) -> None:
        worker = self._worker()
        if worker is None or not self._run.has_model or not self.clock.due(worker.train_seconds):
            return
        self.clock.restart(worker.train_seconds)
        worker.send(rs.Save(str(autosave_path(self.folder, self.run_name, worker.step)), autosave=True))

    def on_saved(self) -> None:
        run_in_background(prune_autosaves, self.folder, self.keep, parent=self, name="prune-autosaves")
