"""The window driven through its widgets (pytest-qt, offscreen), checked against
independent engine runs of the same configuration."""
import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QListWidget, QProgressBar, QPushButton, QSpinBox

import engine
from engine import backends as registry
from engine.training.protocol import Samples

TIMEOUT_MS = 60_000


def widget(window, cls, name):
    found = window.findChild(cls, name)
    assert found is not None, f"no {cls.__name__} named {name}"
    return found


def set_steps(window, steps):
    widget(window, QSpinBox, "stepsSpin").setValue(steps)


def click(qtbot, window, name):
    button = widget(window, QPushButton, name)
    assert button.isEnabled(), f"{name} is disabled: {button.toolTip()}"
    qtbot.mouseClick(button, Qt.LeftButton)


def wait_state(qtbot, window, state):
    qtbot.waitUntil(lambda: window.state == state, timeout=TIMEOUT_MS)


def wait_steps(qtbot, window, n=1):
    qtbot.waitUntil(lambda: window.loss_plot.series.n >= n, timeout=TIMEOUT_MS)


def curve(window):
    """The raw loss curve as pyqtgraph holds it (x, y)."""
    x, y = window.loss_plot.raw_curve.getOriginalDataset()
    return (np.empty(0), np.empty(0)) if x is None else (np.asarray(x), np.asarray(y))


def reference_backend(corpus, num_steps, preset="tiny", backend="numpy"):
    """The window's run of `preset` for num_steps steps, opened straight through the
    engine on `backend`, untrained."""
    p = engine.PRESETS[preset]
    train = engine.TrainConfig(num_steps=num_steps, learning_rate=p.train.learning_rate,
                               init_std=p.train.init_std, seed=p.train.seed)
    return engine.open_backend(backend, p.model, train, corpus)


def reference_losses(corpus, steps, preset="tiny", first=None, backend="numpy"):
    """The same run (num_steps=steps) straight through the engine, in one train() call
    of `first` steps (all of them by default)."""
    return reference_backend(corpus, steps, preset, backend).train(first or steps)


def train_to_end(qtbot, window, steps):
    set_steps(window, steps)
    click(qtbot, window, "trainButton")
    wait_state(qtbot, window, "done")


def test_tiny_run_completes_and_the_curve_holds_every_step(make_window, names_path, names_corpus, qtbot):
    window = make_window(names_path)
    assert widget(window, QComboBox, "presetCombo").currentText() == "tiny"
    train_to_end(qtbot, window, 200)
    x, y = curve(window)
    history = window.session.worker.loss_history()
    assert len(history) == 200
    np.testing.assert_array_equal(x, np.arange(1, 200 + 1))  # steps from 1
    np.testing.assert_array_equal(y.astype(np.float32), history)
    np.testing.assert_array_equal(history, reference_losses(names_corpus, 200))
    bar = widget(window, QProgressBar, "progressBar")
    assert bar.value() == bar.maximum() == 200
    assert not widget(window, QPushButton, "stopButton").isEnabled()
    assert window.status_labels["step"].text() == "Step 200 / 200"
    assert window.status_labels["loss"].text() == f"Loss {history[-1]:.4f}"


def test_loss_falls(make_window, names_path, qtbot):
    window = make_window(names_path)
    train_to_end(qtbot, window, 300)
    _, y = curve(window)
    assert len(y) == 300
    assert y[-50:].mean() < y[:50].mean()
    assert y[0] == pytest.approx(np.log(window.corpus.vocab_size), abs=0.3)  # starts near uniform


def test_sampling_during_and_after_training(make_window, names_path, names_corpus, qtbot):
    window = make_window(names_path)
    alphabet = set(window.corpus.chars)
    samples = widget(window, QListWidget, "samplesList")
    widget(window, QSpinBox, "sampleCountSpin").setValue(8)
    set_steps(window, 100_000)
    assert not widget(window, QPushButton, "sampleButton").isEnabled()  # nothing trained yet
    click(qtbot, window, "trainButton")
    wait_steps(qtbot, window)
    seen = []
    window.session.worker.reported.connect(
        lambda event: isinstance(event, Samples) and seen.append((window.state, event.step)))
    click(qtbot, window, "sampleButton")
    # both reach the GUI thread as queued events, the list's first: wait for both
    qtbot.waitUntil(lambda: samples.count() == 8 and bool(seen), timeout=TIMEOUT_MS)
    during = [samples.item(i).text() for i in range(samples.count())]
    assert seen[0][1] < 100_000
    steps_then = window.loss_plot.series.n
    wait_steps(qtbot, window, steps_then + 1)  # training went on after the sample
    assert window.state == "running"
    click(qtbot, window, "stopButton")
    wait_state(qtbot, window, "done")
    samples.clear()
    click(qtbot, window, "sampleButton")
    qtbot.waitUntil(lambda: samples.count() == 8, timeout=TIMEOUT_MS)
    after = [samples.item(i).text() for i in range(samples.count())]
    for names in (during, after):
        assert set("".join(names)) <= alphabet
        assert any(names)
    # sampling mid-run left training alone: the curve is the undisturbed run's
    _, y = curve(window)
    np.testing.assert_array_equal(y.astype(np.float32), reference_losses(names_corpus, 100_000, first=len(y)))


def test_pause_resume_continues_from_the_same_step(make_window, names_path, names_corpus, qtbot):
    window = make_window(names_path)
    set_steps(window, 300)
    click(qtbot, window, "trainButton")
    wait_steps(qtbot, window)
    click(qtbot, window, "trainButton")  # Pause
    wait_state(qtbot, window, "paused")
    paused_at = window.session.worker.step
    assert 0 < paused_at < 300
    assert window.loss_plot.series.n == paused_at
    assert widget(window, QPushButton, "trainButton").text() == "Resume"
    assert widget(window, QPushButton, "stopButton").isEnabled()
    click(qtbot, window, "trainButton")  # Resume
    wait_state(qtbot, window, "done")
    x, y = curve(window)
    np.testing.assert_array_equal(x, np.arange(1, 300 + 1))  # steps from 1
    np.testing.assert_array_equal(y.astype(np.float32), reference_losses(names_corpus, 300))


def test_stop_ends_the_run_early(make_window, names_path, qtbot):
    window = make_window(names_path)
    set_steps(window, 100_000)
    click(qtbot, window, "trainButton")
    wait_steps(qtbot, window)
    assert widget(window, QPushButton, "stopButton").isEnabled()
    click(qtbot, window, "stopButton")
    wait_state(qtbot, window, "done")
    step = window.session.worker.step
    qtbot.wait(100)  # nothing more arrives after the stop
    assert window.session.worker.step == step == window.loss_plot.series.n < 100_000
    assert not widget(window, QPushButton, "stopButton").isEnabled()
    assert widget(window, QProgressBar, "progressBar").value() == step
    assert widget(window, QPushButton, "trainButton").text() == "Resume"  # the run stays: it can go on
    # and the status bar says so (issue 27: "Run ended" though Resume was offered)
    message = window.statusBar().message()
    assert f"Stopped at step {step:,}: Resume trains on" in message and "ended" not in message


def test_reset_clears_the_run(make_window, names_path, qtbot):
    window = make_window(names_path)
    train_to_end(qtbot, window, 50)
    click(qtbot, window, "sampleButton")
    qtbot.waitUntil(lambda: widget(window, QListWidget, "samplesList").count() > 0, timeout=TIMEOUT_MS)
    thread = window.session.thread
    click(qtbot, window, "resetButton")
    assert window.session is None
    wait_state(qtbot, window, "none")  # once the worker has finished
    assert thread.isFinished()
    assert window.loss_plot.series.n == 0 and len(curve(window)[1]) == 0
    assert widget(window, QListWidget, "samplesList").count() == 0
    assert widget(window, QProgressBar, "progressBar").value() == 0
    assert widget(window, QSpinBox, "n_embdSpin").isEnabled()
    assert not widget(window, QPushButton, "resetButton").isEnabled()
    assert widget(window, QPushButton, "trainButton").isEnabled()


def test_close_mid_run_ends_the_thread_then_closes(make_window, names_path, qtbot):
    window = make_window(names_path)
    set_steps(window, 100_000)
    click(qtbot, window, "trainButton")
    wait_steps(qtbot, window)
    thread = window.session.thread
    assert thread.isRunning()
    with qtbot.waitSignal(window.closed, timeout=TIMEOUT_MS):  # nothing to write: closed at once
        window.close()
        assert not window.isVisible() and window.session is None
    qtbot.waitUntil(thread.isFinished, timeout=TIMEOUT_MS)  # the worker ended its run


def test_invalid_config_blocks_train_with_the_reason(make_window, names_path, qtbot):
    window = make_window(names_path)
    train = widget(window, QPushButton, "trainButton")
    assert train.isEnabled()
    widget(window, QSpinBox, "n_embdSpin").setValue(10)
    widget(window, QSpinBox, "n_headSpin").setValue(4)
    assert not train.isEnabled()
    assert "divisible by n_head" in train.toolTip()
    assert widget(window, QSpinBox, "n_embdSpin").property("invalid") is True
    assert window.config_panel.params_label.text() == "-"
    widget(window, QSpinBox, "n_embdSpin").setValue(12)
    assert train.isEnabled()
    assert window.config_panel.params_label.text() == f"{engine.ModelConfig(12, 1, 4, 16).num_params(27):,}"


def test_unavailable_backend_is_disabled_with_its_reason(make_window, names_path, monkeypatch):
    reason = "fakec compiler not found on PATH"
    monkeypatch.setitem(registry._REGISTRY, "fake-missing", (lambda: (False, reason), None))
    window = make_window(names_path)
    combo = widget(window, QComboBox, "backendCombo")
    names = [combo.itemData(i) for i in range(combo.count())]
    assert names[0] == "auto"  # the automatic choice first, then every backend in the registry's order
    assert names[1: 1 + len(engine.list_backends())] == [info.name for info in engine.list_backends()]
    index = names.index("fake-missing")
    assert not combo.model().item(index).isEnabled()
    assert combo.itemData(index, Qt.ToolTipRole) == reason
    assert combo.model().item(names.index("numpy")).isEnabled()
    assert not window.config_panel.select_backend("fake-missing")
    assert combo.currentData() == "auto" == window.app.backend  # the first entry that can run


def test_backend_failure_is_reported_and_the_window_stays_usable(make_window, names_path, qtbot, monkeypatch):
    def fail_to_open(model, train, corpus, params):
        raise engine.BackendError("fake backend: compiling kernels failed",
                                  details="kernel.fut:1:1: error: a compiler log")

    monkeypatch.setitem(registry._REGISTRY, "fake-broken", (lambda: (True, "compiles on first use"), fail_to_open))
    window = make_window(names_path)
    shown = []
    window.message_hook = lambda parent, kind, title, text, details: shown.append((kind, text, details))
    assert window.config_panel.select_backend("fake-broken")
    set_steps(window, 20)
    click(qtbot, window, "trainButton")
    wait_state(qtbot, window, "failed")
    assert shown[-1] == ("error", "fake backend: compiling kernels failed", "kernel.fut:1:1: error: a compiler log")
    assert not widget(window, QPushButton, "stopButton").isEnabled()
    window.config_panel.select_backend("numpy")
    train_to_end(qtbot, window, 20)
    assert window.loss_plot.series.n == 20


def test_settings_persist_between_windows(make_window, names_path):
    window = make_window(names_path)
    widget(window, QComboBox, "presetCombo").setCurrentText("s32")
    window.sample_panel.set_temperature(1.3)
    window.close()
    again = make_window(None)  # no --data: the last dataset comes back from the settings
    assert widget(again, QComboBox, "presetCombo").currentText() == "s32"
    assert widget(again, QSpinBox, "n_embdSpin").value() == 32
    assert again.sample_panel.temperature == pytest.approx(1.3)
    assert again.dataset_path == str(names_path)


def test_menus_about_and_hover_readout(make_window, names_path, qtbot):
    from PySide6.QtCore import QPointF
    from PySide6.QtGui import QAction

    window = make_window(names_path)
    for name in ("openDatasetAction", "saveCheckpointAction", "loadCheckpointAction", "exportCsvAction",
                 "exportPngAction", "quitAction"):
        assert not widget(window, QAction, name).shortcut().isEmpty(), name
    train_to_end(qtbot, window, 30)
    widget(window, QAction, "aboutAction").trigger()
    kind, title, text = window.messages[-1]
    assert "numpy" in text and engine.__version__ in text and np.__version__ in text
    plot = window.loss_plot
    view = plot.plot.getPlotItem().vb
    view.setRange(xRange=(0, 29), yRange=(1, 4), padding=0)
    losses = window.session.worker.loss_history()
    plot.plot.scene().sigMouseMoved.emit(view.mapViewToScene(QPointF(12.2, 2.0)))
    assert plot.readout.text().startswith(f"step 12: loss {losses[11]:.4f}")  # steps count from 1


@pytest.mark.parametrize("in_background", [False, True])
def test_a_smoothing_move_rebuilds_the_status_bar_once(make_window, names_path, qtbot, monkeypatch, in_background):
    from gui import loss_series
    from gui.loss_series import ema
    from gui.main_window import MainWindow

    if in_background:  # as a long run's is: the new smoothing comes from the worker thread
        monkeypatch.setattr(loss_series, "SYNC_STEPS", 0)

    rebuilds = []
    rebuild = MainWindow._update_status
    monkeypatch.setattr(MainWindow, "_update_status", lambda self, *a: (rebuilds.append(1), rebuild(self, *a)))
    window = make_window(names_path)
    train_to_end(qtbot, window, 40)
    plot = window.loss_plot
    plot.flush()
    qtbot.wait(100)  # any redraw still scheduled has come
    losses = window.session.worker.loss_history()
    rebuilds.clear()
    with qtbot.waitSignal(plot.redrawn, timeout=TIMEOUT_MS):
        plot.smoothing_slider.setValue(600)
    qtbot.wait(100)  # a second rebuild would come meanwhile
    assert len(rebuilds) == 1
    assert window.status_labels["smoothed"].text() == f"Smoothed {ema(losses, 0.6)[0][-1]:.4f}"


def test_copy_puts_the_names_on_the_clipboard(make_window, names_path, qtbot):
    from PySide6.QtGui import QGuiApplication

    window = make_window(names_path)
    train_to_end(qtbot, window, 20)
    samples = widget(window, QListWidget, "samplesList")
    click(qtbot, window, "sampleButton")
    qtbot.waitUntil(lambda: samples.count() == 10, timeout=TIMEOUT_MS)
    qtbot.mouseClick(widget(window, QPushButton, "copyButton"), Qt.LeftButton)
    assert QGuiApplication.clipboard().text().split("\n") == window.sample_panel.names()
    samples.item(3).setSelected(True)
    window.sample_panel.copy_to_clipboard()
    assert QGuiApplication.clipboard().text() == samples.item(3).text()


def test_divergence_keeps_the_good_steps_and_reports(make_window, names_path, names_corpus, qtbot, monkeypatch):
    from engine.backends.numpy_backend import NumpyBackend

    bad_step = 7

    class DivergingBackend(NumpyBackend):
        """The NumPy backend, except that step 7's loss comes out NaN."""

        name = "diverging"

        def _train_steps(self, k):
            if self._step + k <= bad_step:
                return super()._train_steps(k)
            good = super()._train_steps(bad_step - self._step) if self._step < bad_step else np.empty(0)
            return np.append(good, np.float32(np.nan)).astype(np.float32)

    monkeypatch.setitem(registry._REGISTRY, "diverging",
                        (lambda: (True, "test backend"), lambda m, t, c, p: DivergingBackend(m, t, c, p)))
    window = make_window(names_path)
    assert window.config_panel.select_backend("diverging")
    train_to_end(qtbot, window, 50)
    kind, _, text = window.messages[-1]
    assert kind == "error" and f"diverged at step {bad_step + 1}" in text
    x, y = curve(window)
    np.testing.assert_array_equal(x, np.arange(1, bad_step + 1))  # steps from 1
    np.testing.assert_array_equal(y.astype(np.float32), reference_losses(names_corpus, 50)[:bad_step])
    assert window.session.worker.step == bad_step
    assert widget(window, QPushButton, "trainButton").isEnabled()
    click(qtbot, window, "sampleButton")  # the parameters from before the bad step still sample
    qtbot.waitUntil(lambda: widget(window, QListWidget, "samplesList").count() > 0, timeout=TIMEOUT_MS)
