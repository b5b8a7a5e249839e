"""The training worker's protocol, written once: the commands a window sends
(`TrainingWorker.send`), the events it gets back (one `event` signal), and
what a run is opened from. Plain dataclasses, Qt-free: engine.training.run_model's table
says in which phase each command is allowed; engine.training.loop carries them out.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..config import ModelConfig, TrainConfig
from ..data.corpus import Corpus


# ---- what a run is opened from and what it reports when open ------------------------------

@dataclass(frozen=True)
class RunSpec:
    """How to open a run: a fresh one, or one resumed from a checkpoint."""

    backend: str
    corpus: Corpus | None = None
    model: ModelConfig | None = None
    train: TrainConfig | None = None
    checkpoint: object | None = None  # an engine checkpoint, already read and checked
    autostart: bool = True


@dataclass(frozen=True)
class RunInfo:
    """What the window shows about an opened run (sent once, by Opened)."""

    backend: str
    model: ModelConfig
    train: TrainConfig
    num_params: int
    vocab_size: int
    num_docs: int
    step: int
    holdout: int = 0  # documents held out (resolved: the default is a count here)

    @property
    def train_docs(self) -> int:
        """Documents the run trains on: an epoch is this many names."""
        return self.num_docs - self.holdout


# ---- commands: window -> worker ---------------------------------------------------------

class Command:
    """Something the window asks of the run (engine.training.run_model.TRANSITIONS says when it may)."""


@dataclass(frozen=True)
class Open(Command):
    """Start a run (the window's own: it starts a worker with the spec)."""

    spec: RunSpec


@dataclass(frozen=True)
class Pause(Command):
    pass


@dataclass(frozen=True)
class Resume(Command):
    """Train on: after a pause, a Stop, or a checkpoint's load."""


@dataclass(frozen=True)
class Stop(Command):
    """End training but keep the run: it can sample, save, resume or go on."""


@dataclass(frozen=True)
class Extend(Command):
    """Make the run num_steps long (its learning-rate decay recomputed over the new
    total), as a checkpoint resumed with num_steps is."""

    num_steps: int


@dataclass(frozen=True)
class Sample(Command):
    """Names by Samples; with a prefix (even ""), names that start with it;
    max_length None: the backend's default (Backend.default_max_length)."""

    num_samples: int
    temperature: float
    seed: int
    prefix: str | None = None
    max_length: int | None = None


@dataclass(frozen=True)
class Save(Command):
    path: str
    autosave: bool = False  # written by the autosave clock, not asked for


@dataclass(frozen=True)
class TakeSnapshot(Command):
    """One parameter snapshot after the current call."""


@dataclass(frozen=True)
class WantSnapshots(Command):
    """Whether to send snapshots while training (an inspect panel is on screen)."""

    wanted: bool


@dataclass(frozen=True)
class End(Command):
    """End the worker: cancel a sample in progress, drop queued requests (but write
    queued checkpoints when serve_saves), close the backend, finish."""

    serve_saves: bool = True


# ---- events: worker -> window --------------------------------------------------------------

class Event:
    """Something the worker reports (one signal carries them all)."""


@dataclass(frozen=True)
class Opened(Event):
    info: RunInfo
    from_checkpoint: bool


@dataclass(frozen=True)
class Finished(Event):
    """Training reached its last step."""


@dataclass(frozen=True)
class Failed(Event):
    """Opening the run failed: there is no model."""


@dataclass(frozen=True)
class Closed(Event):
    """The worker has closed its backend and ended."""


@dataclass(frozen=True, eq=False)
class Losses(Event):
    losses: np.ndarray
    first_step: int
    seconds: float  # the time they took; NaN: not timed (e.g. from a checkpoint)


@dataclass(frozen=True)
class Heldout(Event):
    """Held-out evaluations (engine.training.heldout.HeldoutPoint): one after a chunk or at
    the end, or a checkpoint's whole history when it opens (replacing: True)."""

    points: tuple
    replacing: bool = False


@dataclass(frozen=True)
class Samples(Event):
    names: list
    step: int              # the step whose parameters made them
    prefix: str | None = None  # None: the Sample panel's; else the prefix asked for


@dataclass(frozen=True, eq=False)
class SnapshotReady(Event):
    snapshot: object  # an engine.model.introspect.Snapshot


@dataclass(frozen=True)
class Saved(Event):
    path: str
    step: int
    autosave: bool = False


@dataclass(frozen=True)
class Extended(Event):
    num_steps: int


@dataclass(frozen=True)
class PhaseChanged(Event):
    phase: object  # an engine.training.run_model.Phase


@dataclass(frozen=True)
class Status(Event):
    text: str


@dataclass(frozen=True)
class Error(Event):
    message: str
    details: str = ""  # e.g. a compiler's log (EngineError.details)
    # what was raised, for a caller that reports it its own way (the command line)
    exception: BaseException | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Diverged(Event):
    step: int  # training stopped at this step on a non-finite loss
