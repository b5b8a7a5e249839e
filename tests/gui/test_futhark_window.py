"""The window training on the Futhark backends (built from the shipped C, no
Futhark compiler needed), checked against the same backend driven straight
through the engine; and a failed Futhark train call, which uses up the
weights, reported with a way back."""
import numpy as np
import pytest
from PySide6.QtWidgets import QListWidget, QSpinBox

import engine
from engine.backends.futhark_backend import FutharkBackend
from futhark_support import MULTICORE_2_THREADS, assert_same_kernel_run
from test_window import TIMEOUT_MS, click, curve, reference_losses, set_steps, train_to_end, wait_state, widget

pytestmark = [pytest.mark.futhark, pytest.mark.usefixtures("futhark_cpu_builds")]

STEPS = 300


def same_kernel_run(name, actual, expected):
    """The same kernel's losses (assert_same_kernel_run), to NumPy's 1e-4 on two threads."""
    assert_same_kernel_run(name, actual, expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", ["futhark-c", MULTICORE_2_THREADS])
def test_a_futhark_run_in_the_window_is_the_engines(name, make_window, names_path, names_corpus, qtbot):
    window = make_window(names_path)
    assert window.config_panel.select_backend(name)
    train_to_end(qtbot, window, STEPS)
    x, y = curve(window)
    expected = reference_losses(names_corpus, STEPS, backend=name)
    np.testing.assert_array_equal(x, np.arange(1, STEPS + 1))  # steps from 1
    same_kernel_run(name, y.astype(np.float32), expected)
    np.testing.assert_allclose(expected, reference_losses(names_corpus, STEPS), rtol=0, atol=1e-4)
    samples = widget(window, QListWidget, "samplesList")
    widget(window, QSpinBox, "sampleCountSpin").setValue(6)
    click(qtbot, window, "sampleButton")
    qtbot.waitUntil(lambda: samples.count() == 6, timeout=TIMEOUT_MS)
    names = [samples.item(i).text() for i in range(samples.count())]
    assert set("".join(names)) <= set(window.corpus.chars) and any(names)


@pytest.mark.parametrize("name", ["futhark-c", MULTICORE_2_THREADS])
def test_a_batched_futhark_run_in_the_window_is_the_engines(name, make_window, names_path, names_corpus, qtbot):
    """Batch 4 on a Futhark backend: the window's run is that backend's engine run,
    bit for bit, and NumPy's to 1e-4, with its held-out curve."""
    window = make_window(names_path)
    assert window.config_panel.select_backend(name)
    widget(window, QSpinBox, "batchSpin").setValue(4)
    train_to_end(qtbot, window, 60)
    _, y = curve(window)
    train = engine.TrainConfig(num_steps=60, batch_size=4)
    expected = engine.open_backend(name, engine.PRESETS["tiny"].model, train, names_corpus).train(60)
    same_kernel_run(name, y.astype(np.float32), expected)
    numpy_losses = engine.open_backend("numpy", engine.PRESETS["tiny"].model, train, names_corpus).train(60)
    np.testing.assert_allclose(expected, numpy_losses, rtol=0, atol=1e-4)
    assert window.session.worker.backend.batch_size == 4
    qtbot.waitUntil(lambda: bool(window.loss_plot.heldout), timeout=TIMEOUT_MS)


def test_a_failed_train_call_is_reported_and_reset_trains_again(make_window, names_path, qtbot, monkeypatch):
    """The third train call fails inside Futhark: the weights it consumed are gone,
    which the window says, and sampling then says why it cannot; Reset starts over."""
    calls = []
    real_call = FutharkBackend._call

    def failing_third_train(self, entry, *args):
        if entry in ("train", "train_batch"):
            calls.append(entry)
            if len(calls) == 3:
                raise engine.BackendError("Futhark (c) train failed: out of memory")
        return real_call(self, entry, *args)

    monkeypatch.setattr(FutharkBackend, "_call", failing_third_train)
    window = make_window(names_path)
    shown = []
    window.message_hook = lambda parent, kind, title, text, details: shown.append((kind, text))
    assert window.config_panel.select_backend("futhark-c")
    widget(window, QSpinBox, "stepsSpin").setValue(STEPS)
    click(qtbot, window, "trainButton")
    qtbot.waitUntil(lambda: any("out of memory" in text for _, text in shown), timeout=TIMEOUT_MS)
    wait_state(qtbot, window, "done")
    kind, text = next((k, t) for k, t in shown if "out of memory" in t)
    assert kind == "error" and "used them up (load a checkpoint or reset to go on)" in text
    steps_done = window.loss_plot.series.n
    assert 0 < steps_done < STEPS  # the two good calls' losses stay on the curve

    click(qtbot, window, "sampleButton")
    qtbot.waitUntil(lambda: any("has no weights" in text for _, text in shown), timeout=TIMEOUT_MS)

    click(qtbot, window, "resetButton")
    wait_state(qtbot, window, "none")
    set_steps(window, 40)
    train_to_end(qtbot, window, 40)
    assert window.loss_plot.series.n == 40
