"""The application model: every fact the window shows about what it works on,
stored once, Qt-free (napari's layout: a plain core whose changes the Qt
layer observes).

    dataset   the file in use (its corpus and identity), a file being read, why the last read failed
    settings  the preset, the model and training configs the fields describe (or why they are invalid)
    backend   the backend selected: a name, or "auto" (engine.backends.choice), and for auto the
              choice for these settings and a Futhark library building in the background
    run       the run on show (engine.training.run_model.RunModel: its phase, stored there only)
    runs      the session's runs and their losses (engine.app.runs.RunHistory), the current run's
              record grown from the worker's events (`report`)

Front ends change it by its methods (the command line and the window's fields
alike) and observe it with `subscribe`: observer(model, change, subject),
where change is a Change and subject what changed where one thing did. The
run's own changes reach RunModel's observers (`model.run.subscribe`).

A background build reports from a watcher thread: `post` (default: call at
once) is how the model hands its outcome to the thread that owns the model;
the window sets it to its GUI-thread relay.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from ..backends import BackendInfo, list_backends
from ..backends import prebuild
from ..backends.choice import AUTO, NAMES_VOCAB, Choice, choose_backend
from ..config import DEFAULT_PRESET, PRESETS, ModelConfig, TrainConfig, get_preset
from ..data.corpus import Corpus
from ..training import protocol as rs
from ..training.protocol import RunSpec
from ..training.run_model import DatasetIdentity, Phase, RunModel, TrainChoice
from .runs import RunHistory

NO_DATASET = "open a dataset first (File > Open dataset...)"
READING = "reading the dataset..."


class Change(str, enum.Enum):
    """What an observer is told changed."""

    DATASET = "dataset"    # a read started or ended, a dataset is in use, or a read failed
    SETTINGS = "settings"  # the preset, the configs or their problem
    BACKEND = "backend"    # the selection, the automatic choice, or a background build started or ended
    DISCARD = "discard"    # the run on show is being cleared (Reset, a new run, a new dataset)
    RUNS = "runs"          # the session's runs: subject (engine.app.runs.RunChange, its subject)
    RESULT = "result"      # a result for whoever asked: subject the event (a snapshot, names sampled)


@dataclass
class DatasetState:
    path: str | None = None                # the file in use
    corpus: Corpus | None = None
    identity: DatasetIdentity | None = None
    reading: str | None = None             # a file being read (its path), until the read reports
    problem: str = ""                      # why the last read failed (cleared by the next read)

    @property
    def name(self) -> str:
        return Path(self.path).name if self.path else ""


@dataclass
class Settings:
    """The configs a new run would train with. model and train are None while the
    fields describe no valid config; problem then says why (the engine's reason)."""

    preset: str = DEFAULT_PRESET
    model: ModelConfig | None = field(default_factory=lambda: get_preset(DEFAULT_PRESET).model)
    train: TrainConfig | None = field(default_factory=lambda: get_preset(DEFAULT_PRESET).train)
    problem: str = ""


@dataclass
class AutoRun:
    """What a run opened by "auto" trains on, and what to tell the user."""

    backend: str           # the backend to open now
    lines: list[str]       # the choice and, while its library builds, what trains meanwhile


class AppModel:
    def __init__(self, backends: list[BackendInfo] | None = None, *,
                 choose: Callable[..., Choice] = choose_backend,
                 start_build: Callable[..., "prebuild.BackgroundBuild | None"] = prebuild.start_build):
        self.run = RunModel()
        self.runs = RunHistory(self.run, lambda change, subject: self._notify(Change.RUNS, (change, subject)))
        self.dataset = DatasetState()
        self.settings = Settings()
        self.backends: tuple[BackendInfo, ...] = tuple(list_backends() if backends is None else backends)
        self.backend = AUTO                  # selected: AUTO or an available backend's name
        self.build: prebuild.BackgroundBuild | None = None  # a library building for auto's choice
        self.build_message = ""              # the last background build's outcome
        self.run_by_auto = False             # the run on show was opened by auto
        self._opening: tuple[DatasetIdentity | None, str | None] = (None, None)  # the run being opened
        self.post: Callable[[Callable[[], None]], None] = lambda call: call()
        self._choose, self._start_build = choose, start_build
        self._choice_key: tuple | None = None
        self._choice: Choice | None = None
        self._observers: list[Callable[["AppModel", Change, object], None]] = []

    # observing ------------------------------------------------------------------------
    def subscribe(self, observer: Callable[["AppModel", Change, object], None]) -> None:
        self._observers.append(observer)

    def _notify(self, change: Change, subject=None) -> None:
        for observer in list(self._observers):
            observer(self, change, subject)

    @property
    def phase(self) -> Phase:
        return self.run.phase

    # the dataset ------------------------------------------------------------------------
    def begin_reading(self, path: str) -> None:
        self.dataset.reading, self.dataset.problem = str(path), ""
        self._notify(Change.DATASET)

    def reading_ended(self) -> None:
        """The read reported (its dataset is used, after the save question, or not)."""
        if self.dataset.reading is not None:
            self.dataset.reading = None
            self._notify(Change.DATASET)

    def reading_failed(self, path: str, problem: str) -> None:
        self.dataset.reading, self.dataset.problem = None, problem
        self._notify(Change.DATASET)

    def use_dataset(self, path: str, corpus: Corpus, identity: DatasetIdentity) -> None:
        """The dataset in use from now on (its run discarded first by the caller)."""
        d = self.dataset
        d.path, d.corpus, d.identity, d.reading, d.problem = str(path), corpus, identity, None, ""
        self._notify(Change.DATASET)
        self._notify(Change.BACKEND)  # the automatic choice counts the dataset's vocabulary

    @property
    def vocab_size(self) -> int | None:
        return self.dataset.corpus.vocab_size if self.dataset.corpus is not None else None

    # the settings -----------------------------------------------------------------------
    def select_preset(self, name: str) -> None:
        """The preset's configs (ValueError for an unknown name)."""
        preset = get_preset(name)
        self.set_configs(preset.model, preset.train, preset=name)

    def set_configs(self, model: ModelConfig | None, train: TrainConfig | None, problem: str = "",
                    preset: str | None = None) -> None:
        """The configs the fields describe (None and the problem while invalid)."""
        s = self.settings
        new = Settings(preset if preset in PRESETS else s.preset, model, train, problem)
        if new != s:
            batch_before = s.train.batch_size if s.train else None
            self.settings = new
            self._notify(Change.SETTINGS)
            if (model != s.model or (train.batch_size if train else None) != batch_before) and self.backend == AUTO:
                self._notify(Change.BACKEND)  # the automatic choice may differ

    # the backend ------------------------------------------------------------------------
    def available(self) -> list[str]:
        return [b.name for b in self.backends if b.available]

    def select_backend(self, name: str) -> bool:
        """Select AUTO or an available backend; False (and nothing changes) for another name."""
        if name != AUTO and name not in self.available():
            return False
        if name != self.backend:
            self.backend = name
            self._notify(Change.BACKEND)
        return True

    def choice(self) -> Choice | None:
        """auto's choice for the settings and the dataset's vocabulary (None while the
        settings are invalid, or no backend can run)."""
        s = self.settings
        if s.model is None or s.train is None:
            return None
        building = self.build is not None and self.build.poll() is None
        key = (s.model, s.train.batch_size, self.vocab_size, self.available(), building, self.build_message)
        if key != self._choice_key:
            try:
                self._choice = self._choose(s.model, s.train, self.available(),
                                            vocab_size=self.vocab_size or NAMES_VOCAB)
            except ValueError:
                self._choice = None
            self._choice_key = key
        return self._choice

    def backend_label(self) -> str:
        """What the backend box's selected entry says: "auto: futhark-multicore", or the name."""
        if self.backend != AUTO:
            return self.backend
        choice = self.choice()
        return choice.label if choice is not None else AUTO

    def backend_for_run(self) -> str | None:
        """The backend a run with these settings is, as Train compares it with the run on
        show: auto's run's own backend while that run was opened by auto."""
        if self.backend != AUTO:
            return self.backend
        if self.run_by_auto and self.run.phase != Phase.NONE:
            return self.run.backend
        choice = self.choice()
        return choice.now if choice is not None else None

    def resolve(self, model: ModelConfig, train: TrainConfig, vocab_size: int) -> AutoRun:
        """The backend to open for a run of this model: the selected one, or auto's
        choice, whose library starts building in the background when it is not built
        yet (the run trains on the fastest built backend meanwhile)."""
        if self.backend != AUTO:
            return AutoRun(self.backend, [])
        choice = self._choose(model, train, self.available(), vocab_size=vocab_size)
        lines = [choice.text()]
        if not choice.built:
            if self.build is None or self.build.poll() is not None:
                self.build = self._start_build(choice.backend, model, train, vocab_size, on_done=self._on_built)
                self._notify(Change.BACKEND)
            note = choice.meanwhile()
            if self.build is not None and self.build.log is not None:
                note += f" (log: {self.build.log})"
            lines.append(f"{note}; the next run uses {choice.backend}")
        return AutoRun(choice.now, lines)

    def _on_built(self, outcome: prebuild.BuildOutcome) -> None:
        self.post(lambda: self.build_ended(outcome))  # from the build's watcher thread

    def build_ended(self, outcome: prebuild.BuildOutcome) -> None:
        """A background build's outcome (on the model's own thread)."""
        self.build_message = outcome.message
        self._choice_key = None  # built now, or left out: choose again
        self._notify(Change.BACKEND, outcome)

    def build_status(self) -> str:
        """"building futhark-c in the background (...): 12 s so far" while one builds, else ""."""
        if self.build is None or self.build.poll() is not None:
            return ""
        return self.build.status_text()

    # what Train does --------------------------------------------------------------------
    def train_problem(self) -> str:
        """Why a new run cannot start ("" when it can); a stopping run is the caller's to say."""
        if self.dataset.corpus is None:
            return READING if self.dataset.reading else NO_DATASET
        if self.settings.problem or self.settings.model is None or self.settings.train is None:
            return self.settings.problem or "the settings are not valid"
        if self.backend_for_run() is None:
            return "no backend is available"
        return ""

    def train_choice(self) -> TrainChoice:
        return self.run.train_choice(self.backend_for_run(), self.settings.model, self.settings.train)

    def new_run(self) -> tuple[RunSpec, list[str]]:
        """The spec of a new run with the settings on the dataset (train_problem() is ""),
        and what to say about its backend (auto's choice; a build started)."""
        s, corpus = self.settings, self.dataset.corpus
        auto = self.resolve(s.model, s.train, corpus.vocab_size)
        self.run_by_auto = self.backend == AUTO
        return RunSpec(auto.backend, corpus, s.model, s.train), auto.lines

    def checkpoint_run(self, checkpoint) -> tuple[RunSpec, list[str]]:
        """The spec that resumes a checkpoint on the selected backend (auto: chosen for its model)."""
        auto = self.resolve(checkpoint.model, checkpoint.train, checkpoint.corpus.vocab_size)
        self.run_by_auto = self.backend == AUTO
        return RunSpec(auto.backend, checkpoint=checkpoint, autostart=False), auto.lines

    def run_opened(self, model: ModelConfig, train: TrainConfig, backend: str) -> None:
        """A run opened: the settings become its (a checkpoint's may differ), and its
        backend the selection, but for a run auto chose (auto stays selected)."""
        self.set_configs(model, train, preset=next((n for n, p in PRESETS.items() if p.model == model), None))
        if not (self.backend == AUTO and self.run_by_auto):
            self.select_backend(backend)

    def opening(self, dataset: DatasetIdentity | None, path: str | None) -> None:
        """The run about to open: its dataset's identity, and its checkpoint's path (None: a new run)."""
        self._opening = (dataset, path)

    def report(self, event: rs.Event) -> None:
        """A worker's event, before anyone shows it: the run model moves (opened, its step,
        saved, extended, its phase, as the worker reported it), the settings become an
        opened run's, the run's record grows; a result (a parameter snapshot, names
        sampled) goes to whoever shows it."""
        run = self.run
        if isinstance(event, rs.Opened):
            run.opened(event, *self._opening)
            self.run_opened(event.info.model, event.info.train, event.info.backend)
        elif isinstance(event, rs.Losses):
            run.trained_to(event.first_step + len(event.losses))
        elif isinstance(event, rs.Saved) and not event.autosave:
            run.saved(event.path, event.step)
        elif isinstance(event, rs.Extended):
            run.extended(event.num_steps)
        elif isinstance(event, rs.PhaseChanged):
            run.report(event.phase)
        self.runs.report(event)
        if isinstance(event, (rs.SnapshotReady, rs.Samples)):
            self._notify(Change.RESULT, event)

    def discard(self) -> None:
        """The run on show is being cleared: observers forget what they hold of it."""
        self._notify(Change.DISCARD)

    def with_steps(self, num_steps: int) -> None:
        """The Steps setting (as a front end's `--autorun-steps` writes it)."""
        if self.settings.train is not None:
            self.set_configs(self.settings.model, replace(self.settings.train, num_steps=num_steps),
                             preset=self.settings.preset)
