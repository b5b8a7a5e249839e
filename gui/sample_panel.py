"""The sampling panel: temperature, number of samples, seed, max length, Sample, the names, Copy."""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (QFormLayout, QGroupBox, QHBoxLayout, QLabel, QListWidget,
                               QAbstractItemView, QListView, QPushButton, QSlider, QSpinBox, QVBoxLayout)

from .controls import take_seed

TEMPERATURE_SCALE = 10  # slider ticks per unit: 1..20 is 0.1..2.0
AUTO_LENGTH = 0  # the Max length box's "auto": the engine's default (Backend.default_max_length)
MAX_LENGTH_LIMIT = 1_000_000  # the box's top until a model tells it its block_size


class SamplePanel(QGroupBox):
    """Asks for samples (sampleRequested) and shows the names it is given.

    The Sample button is the window's to connect (it mirrors the Run menu's
    Sample action, which owns Ctrl+G); `request` is what it does."""

    sampleRequested = Signal(int, float, int, object)  # number, temperature, seed, max length (None: auto)

    def __init__(self, parent=None):
        super().__init__("Samples", parent)
        self.temperature_slider = QSlider(Qt.Horizontal, objectName="temperatureSlider")
        self.temperature_slider.setRange(1, 20)
        self.temperature_slider.setValue(5)
        self.temperature_slider.setToolTip("Lower: safer, more common names; higher: more inventive")
        self.temperature_label = QLabel()
        self.count_spin = QSpinBox(objectName="sampleCountSpin", minimum=1, maximum=200, value=10)
        self.seed_spin = QSpinBox(objectName="sampleSeedSpin", minimum=0, maximum=2**31 - 1, value=0)
        self.seed_spin.setToolTip("Random seed of the sampler; it moves on by one after each Sample")
        self.max_length_spin = QSpinBox(objectName="sampleMaxLengthSpin", minimum=AUTO_LENGTH,
                                        maximum=MAX_LENGTH_LIMIT, value=AUTO_LENGTH)
        self.max_length_spin.setSpecialValueText("auto")
        self.max_length_spin.setToolTip("Names stop at this many characters; auto: the longest training "
                                        "name plus 5, at most the model's block size")
        self.sample_button = QPushButton("Sample", objectName="sampleButton")
        self.copy_button = QPushButton("Copy", objectName="copyButton")
        self.copy_button.setToolTip("Copy the selected names (all if none is selected)")
        self.copy_button.setEnabled(False)  # until there are names
        self.samples_list = QListWidget(objectName="samplesList")
        self.samples_list.setSelectionMode(QAbstractItemView.ExtendedSelection)
        self.info = QLabel(" ", objectName="sampleInfo")
        copy = QShortcut(QKeySequence.Copy, self.samples_list, self.copy_to_clipboard)
        copy.setContext(Qt.WidgetWithChildrenShortcut)  # Ctrl+C elsewhere copies as usual

        self.samples_list.setFlow(QListView.LeftToRight)  # names fill rows, then wrap
        self.samples_list.setWrapping(True)
        self.samples_list.setResizeMode(QListView.Adjust)
        self.samples_list.setGridSize(QSize(130, 24))
        self.samples_list.setTextElideMode(Qt.ElideNone)
        self.setMinimumHeight(215)  # the four settings, the buttons and a two-line info

        temperature = QHBoxLayout()
        temperature.addWidget(self.temperature_slider, 1)
        temperature.addWidget(self.temperature_label)
        form = QFormLayout()
        form.addRow("Temperature", temperature)
        form.addRow("Names", self.count_spin)
        form.addRow("Seed", self.seed_spin)
        form.addRow("Max length", self.max_length_spin)
        buttons = QHBoxLayout()
        buttons.addWidget(self.sample_button)
        buttons.addWidget(self.copy_button)
        controls = QVBoxLayout()
        controls.addLayout(form)
        controls.addLayout(buttons)
        controls.addStretch(1)
        controls.addWidget(self.info)
        self.info.setWordWrap(True)
        layout = QHBoxLayout(self)
        layout.addLayout(controls)
        layout.addWidget(self.samples_list, 1)
        for control in (self.temperature_slider, self.count_spin, self.seed_spin, self.max_length_spin):
            control.setMaximumWidth(160)
        self.temperature_slider.setMinimumWidth(120)

        self.temperature_slider.valueChanged.connect(self._show_temperature)
        self.copy_button.clicked.connect(self.copy_to_clipboard)
        self._show_temperature(self.temperature_slider.value())

    @property
    def temperature(self) -> float:
        return self.temperature_slider.value() / TEMPERATURE_SCALE

    def set_temperature(self, value: float) -> None:
        self.temperature_slider.setValue(round(value * TEMPERATURE_SCALE))

    @property
    def max_length(self) -> int | None:
        """The names' length limit in characters; None: auto (the engine's default)."""
        value = self.max_length_spin.value()
        return None if value == AUTO_LENGTH else value

    def set_block_size(self, block_size: int) -> None:
        """The opened model's block_size: the longest a name can be (a larger choice comes down to it)."""
        self.max_length_spin.setMaximum(block_size)

    def _show_temperature(self, value: int) -> None:
        self.temperature_label.setText(f"{value / TEMPERATURE_SCALE:.1f}")

    def request(self) -> None:
        """Emit sampleRequested with the current values; the seed then moves on by one."""
        self.sampleRequested.emit(self.count_spin.value(), self.temperature, take_seed(self.seed_spin),
                                  self.max_length)

    def show_samples(self, names: list[str], step: int) -> None:
        self.samples_list.clear()
        self.samples_list.addItems(names)
        self.info.setText(f"{len(names)} names from the parameters after step {step:,}")
        self.copy_button.setEnabled(bool(names))

    def names(self) -> list[str]:
        return [self.samples_list.item(i).text() for i in range(self.samples_list.count())]

    def clear(self) -> None:
        self.samples_list.clear()
        self.info.setText(" ")
        self.copy_button.setEnabled(False)  # nothing to copy

    def copy_to_clipboard(self) -> None:
        selected = [item.text() for item in self.samples_list.selectedItems()]
        text = "\n".join(selected or self.names())
        if text:
            QGuiApplication.clipboard().setText(text)
