"""The settings column and the application model (engine.app.AppModel): the
fields write the model (preset, configs, backend), and the model's changes,
wherever they come from (the command line, a run that opened, a checkpoint),
show in the fields. The backend box's first entry is the automatic choice,
shown as such ("auto: futhark-multicore") and chosen again when the preset,
the batch size or the dataset changes, or a background build ends. A build's
outcome arrives from its watcher thread; it reaches the model on the GUI
thread (gui.background's relay).
"""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from engine.app import AppModel, Change
from engine.backends import prebuild
from engine.backends.choice import AUTO

from .background import make_relay, report_from_thread
from .config_panel import ConfigPanel

BUILT_MS = 15000  # how long "built futhark-c ...: the next run trains on it" stays


class SettingsController(QObject):
    posted = Signal(object)  # a call from another thread, run here (the model's thread)

    def __init__(self, parent: QObject, app: AppModel, panel: ConfigPanel, notify):
        super().__init__(parent)
        self.app, self.panel, self.notify = app, panel, notify
        make_relay()
        self.posted.connect(lambda call: call())
        app.post = lambda call: report_from_thread(self, "posted", call)
        panel.changed.connect(self._on_fields)
        app.subscribe(self._on_model)
        self._on_fields()
        self.show_backend()

    # the fields -> the model ---------------------------------------------------------
    def _on_fields(self) -> None:
        panel = self.panel
        try:
            model, train, problem = panel.model_config(), panel.train_config(), ""
        except ValueError as exc:
            model, train, problem = None, None, str(exc)
        self.app.set_configs(model, train, problem, preset=panel.preset_combo.currentText())
        self.app.select_backend(panel.backend_name() or AUTO)

    # the model -> the fields ---------------------------------------------------------
    def _on_model(self, app: AppModel, change: Change, subject) -> None:
        if change == Change.SETTINGS:
            self._show_settings()
        elif change == Change.BACKEND:
            self.show_backend()
            if isinstance(subject, prebuild.BuildOutcome):
                self._tell_build(subject)
        elif change == Change.DATASET and app.dataset.corpus is not None:
            self.panel.set_vocab_size(app.dataset.corpus.vocab_size)

    def _show_settings(self) -> None:
        s, panel = self.app.settings, self.panel
        if s.model is None or s.train is None:
            return  # the fields are what is invalid: they stay as typed
        try:
            same = panel.model_config() == s.model and panel.train_config() == s.train
        except ValueError:
            same = False
        if panel.preset_combo.currentText() != s.preset or not same:
            panel.set_configs(s.model, s.train, preset=s.preset)

    def show_backend(self) -> None:
        app, panel = self.app, self.panel
        choice = app.choice()
        building = app.build_status()
        tip = (choice.reason if choice is not None else "") + (f"; {building}" if building else "")
        panel.set_auto_text(choice.label if choice is not None else AUTO, tip)
        if panel.backend_name() != app.backend:
            panel.select_backend(app.backend)

    def _tell_build(self, outcome: prebuild.BuildOutcome) -> None:
        if outcome.phase == prebuild.BuildPhase.DONE:
            self.notify.status(f"{outcome.message}: the next run trains on it", BUILT_MS)
        elif outcome.phase == prebuild.BuildPhase.FAILED:
            self.notify.show_message("warning", "Background build failed",
                                     f"{outcome.message}. The automatic choice leaves {outcome.backend} out.")
