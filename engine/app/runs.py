"""The session's runs, Qt-free: one engine.training.records.RunRecord per run
(trained, stopped, loaded from a checkpoint, or a sweep's trial), the copy of
its losses and held-out points that the Runs tab reads. The current run's
record grows from the worker's events (report). A checkpoint saved from (or
loaded into) a run still listed, loaded again, continues that run's record:
rewound to the checkpoint's step, not listed twice.

Observers (the AppModel passes them on as Change.RUNS) are told
(RunChange, subject): ADDED, CHANGED, ENDING and ENDED with a record,
REPLACED with (old, new), REMOVED with a list of records. A run that ends is
compacted between ENDING (whoever reads its buffers in place, as the loss
plot does, takes a copy or lets go) and ENDED.
"""
from __future__ import annotations

import enum
import math
from dataclasses import replace
from typing import Callable

import numpy as np

from ..training import protocol as rs
from ..training.records import RunRecord
from ..training.run_model import Phase, RunModel


class RunChange(str, enum.Enum):
    ADDED = "added"
    CHANGED = "changed"      # new steps, held-out points or status
    REPLACED = "replaced"    # (old, new): a reloaded compacted run's fresh record, in its place
    ENDING = "ending"        # it will not grow again and is about to be compacted: let go of its buffers
    ENDED = "ended"          # compacted (engine.training.records.MAX_POINTS points at most)
    REMOVED = "removed"      # a list of records


class RunHistory:
    def __init__(self, run: RunModel, notify: Callable[[RunChange, object], None]):
        self.run, self._notify = run, notify
        self.records: list[RunRecord] = []
        self.current: RunRecord | None = None   # the run on show's record
        self.count = 0                         # runs ever added: "run N" names stay unique
        self._of_path: dict[str, RunRecord] = {}  # checkpoints saved or loaded -> their run's record
        self._rewinding = False  # a reloaded run's record: the checkpoint's losses rewind it
        run.subscribe(lambda model, what: what == "phase" and self._on_phase(model.phase))

    # the list ---------------------------------------------------------------------------
    def add(self, record: RunRecord) -> None:
        self.records.append(record)
        self.count += 1
        self._notify(RunChange.ADDED, record)

    def changed(self, record: RunRecord) -> None:
        self._notify(RunChange.CHANGED, record)

    def ended(self, record: RunRecord) -> None:
        """A run that will not grow again: compacted, so that a long session's runs stay small."""
        self._notify(RunChange.ENDING, record)
        record.compact()
        self._notify(RunChange.ENDED, record)

    def remove(self, records: list[RunRecord]) -> None:
        """Off the list; the current run's record goes on growing (the plot shows it)."""
        gone = [r for r in records if self.listed(r)]
        if gone:
            self.records = [r for r in self.records if all(r is not g for g in gone)]
            self._notify(RunChange.REMOVED, gone)

    def listed(self, record: RunRecord) -> bool:
        return any(r is record for r in self.records)

    # the worker's events ------------------------------------------------------------------
    def report(self, event: rs.Event) -> None:
        record = self.current
        if isinstance(event, rs.Opened):
            self._open(event)
        elif record is None:
            return
        elif isinstance(event, rs.Losses):
            self._extend(record, event)
            self.changed(record)
        elif isinstance(event, rs.Saved):
            self._of_path[event.path] = record
        elif isinstance(event, rs.Heldout):
            record.add_heldout(event.points, event.replacing)
            self.changed(record)
        elif isinstance(event, rs.Diverged):  # reported just after the run stopped
            if record.status in ("running", "stopped"):
                record.status = "diverged"
                self.changed(record)
        elif isinstance(event, rs.Extended):
            record.train = replace(self.run.train, holdout=record.train.holdout)
            self._record_phase(self.run.phase)

    def _open(self, event: rs.Opened) -> None:
        info, dataset = event.info, self.run.dataset
        train = replace(info.train, holdout=info.holdout)  # the count (auto resolved): runs compare by it
        path = self.run.saved_path if event.from_checkpoint else None
        earlier = self._listed_run_of(path, info, dataset)
        record = RunRecord(earlier.name if earlier else f"run {self.count + 1}", info.backend, info.model,
                           train, status="loaded" if event.from_checkpoint else "running",
                           dataset=earlier.dataset if earlier else dataset.name if dataset else "",
                           dataset_hash=dataset.content_hash if dataset else "")
        self._rewinding = False
        if earlier is None:
            self.current = record
            self.add(record)
        elif earlier.block == 1:  # every step kept: rewound by the checkpoint's losses, its step times kept
            earlier.backend, earlier.train, earlier.status = record.backend, record.train, record.status
            earlier.heldout = [p for p in earlier.heldout if p.step <= info.step]  # rewound to the checkpoint
            record, self._rewinding = earlier, True
            self.current = record
            self.changed(record)
        else:  # compacted (an ended long run): the checkpoint's history replaces it, in its place
            self.records[next(i for i, r in enumerate(self.records) if r is earlier)] = record
            self.current = record
            self._notify(RunChange.REPLACED, (earlier, record))
        if path:
            self._of_path[path] = record

    def _listed_run_of(self, path: str | None, info: rs.RunInfo, dataset) -> RunRecord | None:
        """The listed run that the checkpoint at `path` was saved from or loaded into, if it
        is that network on that dataset."""
        record = self._of_path.get(path) if path else None
        if record is None or not self.listed(record):
            return None
        same_data = dataset is None or not record.dataset_hash or record.dataset_hash == dataset.content_hash
        return record if record.model == info.model and same_data else None

    def _extend(self, record: RunRecord, event: rs.Losses) -> None:
        """A reloaded run's first losses (the checkpoint's history, untimed) rewind its
        record to the checkpoint's step when they are the steps it holds, keeping their times."""
        n = len(event.losses)
        if self._rewinding and event.first_step == 0 and math.isnan(event.seconds):
            self._rewinding = False
            if record.steps >= n and np.array_equal(record.losses[:n], np.asarray(event.losses, np.float32)):
                record.extend([], n)
                return
        record.extend(event.losses, event.first_step, event.seconds)  # NaN stays NaN per step

    # the run's phase ----------------------------------------------------------------------
    def _on_phase(self, phase: Phase) -> None:
        if phase in (Phase.STOPPING, Phase.NONE):
            record, self.current = self.current, None  # stays listed, its curve made small
            if record is not None:
                self._set_status(record, Phase.NONE)
                self.ended(record)
        elif phase != Phase.OPENING:
            self._record_phase(phase)

    def _record_phase(self, phase: Phase) -> None:
        if self.current is not None:
            self._set_status(self.current, phase)
            self.changed(self.current)

    @staticmethod
    def _set_status(record: RunRecord, phase: Phase) -> None:
        if phase == Phase.RUNNING:
            record.status = "running"
        elif phase != Phase.PAUSED and record.status == "running":
            record.status = "finished" if record.steps >= record.train.num_steps else "stopped"
