"""The settings column: dataset, model (preset and its fields), training values
and backend. It turns the fields into engine configs and says why they are
invalid; the engine's own validation is the one source of those reasons.
"""
from __future__ import annotations

import os

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import (QComboBox, QDoubleSpinBox, QFormLayout, QGroupBox, QHBoxLayout,
                               QLabel, QPushButton, QSizePolicy, QSpinBox, QVBoxLayout, QWidget)

import engine
from engine.backends.choice import AUTO

MODEL_FIELDS = ("n_embd", "n_layer", "n_head", "block_size")
LIMITS = engine.config.FIELD_LIMITS  # the engine's ranges: a checkpoint outside them is refused
FIELD_RANGES = {name: LIMITS["model." + name] for name in MODEL_FIELDS}
AUTO_HOLDOUT = -1  # the Held-out field's "auto": engine.data.split.default_holdout
BATCH_TIP = ("Documents (names) per step: each step trains on the next B of them (padded and masked) with one Adam "
             "update; 1 is microgpt's")
INVALID_TINT = QColor("#f9d2d7")  # an invalid field's background (the native frame and arrows stay)
AUTO_TIP = "The fastest backend here for this preset and batch size, from measured speeds"


class PathLabel(QLabel):
    """A file path elided in the middle to fit, keeping the file name whole where
    it fits; the full path is its tooltip and `path`."""

    def __init__(self, placeholder: str, **kwargs):
        super().__init__(**kwargs)
        self.path, self._placeholder = "", placeholder
        self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)  # elide rather than widen the column
        self.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self._elide()

    def set_path(self, path: str) -> None:
        self.path = str(path)
        self.setToolTip(self.path)
        self._elide()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        if not self.path:
            super().setText(self._placeholder)
            return
        metrics, width = self.fontMetrics(), max(self.width(), 40)
        folder, name = os.path.split(self.path)
        tail = os.sep + name
        room = width - metrics.horizontalAdvance(tail)
        if folder and metrics.horizontalAdvance(self.path) > width and room > metrics.horizontalAdvance("/…"):
            text = metrics.elidedText(folder, Qt.ElideMiddle, room) + tail
        else:
            text = metrics.elidedText(self.path, Qt.ElideMiddle, width)
        super().setText(text)


def mark_invalid(spin: QSpinBox | QDoubleSpinBox, invalid: bool) -> None:
    """Tint an invalid field through its palette, not a style sheet: a style-sheet
    border replaces the native frame and its arrow buttons."""
    spin.setProperty("invalid", invalid)
    palette = QPalette()  # resolves nothing: the inherited palette, except what is set here
    if invalid:
        palette.setColor(QPalette.Base, INVALID_TINT)
    for widget in (spin, spin.lineEdit()):  # the line edit inside does not always inherit it
        widget.setPalette(palette)


class ConfigPanel(QWidget):
    changed = Signal()           # any field changed; configs or validity may differ
    openDatasetRequested = Signal()

    def __init__(self, parent=None, backends=None):
        super().__init__(parent)
        self._vocab_size: int | None = None
        self._filling = False

        # dataset
        self.dataset_path = PathLabel("no dataset yet", objectName="datasetPath")
        self.open_button = QPushButton("Open dataset...", objectName="openDatasetButton")
        self.dataset_info = QLabel(" ", objectName="datasetInfo", wordWrap=True)
        data_box = QGroupBox("Dataset")
        row = QHBoxLayout()
        row.addWidget(self.dataset_path, 1)
        row.addWidget(self.open_button)
        data_layout = QVBoxLayout(data_box)
        data_layout.addLayout(row)
        data_layout.addWidget(self.dataset_info)

        # model
        self.preset_combo = QComboBox(objectName="presetCombo")
        self.preset_combo.addItems(list(engine.PRESETS))
        self.preset_combo.setCurrentText(engine.config.DEFAULT_PRESET)  # learn is listed first, tiny selected
        self.fields: dict[str, QSpinBox] = {}
        model_box = QGroupBox("Model")
        model_form = QFormLayout(model_box)
        model_form.addRow("Preset", self.preset_combo)
        for name in MODEL_FIELDS:
            lo, hi = FIELD_RANGES[name]
            self.fields[name] = QSpinBox(objectName=name + "Spin", minimum=lo, maximum=hi)
            model_form.addRow(name, self.fields[name])
        self.params_label = QLabel(" ", objectName="paramsLabel")
        self.error_label = QLabel(" ", objectName="configError", wordWrap=True)
        self.error_label.setStyleSheet("color: #b00020;")
        model_form.addRow("Parameters", self.params_label)
        model_form.addRow(self.error_label)

        # training
        self.steps_spin = QSpinBox(objectName="stepsSpin", minimum=1, maximum=LIMITS["train.num_steps"][1])
        self.steps_spin.setGroupSeparatorShown(True)
        self.lr_spin = QDoubleSpinBox(objectName="learningRateSpin", decimals=6, minimum=LIMITS["train.learning_rate"][0],
                                      maximum=LIMITS["train.learning_rate"][1], singleStep=0.0005)
        self.std_spin = QDoubleSpinBox(objectName="initStdSpin", decimals=4, minimum=LIMITS["train.init_std"][0],
                                       maximum=LIMITS["train.init_std"][1], singleStep=0.01)
        self.seed_spin = QSpinBox(objectName="seedSpin", minimum=0, maximum=LIMITS["train.seed"][1])
        self.warmup_spin = QSpinBox(objectName="warmupStepsSpin", minimum=0, maximum=LIMITS["train.warmup_steps"][1])
        self.warmup_spin.setGroupSeparatorShown(True)
        self.warmup_spin.setSpecialValueText("none")  # 0: microgpt's schedule, full rate from step 1
        self.warmup_spin.setToolTip("Steps over which the learning rate rises linearly to its full value")
        self.batch_spin = QSpinBox(objectName="batchSpin", minimum=1, maximum=LIMITS["train.batch_size"][1])
        self.batch_spin.setToolTip(BATCH_TIP)
        self.holdout_spin = QSpinBox(objectName="holdoutSpin", minimum=AUTO_HOLDOUT,
                                     maximum=LIMITS["train.holdout"][1], suffix=" documents")
        self.holdout_spin.setGroupSeparatorShown(True)
        self.holdout_spin.setSpecialValueText("auto")  # at the minimum: min(1,000, 10% of the documents)
        self.holdout_spin.setToolTip("Documents (names) held out of training to measure the held-out loss on "
                                     "(the last of the training order): auto is min(1,000, 10% of the "
                                     "documents); 0 turns it off")
        steps_row = QHBoxLayout()
        steps_row.addWidget(self.steps_spin, 3)
        steps_row.addWidget(QLabel("Batch", buddy=self.batch_spin))
        steps_row.addWidget(self.batch_spin, 1)
        train_box = QGroupBox("Training")
        train_form = QFormLayout(train_box)
        train_form.addRow("Steps", steps_row)
        train_form.addRow("Held out", self.holdout_spin)
        train_form.addRow("Learning rate", self.lr_spin)
        train_form.addRow("Init std", self.std_spin)
        train_form.addRow("Seed", self.seed_spin)
        train_form.addRow("Warm-up steps", self.warmup_spin)

        # backend
        self.backend_combo = QComboBox(objectName="backendCombo")
        backend_box = QGroupBox("Backend")
        QVBoxLayout(backend_box).addWidget(self.backend_combo)
        self.refresh_backends(backends)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for box in (data_box, model_box, train_box, backend_box):
            layout.addWidget(box)
        self.settings_boxes = (model_box, train_box, backend_box)

        self.open_button.clicked.connect(self.openDatasetRequested)
        self.preset_combo.currentTextChanged.connect(self.apply_preset)
        for _, spin in self._named_spins():
            spin.valueChanged.connect(self._on_changed)
        self.backend_combo.currentIndexChanged.connect(self._on_changed)
        self.apply_preset(self.preset_combo.currentText())

    # backends ---------------------------------------------------------------
    def refresh_backends(self, backends=None) -> None:
        """The automatic choice first, then every registered backend (`backends`:
        engine.BackendInfo rows, by default engine.list_backends()); unavailable ones
        disabled, their reason as tooltip."""
        current = self.backend_name()
        combo = self.backend_combo
        combo.blockSignals(True)
        combo.clear()
        combo.addItem(AUTO, AUTO)
        combo.setItemData(0, AUTO_TIP, Qt.ToolTipRole)
        for info in engine.list_backends() if backends is None else backends:
            combo.addItem(info.name if info.available else f"{info.name} (unavailable)", info.name)
            index = combo.count() - 1
            combo.setItemData(index, info.reason, Qt.ToolTipRole)
            combo.model().item(index).setEnabled(info.available)
        combo.blockSignals(False)
        self.select_backend(current or AUTO)

    def set_auto_text(self, label: str, tip: str) -> None:
        """The automatic entry's text ("auto: futhark-multicore") and why it chose so."""
        if self.backend_combo.itemText(0) != label:
            self.backend_combo.setItemText(0, label)
        self.backend_combo.setItemData(0, f"{AUTO_TIP}. {tip}" if tip else AUTO_TIP, Qt.ToolTipRole)
        if self.backend_combo.currentIndex() == 0:
            self.backend_combo.setToolTip(self.backend_combo.itemData(0, Qt.ToolTipRole))

    def backend_name(self) -> str | None:
        """The selected backend's name, or AUTO."""
        return self.backend_combo.currentData()

    def select_backend(self, name: str) -> bool:
        """Select AUTO or an available backend by name (else the first available one)."""
        combo = self.backend_combo
        enabled = [i for i in range(combo.count()) if combo.model().item(i).isEnabled()]
        chosen = next((i for i in enabled if combo.itemData(i) == name), enabled[0] if enabled else -1)
        combo.setCurrentIndex(chosen)
        return chosen >= 0 and combo.itemData(chosen) == name

    # configs ----------------------------------------------------------------
    def apply_preset(self, name: str) -> None:
        preset = engine.PRESETS.get(name)
        if preset is not None:
            self.set_configs(preset.model, preset.train)

    def set_configs(self, model: engine.ModelConfig, train: engine.TrainConfig, preset: str | None = None) -> None:
        self._filling = True
        try:
            if preset is not None and preset in engine.PRESETS:
                self.preset_combo.blockSignals(True)
                self.preset_combo.setCurrentText(preset)
                self.preset_combo.blockSignals(False)
            for name in MODEL_FIELDS:
                self.fields[name].setValue(getattr(model, name))
            self.steps_spin.setValue(train.num_steps)
            self.lr_spin.setValue(train.learning_rate)
            self.std_spin.setValue(train.init_std)
            self.seed_spin.setValue(train.seed)
            # a checkpoint's may exceed the field's int range (setValue would raise)
            self.warmup_spin.setValue(min(train.warmup_steps, self.warmup_spin.maximum()))
            self.batch_spin.setValue(train.batch_size)
            self.holdout_spin.setValue(AUTO_HOLDOUT if train.holdout is None else train.holdout)
        finally:
            self._filling = False
        self._on_changed()

    def set_dataset_path(self, path: str) -> None:
        self.dataset_path.set_path(path)

    def num_params(self) -> int | None:
        """The parameter count of the model the fields describe (None if invalid or no dataset)."""
        try:
            return self.model_config().num_params(self._vocab_size) if self._vocab_size else None
        except ValueError:
            return None

    def set_vocab_size(self, vocab_size: int | None) -> None:
        self._vocab_size = vocab_size
        self._on_changed()

    def model_config(self) -> engine.ModelConfig:
        """The model the fields describe; ValueError (the engine's reason) if invalid."""
        return engine.ModelConfig(**{name: spin.value() for name, spin in self.fields.items()})

    def train_config(self) -> engine.TrainConfig:
        return engine.TrainConfig(num_steps=self.steps_spin.value(), learning_rate=self.lr_spin.value(),
                                  init_std=self.std_spin.value(), seed=self.seed_spin.value(),
                                  warmup_steps=self.warmup_spin.value(), batch_size=self.batch_spin.value(),
                                  holdout=self.holdout())

    def holdout(self) -> int | None:
        """The Held-out field as TrainConfig.holdout (None: auto)."""
        value = self.holdout_spin.value()
        return None if value == AUTO_HOLDOUT else value

    def problem(self) -> str:
        """Why Train cannot start with these settings ('' when it can)."""
        try:
            self.model_config()
            self.train_config()
        except ValueError as exc:
            return str(exc)
        if self.backend_name() is None:
            return "no backend is available"
        return ""

    def _on_changed(self, *_) -> None:
        if self._filling:
            return
        problem = ""
        try:
            model = self.model_config()
        except ValueError as exc:
            model, problem = None, str(exc)
        for name, spin in self.fields.items():  # flag the fields the reason names
            bad = bool(problem) and name in problem
            mark_invalid(spin, bad)
            spin.setToolTip(problem if bad else "")
        self.error_label.setText(problem)
        self.error_label.setVisible(bool(problem))
        if model is None:
            self.params_label.setText("-")
        elif self._vocab_size:
            self.params_label.setText(f"{model.num_params(self._vocab_size):,}")
        else:
            self.params_label.setText("(open a dataset)")
        self.changed.emit()

    def set_editable(self, editable: bool) -> None:
        for box in self.settings_boxes:
            box.setEnabled(editable)

    # settings ---------------------------------------------------------------
    def _named_spins(self) -> list[tuple[str, QSpinBox | QDoubleSpinBox]]:
        """Every config field, by its engine name (also its settings key)."""
        return [*self.fields.items(), ("num_steps", self.steps_spin), ("learning_rate", self.lr_spin),
                ("init_std", self.std_spin), ("seed", self.seed_spin), ("warmup_steps", self.warmup_spin),
                ("batch_size", self.batch_spin), ("holdout", self.holdout_spin)]

    def save_settings(self, settings) -> None:
        settings.setValue("preset", self.preset_combo.currentText())
        settings.setValue("backend", self.backend_name() or "")
        for name, spin in self._named_spins():
            settings.setValue("config/" + name, spin.value())

    def restore_settings(self, settings) -> None:
        preset = str(settings.value("preset", "tiny"))
        if preset in engine.PRESETS:
            self.preset_combo.setCurrentText(preset)
        self._filling = True
        try:
            for name, spin in self._named_spins():
                value = settings.value("config/" + name)
                if value is not None:
                    try:
                        spin.setValue(type(spin.value())(value))
                    except (TypeError, ValueError):
                        pass  # a hand-edited settings file: keep the preset's value
        finally:
            self._filling = False
        self.select_backend(str(settings.value("backend", AUTO)))  # a first start: the automatic choice
        self._on_changed()
