"""The dataset: opening one (read off the GUI thread, then, after the save
question, it replaces the run), the packaged names.txt on first use, and the
Dataset box, which always shows the run's own dataset: a checkpoint's,
by name and document count, when it is not the open file. What the dataset
is (the file in use, a file being read, why a read failed) is the
application model's (engine.app.AppModel.dataset); this controller reads
files and writes the model.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, Signal

import engine
from engine.app import AppModel, Change
from engine.training.run_model import DatasetIdentity, Phase

from .background import Background
from .config_panel import ConfigPanel
from .loss_plot import LossPlot
from .run_control import RunController


def read_corpus(path: str) -> tuple[engine.Corpus, DatasetIdentity]:
    """The dataset, with its token arrays built (tens of ms for a large file: done
    here, off the GUI thread, not at the window's first look at it), and its identity."""
    corpus = engine.load_corpus(path)
    corpus.arrays  # noqa: B018  (a cached property: built once, here)
    return corpus, DatasetIdentity.of(corpus, Path(path).name)


def describe(dataset: DatasetIdentity) -> str:
    return f"{dataset.name}: {dataset.num_docs:,} documents, vocabulary {dataset.vocab_size}"


class DatasetController(QObject):
    changed = Signal(str)  # path of the dataset now in use

    def __init__(self, parent: QObject, app: AppModel, runs: RunController, config_panel: ConfigPanel,
                 loss_plot: LossPlot, notify, ask_open_path: Callable[..., str]):
        super().__init__(parent)
        self.app, self.run, self.runs, self.panel, self.loss_plot = app, app.run, runs, config_panel, loss_plot
        self.notify, self._ask_open_path = notify, ask_open_path
        self._read = Background(self, "read-dataset", newest_wins=True)  # the latest Open dataset, until it reports
        self.run.subscribe(lambda model, what: self.show_info() if what in ("run", "phase") else None)
        app.subscribe(lambda model, change, subject: change in (Change.SETTINGS, Change.DATASET) and self.show_info())

    @property
    def corpus(self) -> engine.Corpus | None:
        return self.app.dataset.corpus

    @property
    def identity(self) -> DatasetIdentity | None:
        return self.app.dataset.identity

    @property
    def path(self) -> str | None:
        return self.app.dataset.path

    @property
    def reading(self) -> bool:
        return self.app.dataset.reading is not None

    def open(self, path: str | None = None) -> bool:
        """Start reading a dataset (off the GUI thread); True when a read started.
        `changed` follows when it is in use, or an error message."""
        if path is None:
            path = self._ask_open_path("Open dataset", self.path or "", "Text files (*.txt);;All files (*)")
            if not path:
                return False
        path = str(path)
        self._read.start(read_corpus, path, on_done=lambda result: self._on_read(path, *result),
                         on_failed=lambda exc: self._on_failed(path, exc))
        self.panel.dataset_info.setText(f"Reading {Path(path).name}...")
        self.app.begin_reading(path)
        return True

    def forget_read(self) -> None:
        """Closing: a read still going is dropped when it reports."""
        self._read.cancel()
        self.app.reading_ended()

    def _on_read(self, path: str, corpus: engine.Corpus, identity: DatasetIdentity) -> None:
        self.app.reading_ended()
        self.runs.guard.confirm(f"Opening {Path(path).name}", lambda: self._use(path, corpus, identity))

    def _use(self, path: str, corpus: engine.Corpus, identity: DatasetIdentity) -> None:
        self.runs.discard()  # a run belongs to its dataset
        self.panel.set_dataset_path(path)
        self.loss_plot.set_vocab_size(corpus.vocab_size)
        self.app.use_dataset(path, corpus, identity)  # the vocabulary reaches the fields through the model
        self.notify.status(f"Dataset {Path(path).name}: {len(corpus):,} documents", 10000)
        self.changed.emit(path)

    def _on_failed(self, path: str, exc: Exception) -> None:
        message = str(exc) if isinstance(exc, engine.DatasetError) else f"cannot read {path}: {exc}"
        self.app.reading_failed(path, message)
        self.notify.show_message("error", "Cannot use this dataset", message)

    def checkpoint_identity(self, checkpoint, path: str) -> DatasetIdentity:
        """A checkpoint's dataset: the open file's name when it is the same content."""
        identity = DatasetIdentity.of(checkpoint.corpus, f"the dataset in {Path(path).name}")
        if identity.same_content(self.identity):
            return self.identity
        return identity

    # the Dataset box --------------------------------------------------------------
    def show_info(self, *_) -> None:
        if self.reading:
            return  # "Reading ..." stays until it reports
        run = self.run.dataset if self.run.phase not in (Phase.NONE, Phase.STOPPING) else None
        if run is not None and not run.same_content(self.identity):
            text = describe(run) + " (the run's own: not the open file"
            text += f", {self.identity.name})" if self.identity else ")"
        elif self.corpus is not None:
            c = self.corpus
            text = f"{len(c):,} documents, vocabulary {c.vocab_size} ({''.join(c.chars)} + end)"
            model = self.app.settings.model  # None: no valid block_size yet; the config panel says why
            note = c.truncation_note(model.block_size) if model is not None else ""
            text += f". Note: {note}." if note else ""
        else:
            text = " "
        self.panel.dataset_info.setText(text)

    # the default dataset ------------------------------------------------------------
    def start_default(self, saved: str) -> None:
        """The dataset used last (`saved`), else makemore's names.txt shipped with the package."""
        if saved and Path(saved).is_file():
            self.open(saved)
            return
        try:
            self.open(str(engine.default_dataset_path()))
        except engine.DatasetError as exc:  # a damaged installation
            self.panel.dataset_info.setText(f"{exc}. Use Open dataset... to choose a text file.")
            self.notify.show_message("error", "No dataset", str(exc),
                                     status="No dataset: names.txt is damaged (see the Dataset box); "
                                            "use File > Open dataset...")
