"""The window's explore tabs: next-character bars and prefix completion,
attention, the character map and the run list, beside the Training tab;
Tools > Scaling study.

An ExploreController is given the run model, a way to send commands to the
run's worker and the widgets it uses. The panels compute from parameter
snapshots the worker sends while one of them is on screen (one InspectHub
holds the newest); the run list keeps an engine.training.records.RunRecord per run of
the session, filled as the losses arrive, with its dataset. A checkpoint
saved from (or loaded into) a run of the list, loaded again, continues that
run's row: rewound to the checkpoint's step, not listed twice.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

import numpy as np

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMainWindow, QTabWidget, QWidget

from engine.training import protocol as rs
from engine.training.run_model import Phase, RunModel
from engine.training.records import RunRecord

from .attention_view import AttentionPanel
from .char_map import CharMapPanel
from .inspect_hub import InspectHub
from .loss_plot import LossPlot
from .next_char_panel import NextCharPanel
from .run_list import RunListPanel
from .sample_panel import SamplePanel
from .scaling_study import ScalingStudyDialog
from .sweep_panel import SweepPanel

TAB_SHORTCUTS = "Ctrl+1 Ctrl+2 Ctrl+3 Ctrl+4 Ctrl+5 Ctrl+6".split()


class ExploreController(QObject):
    def __init__(self, host: QMainWindow, run: RunModel, send: Callable[[rs.Command], bool],
                 training_page: QWidget, loss_plot: LossPlot, sample_panel: SamplePanel,
                 notify, dataset_path: Callable[[], str | None], worker_step: Callable[[], int]):
        super().__init__(host)
        self._host, self.run, self._send, self.notify = host, run, send, notify
        self._dataset_path, self._worker_step = dataset_path, worker_step
        self.inspect_hub = InspectHub(host)
        self.next_char_panel = NextCharPanel(self.inspect_hub)
        self.attention_panel = AttentionPanel(self.inspect_hub)
        self.char_map_panel = CharMapPanel(self.inspect_hub)
        self.run_list = RunListPanel(smoothing=loss_plot.smoothing)
        self.sweep_panel = SweepPanel()
        self.run_record: RunRecord | None = None  # the current run's, in run_list.runs
        self._record_of_path: dict[str, RunRecord] = {}  # checkpoints saved or loaded -> their run's record
        self._rewinding = False  # a reloaded run's record: the checkpoint's losses rewind it
        self.scaling_dialog: ScalingStudyDialog | None = None
        self._scaling_data_path: str | None = None

        self.tabs = QTabWidget(objectName="mainTabs")
        for page, title, tip in (
                (training_page, "Tra&ining", "The loss curve, progress and samples of the current run"),
                (self.next_char_panel, "&Next character", "What the model expects after a prefix"),
                (self.attention_panel, "&Attention", "Where each position of a name looks"),
                (self.char_map_panel, "Character &map", "The characters' embeddings in two dimensions"),
                (self.run_list, "R&uns", "Every run of this session; overlay their loss curves"),
                (self.sweep_panel, "S&weep", "Sweeps of many runs on Ray Tune, here or on a cluster")):
            self.tabs.setTabToolTip(self.tabs.addTab(page, title), tip)
        self.tabs.currentChanged.connect(self.update_snapshot_wish)

        self.next_char_panel.sampleRequested.connect(self.request_prefix_samples)
        self.next_char_panel.nameActivated.connect(self.show_attention)
        sample_panel.samples_list.itemActivated.connect(lambda item: self.show_attention(item.text()))
        sample_panel.samples_list.setToolTip("Generated names (double-click: show its attention)")
        loss_plot.smoothingChanged.connect(self.run_list.set_smoothing)
        self._connect_sweeps()
        run.subscribe(self._on_model)

    def build_menus(self) -> None:
        host = self._host
        view_menu = host.menuBar().addMenu("&View")
        for index, keys in enumerate(TAB_SHORTCUTS):
            title = self.tabs.tabText(index).replace("&", "")
            act = QAction(title, host, objectName=f"showTab{index}Action")
            act.setShortcut(QKeySequence(keys))
            act.triggered.connect(lambda checked=False, i=index: self.tabs.setCurrentIndex(i))
            view_menu.addAction(act)
        tools_menu = host.menuBar().addMenu("&Tools")
        act = QAction("&Scaling study...", host, objectName="scalingStudyAction")
        act.setToolTip("Measure ms per step against model size for several backends")
        act.triggered.connect(lambda checked=False: self.show_scaling_study())
        tools_menu.addAction(act)

    # actions ------------------------------------------------------------------
    def show_attention(self, name: str) -> None:
        """A name in the Attention tab (double-clicked in a list of names)."""
        self.attention_panel.set_text(name)
        self.tabs.setCurrentWidget(self.attention_panel)

    def request_prefix_samples(self, prefix: str, num_samples: int, temperature: float, seed: int) -> None:
        if not self._send(rs.Sample(num_samples, temperature, seed, prefix)):
            self.notify.show_message("info", "Nothing to sample from", "Train a model or load a checkpoint first.")

    def show_scaling_study(self) -> ScalingStudyDialog | None:
        path = self._dataset_path()
        if path is None:
            self.notify.show_message("info", "No dataset",
                                     "The scaling study trains on the dataset: open one first.")
            return None
        dialog = self.scaling_dialog
        if dialog is None or self._scaling_data_path != path and not dialog.running:
            if dialog is not None:  # a new dataset: a new study
                dialog.close()
                dialog.deleteLater()
            dialog = self.scaling_dialog = ScalingStudyDialog(data_path=path, parent=self._host)
            self._scaling_data_path = path
        dialog.show()
        dialog.raise_()
        dialog.activateWindow()
        return dialog

    # snapshots ----------------------------------------------------------------
    def update_snapshot_wish(self, *_) -> None:
        """Snapshots only while a panel that reads them is on screen (they cost a copy)."""
        wanted = self.inspect_hub.wants_snapshots
        self._send(rs.WantSnapshots(wanted))
        snapshot = self.inspect_hub.snapshot
        if wanted and self.run.has_model and (snapshot is None or snapshot.step != self._worker_step()):
            self._send(rs.TakeSnapshot())

    # the worker's events and the model's changes ------------------------------------
    def on_event(self, event: rs.Event) -> None:
        if isinstance(event, rs.Opened):
            self._add_record(event)
        elif isinstance(event, rs.Losses) and self.run_record is not None:
            self._extend_record(event)
            self.run_list.update_run(self.run_record)
        elif isinstance(event, rs.Saved) and self.run_record is not None:
            self._record_of_path[event.path] = self.run_record
        elif isinstance(event, rs.Heldout) and self.run_record is not None:
            self.run_record.add_heldout(event.points, event.replacing)
            self.run_list.update_run(self.run_record)
        elif isinstance(event, rs.SnapshotReady):
            self.inspect_hub.set_snapshot(event.snapshot)
        elif isinstance(event, rs.Samples) and event.prefix is not None:
            self.next_char_panel.show_samples(event.names, event.step)
        elif isinstance(event, rs.Diverged):
            self._set_status("diverged")
        elif isinstance(event, rs.Extended) and self.run_record is not None:
            self.run_record.train = replace(self.run.train, holdout=self.run_record.train.holdout)
            self._record_phase(self.run.phase)

    def _add_record(self, event: rs.Opened) -> None:
        info, dataset = event.info, self.run.dataset
        train = replace(info.train, holdout=info.holdout)  # the count (auto resolved): runs compare by it
        path = self.run.saved_path if event.from_checkpoint else None
        earlier = self._listed_run_of(path, info, dataset)
        record = RunRecord(earlier.name if earlier else f"run {self.run_list.count + 1}", info.backend, info.model,
                           train, status="loaded" if event.from_checkpoint else "running",
                           dataset=earlier.dataset if earlier else dataset.name if dataset else "",
                           dataset_hash=dataset.content_hash if dataset else "")
        self._rewinding = False
        if earlier is None:
            self.run_list.add_run(record)
        elif earlier.block == 1:  # every step kept: rewound by the checkpoint's losses, its step times kept
            earlier.backend, earlier.train, earlier.status = record.backend, record.train, record.status
            record, self._rewinding = earlier, True
            self.run_list.update_run(record)
        else:  # compacted (an ended long run): the checkpoint's history replaces it, in its row
            self.run_list.replace_run(earlier, record)
        self.run_record = record
        if path:
            self._record_of_path[path] = record
        self.update_snapshot_wish()

    def _listed_run_of(self, path: str | None, info: rs.RunInfo, dataset) -> RunRecord | None:
        """The run in the list that the checkpoint at `path` was saved from or loaded
        into, if it is still listed and is that network on that dataset."""
        record = self._record_of_path.get(path) if path else None
        if record is None or not self.run_list.listed(record):
            return None
        same_data = dataset is None or not record.dataset_hash or record.dataset_hash == dataset.content_hash
        return record if record.model == info.model and same_data else None

    def _extend_record(self, event: rs.Losses) -> None:
        """The run's record extended; a reloaded run's first losses (the checkpoint's
        history, untimed) rewind its record to the checkpoint's step when they are the
        steps it holds, keeping their times."""
        record, n = self.run_record, len(event.losses)
        if self._rewinding and event.first_step == 0 and math.isnan(event.seconds):
            self._rewinding = False
            if record.steps >= n and np.array_equal(record.losses[:n], np.asarray(event.losses, np.float32)):
                record.extend([], n)
                return
        record.extend(event.losses, event.first_step, event.seconds)  # NaN stays NaN per step

    def _on_model(self, run: RunModel, what: str) -> None:
        if what != "phase":
            return
        if run.phase == Phase.OPENING:
            self.update_snapshot_wish()  # a new worker: tell it whether snapshots are wanted
        elif run.phase in (Phase.STOPPING, Phase.NONE):
            self._forget_model()
        else:
            self._record_phase(run.phase)

    def _record_phase(self, phase: Phase) -> None:
        record = self.run_record
        if record is None:
            return
        if phase == Phase.RUNNING:
            record.status = "running"
        elif phase != Phase.PAUSED and record.status == "running":
            record.status = "finished" if record.steps >= record.train.num_steps else "stopped"
        self.run_list.update_run(record)

    def _set_status(self, status: str) -> None:
        """The worker reports divergence just after it has stopped the run."""
        record = self.run_record
        if record is not None and record.status in ("running", "stopped"):
            record.status = status
            self.run_list.update_run(record)

    def _forget_model(self) -> None:
        """Reset or a new run: the panels forget the old model; its record stays in the list
        (its curves made small)."""
        record, self.run_record = self.run_record, None
        if record is not None:
            self._record_phase(Phase.NONE)
            self.run_list.run_ended(record)
        self.inspect_hub.set_snapshot(None)

    def _connect_sweeps(self) -> None:
        """A sweep's trials are runs of the Runs tab; Load trial loads one into the window."""
        sweeps = self.sweep_panel
        sweeps.runAdded.connect(self.run_list.add_run)
        sweeps.runChanged.connect(self.run_list.update_run)
        sweeps.runEnded.connect(self.run_list.run_ended)
        sweeps.loadRequested.connect(self._host.load_checkpoint)
        sweeps.messageShown.connect(lambda kind, title, text: self.notify.show_message(kind, title, text))

    def close(self) -> None:
        self.sweep_panel.shutdown()  # the sweep stops; its processes end soon after
        self.inspect_hub.close(timeout_s=0)  # daemon threads: asked to stop, never waited for
        if self.scaling_dialog is not None:
            self.scaling_dialog.close()
