"""The window's explore tabs: next-character bars and prefix completion,
attention, the character map and the run list, beside the Training tab;
Tools > Scaling study.

An ExploreController is given the application model (engine.app.AppModel),
a way to send commands to the run's worker and the widgets it uses. The
panels compute from parameter snapshots the worker sends while one of them is
on screen (one InspectHub holds the newest; the model passes them on as
results); the Runs tab shows the model's runs (engine.app.runs.RunHistory:
one engine.training.records.RunRecord per run of the session, a sweep's
trials included), and Remove there removes them from the model.
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMainWindow, QTabWidget, QWidget

from engine.app import AppModel, Change
from engine.app.runs import RunChange
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
    def __init__(self, host: QMainWindow, app: AppModel, send: Callable[[rs.Command], bool],
                 training_page: QWidget, loss_plot: LossPlot, sample_panel: SamplePanel,
                 notify, dataset_path: Callable[[], str | None], worker_step: Callable[[], int]):
        super().__init__(host)
        self._host, self.app, self.run, self._send, self.notify = host, app, app.run, send, notify
        self._dataset_path, self._worker_step = dataset_path, worker_step
        self.inspect_hub = InspectHub(host)
        self.next_char_panel = NextCharPanel(self.inspect_hub)
        self.attention_panel = AttentionPanel(self.inspect_hub)
        self.char_map_panel = CharMapPanel(self.inspect_hub)
        self.run_list = RunListPanel(smoothing=loss_plot.smoothing)
        self.sweep_panel = SweepPanel()
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
        app.run.subscribe(self._on_model)
        app.subscribe(self._on_app)
        self.run_list.runsRemoved.connect(app.runs.remove)  # Remove in the Runs tab: the model forgets them

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

    # the model's changes ------------------------------------------------------------
    def _on_app(self, app: AppModel, change: Change, subject) -> None:
        if change == Change.RUNS:
            self._on_runs(*subject)
        elif change == Change.RESULT:
            if isinstance(subject, rs.SnapshotReady):
                self.inspect_hub.set_snapshot(subject.snapshot)
            elif isinstance(subject, rs.Samples) and subject.prefix is not None:
                self.next_char_panel.show_samples(subject.names, subject.step)

    def _on_runs(self, change: RunChange, subject) -> None:
        """The Runs tab follows the model's list of runs."""
        run_list = self.run_list
        if change == RunChange.ADDED:
            run_list.add_run(subject)
        elif change == RunChange.CHANGED:
            run_list.update_run(subject)
        elif change == RunChange.REPLACED:
            run_list.replace_run(*subject)
        elif change == RunChange.ENDING:
            run_list.let_go(subject)
        elif change == RunChange.ENDED:
            run_list.run_ended(subject)
        elif change == RunChange.REMOVED:
            run_list.remove_runs(subject)

    @property
    def run_record(self) -> RunRecord | None:
        """The current run's record (the model's)."""
        return self.app.runs.current

    def _on_model(self, run: RunModel, what: str) -> None:
        if what == "run":
            self.update_snapshot_wish()  # a run opened: snapshots of it wanted or not
        if what != "phase":
            return
        if run.phase == Phase.OPENING:
            self.update_snapshot_wish()  # a new worker: tell it whether snapshots are wanted
        elif run.phase in (Phase.STOPPING, Phase.NONE):
            self.inspect_hub.set_snapshot(None)  # Reset or a new run: the panels forget the old model

    def _connect_sweeps(self) -> None:
        """A sweep's trials are runs of the Runs tab; Load trial loads one into the window."""
        sweeps = self.sweep_panel
        sweeps.runAdded.connect(self.app.runs.add)
        sweeps.runChanged.connect(self.app.runs.changed)
        sweeps.runEnded.connect(self.app.runs.ended)
        sweeps.loadRequested.connect(self._host.load_checkpoint)
        sweeps.messageShown.connect(lambda kind, title, text: self.notify.show_message(kind, title, text))

    def close(self) -> None:
        self.sweep_panel.shutdown()  # the sweep stops; its processes end soon after
        self.inspect_hub.close(timeout_s=0)  # daemon threads: asked to stop, never waited for
        if self.scaling_dialog is not None:
            self.scaling_dialog.close()
