"""The run the window shows, Qt-free: its phase, with every allowed transition
in one table (TRANSITIONS), and what the run is (dataset, configs, backend,
step, saved or not, where). The window's controllers observe a RunModel
(`subscribe`) and ask it what is allowed; the worker moves its own phase by
the same table.

    none --Train / Load--> opening --opened--> ready --Resume--> running --Pause--> paused
                             |                  |                |   ^---Resume------'  |
                           failed             Stop        Stop / last step             Stop
                             v                  v                v                      v
                           failed              done <------------+----------------------+
    done --Resume (a stopped run) or Continue to N steps--> running
    any phase --Reset / a new run / Load / Open dataset / close--> stopping --worker ended--> none
"""
from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, replace
from typing import Callable

from ..config import ModelConfig, TrainConfig
from ..data.corpus import Corpus
from .protocol import (Closed, Command, End, Extend, Failed, Finished, Open, Opened, Pause, Resume, Sample,
                        Save, Stop, TakeSnapshot, WantSnapshots)


class Phase(str, enum.Enum):
    """Where a run is in its life (a str: "done" == Phase.DONE)."""

    NONE = "none"          # no run
    OPENING = "opening"    # its backend is being opened (or built, on first use)
    READY = "ready"        # opened from a checkpoint, not training yet
    RUNNING = "running"
    PAUSED = "paused"
    DONE = "done"          # not training: stopped (it can resume) or at its last step
    FAILED = "failed"      # opening failed: there is no model
    STOPPING = "stopping"  # ended: its worker finishes the call it is inside

    def __str__(self) -> str:
        return self.value


_SAME = object()  # a command that leaves the phase as it is
_MODEL_REQUESTS = {Sample: _SAME, Save: _SAME, TakeSnapshot: _SAME, WantSnapshots: _SAME, End: Phase.STOPPING}

# (phase, trigger) -> the phase after it. Absent: refused in that phase.
TRANSITIONS: dict[Phase, dict[type, object]] = {
    Phase.NONE: {Open: Phase.OPENING, End: Phase.NONE, WantSnapshots: _SAME},
    Phase.OPENING: {Opened: Phase.READY, Failed: Phase.FAILED, WantSnapshots: _SAME, End: Phase.STOPPING},
    Phase.READY: {Resume: Phase.RUNNING, Stop: Phase.DONE, Finished: Phase.DONE, Extend: _SAME,
                  **_MODEL_REQUESTS},
    Phase.RUNNING: {Pause: Phase.PAUSED, Stop: Phase.DONE, Finished: Phase.DONE, **_MODEL_REQUESTS},
    Phase.PAUSED: {Resume: Phase.RUNNING, Stop: Phase.DONE, **_MODEL_REQUESTS},
    Phase.DONE: {Resume: Phase.RUNNING, Extend: _SAME, **_MODEL_REQUESTS},
    Phase.FAILED: {WantSnapshots: _SAME, End: Phase.STOPPING},
    Phase.STOPPING: {End: Phase.STOPPING, Closed: Phase.NONE, WantSnapshots: _SAME},
}
HAS_MODEL = frozenset(p for p, row in TRANSITIONS.items() if Sample in row)  # it can sample and save
ACTIVE = frozenset((Phase.RUNNING, Phase.PAUSED))
TRIGGERS = sorted({t for row in TRANSITIONS.values() for t in row}, key=lambda t: t.__name__)


class Refused(ValueError):
    """A command that the run's phase does not allow."""


def next_phase(phase: Phase, trigger) -> Phase:
    """The phase after `trigger` (a command or an event, or its class) in `phase`;
    Refused when the table does not allow it."""
    kind = trigger if isinstance(trigger, type) else type(trigger)
    row = TRANSITIONS[Phase(phase)]
    if kind not in row:
        raise Refused(f"{kind.__name__} is not possible while the run is {Phase(phase).value}")
    target = row[kind]
    return Phase(phase) if target is _SAME else target


def allows(phase: Phase, trigger) -> bool:
    kind = trigger if isinstance(trigger, type) else type(trigger)
    return kind in TRANSITIONS[Phase(phase)]


# ---- what a run is ------------------------------------------------------------------------

@dataclass(frozen=True)
class DatasetIdentity:
    """Which dataset a run trained on: runs of different content are not comparable."""

    name: str          # the file's name, or the checkpoint's dataset as "<checkpoint>'s dataset"
    num_docs: int
    vocab_size: int
    content_hash: str  # of the documents in training order and the vocabulary

    @classmethod
    def of(cls, corpus: Corpus, name: str) -> "DatasetIdentity":
        digest = hashlib.sha256("".join(corpus.chars).encode("utf-8") + b"\0")
        digest.update("\n".join(corpus.docs).encode("utf-8"))
        return cls(name, len(corpus), corpus.vocab_size, digest.hexdigest()[:16])

    def same_content(self, other: "DatasetIdentity | None") -> bool:
        return other is not None and other.content_hash == self.content_hash


class TrainChoice(str, enum.Enum):
    """What the Train action does now."""

    PAUSE = "pause"
    RESUME = "resume"
    CONTINUE = "continue"  # extend a run to the Steps box's total, then resume
    NEW = "new"            # a new run with the settings (after the save question)
    WAIT = "wait"          # a run is opening or stopping


@dataclass
class RunModel:
    """The current run, observed by the window's controllers. Phases the worker owns
    (ready, running, paused, done, failed) follow its reports (`report`); the
    window's own (none, opening, stopping) follow `apply`. Observers get
    (model, what): what is "phase", "run", "step" or "saved"."""

    phase: Phase = Phase.NONE
    dataset: DatasetIdentity | None = None
    model: ModelConfig | None = None
    train: TrainConfig | None = None
    backend: str = ""
    step: int = 0
    saved_step: int = 0            # the step last saved or loaded (trained since: unsaved)
    saved_path: str | None = None  # where it was last saved or loaded from
    from_checkpoint: bool = False

    def __post_init__(self):
        self._observers: list[Callable[["RunModel", str], None]] = []

    def subscribe(self, observer: Callable[["RunModel", str], None]) -> None:
        self._observers.append(observer)

    def _notify(self, what: str) -> None:
        for observer in list(self._observers):
            observer(self, what)

    # questions ----------------------------------------------------------------
    @property
    def has_model(self) -> bool:
        return self.phase in HAS_MODEL

    @property
    def unsaved(self) -> bool:
        """A model that trained since it was last saved or loaded (closing it loses that);
        a running one is, from its start (its first steps may not be reported yet)."""
        return self.has_model and (self.step > self.saved_step or self.phase == Phase.RUNNING)

    @property
    def finished(self) -> bool:
        return self.train is not None and self.step >= self.train.num_steps

    def allows(self, command: Command) -> bool:
        """The table's answer, and a finished run does not resume."""
        if isinstance(command, Resume) and self.finished:
            return False
        if isinstance(command, Extend) and command.num_steps < self.step:
            return False
        return allows(self.phase, command)

    def train_choice(self, backend: str, model: ModelConfig | None, train: TrainConfig | None) -> TrainChoice:
        """Train's meaning with these settings: pause or resume this run, continue it to
        more steps, or start a new one (another configuration, or this run is over)."""
        if self.phase in (Phase.OPENING, Phase.STOPPING):
            return TrainChoice.WAIT
        if self.phase == Phase.RUNNING:
            return TrainChoice.PAUSE
        if self.phase == Phase.PAUSED:
            return TrainChoice.RESUME
        if self.phase not in (Phase.READY, Phase.DONE) or not self.same_run(backend, model, train):
            return TrainChoice.NEW
        if train.num_steps != self.train.num_steps:  # below the step: cannot go on to it
            return TrainChoice.CONTINUE if train.num_steps > self.step else TrainChoice.NEW
        return TrainChoice.NEW if self.finished else TrainChoice.RESUME

    def same_run(self, backend: str, model: ModelConfig | None, train: TrainConfig | None) -> bool:
        """These settings are this run's, but perhaps for its number of steps."""
        return (model is not None and train is not None and self.train is not None and backend == self.backend
                and model == self.model and replace(train, num_steps=self.train.num_steps) == self.train)

    # changes ----------------------------------------------------------------------
    def apply(self, trigger) -> Phase:
        """Move by the table (Refused if it does not allow trigger here)."""
        phase = next_phase(self.phase, trigger)
        if isinstance(trigger, Open):
            self._begin(trigger)  # before the phase: observers of "opening" see the new run
        self._set_phase(phase)
        if isinstance(trigger, Open):
            self._notify("run")
        return self.phase

    def report(self, phase: Phase) -> None:
        """The worker's phase, as it reported it (it moved by the same table)."""
        if self.phase != Phase.STOPPING:  # an ended run's last reports change nothing
            self._set_phase(Phase(phase))

    def opened(self, event: Opened, dataset: DatasetIdentity | None, path: str | None = None) -> None:
        info = event.info
        self.model, self.train, self.backend, self.step = info.model, info.train, info.backend, info.step
        self.dataset, self.from_checkpoint = dataset, event.from_checkpoint
        self.saved_step, self.saved_path = info.step, path if event.from_checkpoint else None
        self._notify("run")

    def extended(self, num_steps: int) -> None:
        self.train = replace(self.train, num_steps=num_steps)
        self._notify("run")

    def trained_to(self, step: int) -> None:
        if step != self.step:
            self.step = step
            self._notify("step")

    def saved(self, path: str, step: int) -> None:
        self.saved_step, self.saved_path = step, path
        self._notify("saved")

    def _begin(self, command: Open) -> None:
        spec = command.spec
        self.model, self.train, self.backend = spec.model, spec.train, spec.backend
        self.step = self.saved_step = 0
        self.saved_path, self.dataset, self.from_checkpoint = None, None, spec.checkpoint is not None

    def _set_phase(self, phase: Phase) -> None:
        if phase != self.phase:
            self.phase = phase
            if phase == Phase.NONE:
                self.model = self.train = self.dataset = None
                self.step = self.saved_step = 0
                self.saved_path = None
            self._notify("phase")


def extend_backend(backend, num_steps: int):
    """A backend continuing `backend`'s run to num_steps: its state reopened as a
    checkpoint resumed with num_steps is (the learning rate's linear decay is over
    the new total). The old backend stays open: the caller closes it."""
    from ..backends import load_checkpoint  # the registry imports the backends: only when used
    from .checkpoint import Checkpoint

    state = backend.get_state()
    checkpoint = Checkpoint(backend.model, backend.train_config, backend.corpus, state.params, state.m, state.v,
                            state.step, backend.loss_history, backend.name, backend.heldout_history)
    return load_checkpoint(checkpoint, backend=backend.name, num_steps=num_steps)
