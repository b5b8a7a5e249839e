"""The window's explore tabs, a mixin of MainWindow: next-character bars and
prefix completion, attention, the character map and the run list, beside the
Training tab; Tools > Scaling study. The panels compute from parameter
snapshots the training worker sends while one of them is on screen (one
InspectHub holds the newest); the run list keeps an engine.runs.RunRecord per
run of the session, filled as the losses arrive.
"""
from __future__ import annotations

import math

import numpy as np
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QTabWidget, QWidget

from engine.runs import RunRecord

from . import worker as w
from .attention_view import AttentionPanel
from .char_map import CharMapPanel
from .inspect_hub import InspectHub
from .next_char_panel import NextCharPanel
from .run_list import RunListPanel
from .scaling_study import ScalingStudyDialog

TAB_SHORTCUTS = "Ctrl+1 Ctrl+2 Ctrl+3 Ctrl+4 Ctrl+5".split()


class ExploreTabs:
    # layout -------------------------------------------------------------------
    def _build_tabs(self, training_page: QWidget) -> QTabWidget:
        self.inspect_hub = InspectHub(self)
        self.next_char_panel = NextCharPanel(self.inspect_hub)
        self.attention_panel = AttentionPanel(self.inspect_hub)
        self.char_map_panel = CharMapPanel(self.inspect_hub)
        self.run_list = RunListPanel(smoothing=self.loss_plot.smoothing)
        self.run_record: RunRecord | None = None  # the current run's, in run_list.runs
        self.scaling_dialog: ScalingStudyDialog | None = None
        self._scaling_data_path: str | None = None

        self.tabs = QTabWidget(objectName="mainTabs")
        for page, title, tip in (
                (training_page, "Tra&ining", "The loss curve, progress and samples of the current run"),
                (self.next_char_panel, "&Next character", "What the model expects after a prefix"),
                (self.attention_panel, "&Attention", "Where each position of a name looks"),
                (self.char_map_panel, "Character &map", "The characters' embeddings in two dimensions"),
                (self.run_list, "R&uns", "Every run of this session; overlay their loss curves")):
            self.tabs.setTabToolTip(self.tabs.addTab(page, title), tip)
        self.tabs.currentChanged.connect(self._update_snapshot_wish)

        self.next_char_panel.sampleRequested.connect(self.request_prefix_samples)
        self.next_char_panel.nameActivated.connect(self.show_attention)
        self.sample_panel.samples_list.itemActivated.connect(lambda item: self.show_attention(item.text()))
        self.sample_panel.samples_list.setToolTip("Generated names (double-click: show its attention)")
        self.loss_plot.smoothingChanged.connect(self.run_list.set_smoothing)
        return self.tabs

    def _build_explore_menus(self) -> None:
        view_menu = self.menuBar().addMenu("&View")
        for index, keys in enumerate(TAB_SHORTCUTS):
            title = self.tabs.tabText(index).replace("&", "")
            act = QAction(title, self, objectName=f"showTab{index}Action")
            act.setShortcut(QKeySequence(keys))
            act.triggered.connect(lambda checked=False, i=index: self.tabs.setCurrentIndex(i))
            view_menu.addAction(act)
        tools_menu = self.menuBar().addMenu("&Tools")
        act = QAction("&Scaling study...", self, objectName="scalingStudyAction")
        act.setToolTip("Measure ms per step against model size for several backends")
        act.triggered.connect(lambda checked=False: self.show_scaling_study())
        tools_menu.addAction(act)

    # actions ------------------------------------------------------------------
    def show_attention(self, name: str) -> None:
        """A name in the Attention tab (double-clicked in a list of names)."""
        self.attention_panel.set_text(name)
        self.tabs.setCurrentWidget(self.attention_panel)

    def request_prefix_samples(self, prefix: str, num_samples: int, temperature: float, seed: int) -> None:
        if self.session is None or self.state not in w.HAS_MODEL:
            self.show_message("info", "Nothing to sample from", "Train a model or load a checkpoint first.")
            return
        self.session.worker.request_samples(num_samples, temperature, seed, prefix=prefix)

    def show_scaling_study(self) -> ScalingStudyDialog | None:
        if self.dataset_path is None:
            self.show_message("info", "No dataset", "The scaling study trains on the dataset: open one first.")
            return None
        dialog = self.scaling_dialog
        if dialog is None or self._scaling_data_path != self.dataset_path and not dialog.running:
            if dialog is not None:  # a new dataset: a new study
                dialog.close()
                dialog.deleteLater()
            dialog = self.scaling_dialog = ScalingStudyDialog(data_path=self.dataset_path, parent=self)
            self._scaling_data_path = self.dataset_path
        dialog.show()
        dialog.raise_()
        dialog.activateWindow()
        return dialog

    # snapshots ----------------------------------------------------------------
    def _update_snapshot_wish(self, *_) -> None:
        """Snapshots only while a panel that reads them is on screen (they cost a copy)."""
        session, wanted = self.session, self.inspect_hub.wants_snapshots
        if session is None:
            return
        session.worker.want_snapshots(wanted)
        snapshot = self.inspect_hub.snapshot
        if wanted and self.state in w.HAS_MODEL and (snapshot is None or snapshot.step != session.worker.step):
            session.worker.request_snapshot()

    # run records ----------------------------------------------------------------
    def _explore_session_started(self, session) -> None:
        session.reports.snapshot.connect(self.inspect_hub.set_snapshot)
        session.reports.diverged.connect(self._explore_diverged)
        session.reports.prefixSamples.connect(self.next_char_panel.show_samples)
        session.worker.want_snapshots(self.inspect_hub.wants_snapshots)

    def _explore_opened(self, info: w.RunInfo, from_checkpoint: bool) -> None:
        self.run_record = RunRecord(f"run {len(self.run_list.runs) + 1}", info.backend, info.model, info.train,
                                    status="loaded" if from_checkpoint else "running")
        self.run_list.add_run(self.run_record)
        self.sample_panel.set_block_size(info.model.block_size)
        self._update_snapshot_wish()

    def _explore_losses(self, losses: np.ndarray, first_step: int, seconds: float) -> None:
        record = self.run_record
        if record is None:
            return
        record.extend(losses, first_step, seconds)  # NaN (not timed) stays NaN per step
        self.run_list.update_run(record)

    def _explore_state(self, state: str) -> None:
        record = self.run_record
        if record is None:
            return
        if state == w.RUNNING:
            record.status = "running"
        elif state != w.PAUSED and record.status == "running":
            num_steps = self.run_info.train.num_steps if self.run_info else math.inf
            record.status = "finished" if record.steps >= num_steps else "stopped"
        self.run_list.update_run(record)

    def _explore_diverged(self, _step: int) -> None:
        """The worker reports divergence just after it has stopped the run."""
        record = self.run_record
        if record is not None and record.status in ("running", "stopped"):
            record.status = "diverged"
            self.run_list.update_run(record)

    def _explore_cleared(self) -> None:
        """Reset or a new run: the panels forget the old model; its record stays in the list."""
        self._explore_state("none")
        self.run_record = None
        self.inspect_hub.set_snapshot(None)

    def _explore_close(self) -> None:
        self.inspect_hub.close(timeout_s=0)  # daemon threads: asked to stop, never waited for
        if self.scaling_dialog is not None:
            self.scaling_dialog.close()

