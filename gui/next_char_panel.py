"""The next-character panel: type a prefix and see the model's distribution
over the next character as bars (every character, and "end"), the most
likely completions by beam search, and names sampled from the prefix.

The numbers come from engine.model.introspect through an InspectHub (off the GUI
thread, the newest keystroke wins); sampling is asked of the window with
sampleRequested and the names come back through show_samples.
"""
from __future__ import annotations

import math
import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (QCheckBox, QDoubleSpinBox, QGridLayout, QHBoxLayout, QLabel,
                               QLineEdit, QListWidget, QPushButton, QSpinBox, QVBoxLayout, QWidget)

from engine.model import introspect as ins

from .inspect_hub import InspectHub
from .controls import buddy, plot_widget, take_seed

NEXT_KEY, COMPLETIONS_KEY = "nextchar", "completions"
COMPLETIONS_DELAY_MS = 150  # beam search starts once typing pauses this long (the bars do not wait)
COMPLETIONS_REFRESH_S = 1.0  # during training, new parameters re-run the search at most this often
BAR_BRUSH, END_BRUSH = pg.mkBrush(20, 70, 170), pg.mkBrush(200, 60, 60)


class NextCharPanel(QWidget):
    sampleRequested = Signal(str, int, float, int)  # prefix, number of names, temperature, seed
    nameActivated = Signal(str)        # a completion or sample double-clicked (e.g. for the attention view)
    distributionShown = Signal(object)  # the engine.model.introspect.NextChar now on the bars
    completionsShown = Signal(object)  # the list of engine.model.introspect.Completion now listed

    def __init__(self, hub: InspectHub, parent=None):
        super().__init__(parent, objectName="nextCharPanel")
        self.hub = hub
        self.distribution: ins.NextChar | None = None
        self.completions: list[ins.Completion] = []
        self.completions_step: int | None = None  # the parameters' step the completions come from
        self._order: list[int] = []
        self._stale = True  # the shown results predate the newest snapshot or input
        self._completions_requested = -math.inf
        self._completions_timer = QTimer(self, singleShot=True, interval=COMPLETIONS_DELAY_MS)
        self._completions_timer.timeout.connect(self._request_completions)
        # during training: the newest parameters' search, once the last one is a second old
        self._completions_refresh_timer = QTimer(self, singleShot=True)
        self._completions_refresh_timer.timeout.connect(lambda: self._request_completions(refresh=True))

        self.prefix_edit = QLineEdit(objectName="prefixEdit", placeholderText="type the start of a name")
        self.prefix_edit.setToolTip("The start of a name: the bars show what the model expects next "
                                    "(empty: the first letter)")
        self.prefix_edit.setClearButtonEnabled(True)
        self.temperature_spin = QDoubleSpinBox(objectName="nextCharTemperatureSpin", minimum=0.1, maximum=2.0,
                                               singleStep=0.1, value=0.5, decimals=2)
        self.temperature_spin.setToolTip("Temperature of the distribution, the completions and the samples")
        self.sort_check = QCheckBox("&Sort by probability", objectName="nextCharSortCheck", checked=True)
        self.sort_check.setToolTip("Bars from the most to the least likely; off: alphabetical")
        self.plot = plot_widget("nextCharPlot", "The model's probability of each next character; 'end' ends the name")
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.8)
        item = self.plot.getPlotItem()
        item.addItem(self.bars)
        item.setLabel("left", "probability")
        item.getAxis("left").enableAutoSIPrefix(False)
        item.setMenuEnabled(False)
        item.setMouseEnabled(x=False, y=False)
        item.hideButtons()
        self.readout = QLabel(" ", objectName="nextCharReadout")
        self.info = QLabel(" ", objectName="nextCharInfo", wordWrap=True)

        self.width_spin = QSpinBox(objectName="beamWidthSpin", minimum=1, maximum=20, value=5)
        self.width_spin.setToolTip("Beam width: how many completions to search for and list")
        self.completions_list = QListWidget(objectName="completionsList")
        self.completions_list.setToolTip("The most likely names that start with the prefix, with their "
                                         "probability (double-click: show its attention)")
        self.count_spin = QSpinBox(objectName="prefixCountSpin", minimum=1, maximum=100, value=8)
        self.count_spin.setToolTip("How many names to sample from the prefix")
        self.seed_spin = QSpinBox(objectName="prefixSeedSpin", minimum=0, maximum=2**31 - 1, value=0)
        self.seed_spin.setToolTip("Random seed of the sampler; it moves on by one after each sample")
        self.sample_button = QPushButton("Sample from this p&refix", objectName="prefixSampleButton")
        self.sample_button.setToolTip("Draw names that start with the prefix, at this temperature and seed")
        self.samples_list = QListWidget(objectName="prefixSamplesList")
        self.samples_list.setToolTip("Names sampled from the prefix (double-click: show its attention)")
        for listing in (self.completions_list, self.samples_list):
            listing.setStyleSheet("font-family: monospace;")

        top = QHBoxLayout()
        top.addWidget(buddy("&Prefix", self.prefix_edit))
        top.addWidget(self.prefix_edit, 2)
        top.addWidget(buddy("Te&mperature", self.temperature_spin))
        top.addWidget(self.temperature_spin)
        top.addWidget(self.sort_check)
        completions = QHBoxLayout()
        completions.addWidget(buddy("Beam &width", self.width_spin))
        completions.addWidget(self.width_spin)
        completions.addStretch(1)
        sampling = QHBoxLayout()
        sampling.addWidget(buddy("&Names", self.count_spin))
        sampling.addWidget(self.count_spin)
        sampling.addWidget(buddy("S&eed", self.seed_spin))
        sampling.addWidget(self.seed_spin)
        sampling.addWidget(self.sample_button)
        sampling.addStretch(1)
        lists = QGridLayout()
        self.completions_title = QLabel("<b>Most likely completions</b>")
        lists.addWidget(self.completions_title, 0, 0)
        lists.addWidget(QLabel("<b>Sampled from the prefix</b>"), 0, 1)
        lists.addLayout(completions, 1, 0)
        lists.addLayout(sampling, 1, 1)
        lists.addWidget(self.completions_list, 2, 0)
        lists.addWidget(self.samples_list, 2, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.plot, 3)
        layout.addWidget(self.readout)
        layout.addLayout(lists, 2)
        layout.addWidget(self.info)
        for first, second in zip(
                [self.prefix_edit, self.temperature_spin, self.sort_check, self.width_spin, self.completions_list,
                 self.count_spin, self.seed_spin, self.sample_button],
                [self.temperature_spin, self.sort_check, self.width_spin, self.completions_list, self.count_spin,
                 self.seed_spin, self.sample_button, self.samples_list]):
            QWidget.setTabOrder(first, second)

        self.prefix_edit.textChanged.connect(self.request)
        self.temperature_spin.valueChanged.connect(self.request)
        self.width_spin.valueChanged.connect(lambda *_: self._completions_timer.start())  # not start(msec)
        self.sort_check.toggled.connect(self._draw_bars)
        self.sample_button.clicked.connect(self._request_samples)
        for listing in (self.completions_list, self.samples_list):
            listing.itemActivated.connect(lambda item: self.nameActivated.emit(item.data(Qt.UserRole)))
        self.plot.scene().sigMouseMoved.connect(self._on_mouse_moved)
        hub.register(self)

    # inputs -----------------------------------------------------------------
    @property
    def prefix(self) -> str:
        return self.prefix_edit.text()

    @property
    def temperature(self) -> float:
        return self.temperature_spin.value()

    def set_prefix(self, text: str) -> None:
        self.prefix_edit.setText(text)

    def set_temperature(self, value: float) -> None:
        self.temperature_spin.setValue(value)

    def request(self, *_, refresh: bool = False) -> None:
        """Ask for the bars and the completions of the current prefix (a keystroke
        supersedes what is being computed; a refresh lets it finish)."""
        if not self.isVisible() and refresh:
            self._stale = True  # computed when shown
            return
        self._stale = False
        if not self.hub.request(NEXT_KEY, ins.next_char, self.prefix, self.temperature, refresh=refresh):
            return
        if refresh:
            wait_s = COMPLETIONS_REFRESH_S - (time.monotonic() - self._completions_requested)
            if wait_s <= 0:
                self._request_completions(refresh=True)
            elif not self._completions_refresh_timer.isActive():
                self._completions_refresh_timer.start(int(1000 * wait_s) + 1)
        else:  # typing: drop the search for the old prefix now, start the new one when typing pauses
            self.hub.cancel(COMPLETIONS_KEY)
            self._completions_timer.start()

    def _request_completions(self, *_, refresh: bool = False) -> None:
        self._completions_requested = time.monotonic()
        self._completions_refresh_timer.stop()
        self.hub.request(COMPLETIONS_KEY, _complete_at_step, self.prefix, self.width_spin.value(), self.temperature,
                         refresh=refresh, slow=True)

    def _request_samples(self) -> None:
        self.sampleRequested.emit(self.prefix, self.count_spin.value(), self.temperature, take_seed(self.seed_spin))

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._stale:
            self.request(refresh=True)

    # results ------------------------------------------------------------------
    def _on_snapshot(self, snapshot) -> None:
        self.sample_button.setEnabled(snapshot is not None)
        if snapshot is None:
            self.clear()
            self.info.setText("Train a model or load a checkpoint to see what it predicts.")
            return
        self.request(refresh=True)

    def _on_result(self, key: str, result) -> None:
        if key == NEXT_KEY:
            self.distribution = result
            self.info.setText(f"After '{result.prefix}' at temperature {result.temperature:g}, "
                              f"from the parameters after step {result.step:,}")
            self._draw_bars()
            self.distributionShown.emit(result)
        elif key == COMPLETIONS_KEY:
            self.completions_step, result = result
            self.completions = result
            self.completions_title.setText(f"<b>Most likely completions</b> (step {self.completions_step:,})")
            self.completions_list.clear()
            for c in result:
                self._add_name(self.completions_list, f"{c.text:<16} {100 * c.prob:7.3f}%{'' if c.ended else ' (cut)'}",
                               c.text)
            self.completionsShown.emit(result)

    def _on_failed(self, key: str, message: str) -> None:
        if key in (NEXT_KEY, COMPLETIONS_KEY):
            self.info.setText(f"<span style='color:#b00020'>{message}</span>")

    def _draw_bars(self) -> None:
        d = self.distribution
        if d is None:
            return
        self._order = d.ranked() if self.sort_check.isChecked() else list(range(len(d.labels)))
        end = len(d.labels) - 1
        self.bars.setOpts(x=np.arange(len(self._order)), height=d.probs[self._order], width=0.8,
                          brushes=[END_BRUSH if i == end else BAR_BRUSH for i in self._order], pen=None)
        axis = self.plot.getPlotItem().getAxis("bottom")
        axis.setTicks([[(x, d.labels[i]) for x, i in enumerate(self._order)]])
        self.plot.setXRange(-0.6, len(self._order) - 0.4, padding=0)
        self.plot.setYRange(0, max(float(d.probs.max()) * 1.08, 1e-6), padding=0)

    def bar_heights(self) -> tuple[list[str], np.ndarray]:
        """(labels, heights) of the bars as drawn, left to right."""
        heights = self.bars.opts.get("height")
        return [self.distribution.labels[i] for i in self._order] if self.distribution else [], \
            np.asarray(heights if heights is not None else [], dtype=np.float64)

    def show_samples(self, names: list[str], step: int | None = None) -> None:
        self.samples_list.clear()
        for name in names:
            self._add_name(self.samples_list, name, name)

    def clear(self) -> None:
        self.distribution, self.completions, self.completions_step, self._order = None, [], None, []
        self.completions_title.setText("<b>Most likely completions</b>")
        self.bars.setOpts(x=[], height=[])
        for listing in (self.completions_list, self.samples_list):
            listing.clear()
        self.readout.setText(" ")

    @staticmethod
    def _add_name(listing: QListWidget, text: str, name: str) -> None:
        listing.addItem(text)
        listing.item(listing.count() - 1).setData(Qt.UserRole, name)

    def _on_mouse_moved(self, pos) -> None:
        d, view = self.distribution, self.plot.getPlotItem().vb
        if d is None or not view.sceneBoundingRect().contains(pos):
            return
        x = int(round(view.mapSceneToView(pos).x()))
        if 0 <= x < len(self._order):
            i = self._order[x]
            label = d.labels[i] if i < len(d.labels) - 1 else "end (the name ends)"
            self.readout.setText(f"'{d.prefix}' + {label}: {100 * d.probs[i]:.2f}%")


def _complete_at_step(snap: ins.Snapshot, *args, cancel=None) -> tuple[int, list[ins.Completion]]:
    """engine.model.introspect.complete, with the step of the parameters it searched."""
    return snap.step, ins.complete(snap, *args, cancel=cancel)
