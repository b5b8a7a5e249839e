"""Learning in the window (issue 18): the Batch and Held-out fields reach the
run, the held-out loss is evaluated by the worker and drawn as its own curve,
the x axis shows steps, names seen or training time, and the Runs table, the
overlay, the CSV and checkpoints carry the held-out loss. Checked against
independent engine runs of the same configuration."""
import csv

import numpy as np
import pytest
from PySide6.QtCore import QPointF
from PySide6.QtWidgets import QComboBox, QProgressBar, QPushButton, QSpinBox

import engine
from engine.data.split import default_holdout
from gui.plot_axes import NAMES, SECONDS, STEP, epoch_text
from gui.run_list import COLUMNS, HELDOUT

from test_window import TIMEOUT_MS, click, curve, set_steps, wait_state, widget


def choose(window, preset=None, batch=None, holdout=None, steps=None):
    panel = window.config_panel
    if preset is not None:
        panel.preset_combo.setCurrentText(preset)
    if batch is not None:
        widget(window, QSpinBox, "batchSpin").setValue(batch)
    if holdout is not None:
        widget(window, QSpinBox, "holdoutSpin").setValue(holdout)
    if steps is not None:
        set_steps(window, steps)


def run_to_end(qtbot, window):
    click(qtbot, window, "trainButton")
    wait_state(qtbot, window, "done")
    window.loss_plot.flush()


def engine_backend(corpus, preset, num_steps, batch, holdout=None):
    """The same run opened straight through the engine."""
    p = engine.PRESETS[preset]
    train = engine.TrainConfig(num_steps=num_steps, learning_rate=p.train.learning_rate, init_std=p.train.init_std,
                               seed=p.train.seed, batch_size=batch, holdout=holdout)
    return engine.open_backend("numpy", p.model, train, corpus)


def heldout_references(corpus, preset, num_steps, batch, steps):
    """backend.heldout_loss() of the engine's run after each of `steps`."""
    backend, out, done = engine_backend(corpus, preset, num_steps, batch), [], 0
    for step in steps:
        backend.train(step - done)
        done = step
        out.append(backend.heldout_loss())
    return out


def test_the_learn_preset_sets_batch_32_and_the_fields_reach_the_train_config(make_window, names_path):
    window = make_window(names_path)
    choose(window, preset="learn")
    train = window.config_panel.train_config()
    assert train.batch_size == 32 == engine.PRESETS["learn"].train.batch_size
    assert train.holdout is None and widget(window, QSpinBox, "holdoutSpin").text() == "auto"
    choose(window, batch=7, holdout=0)
    train = window.config_panel.train_config()
    assert (train.batch_size, train.holdout) == (7, 0)
    choose(window, preset="tiny")
    assert window.config_panel.train_config().batch_size == 1  # tiny is microgpt: one name per step


def test_a_window_run_at_batch_4_is_the_engines(make_window, names_path, names_corpus, qtbot):
    window = make_window(names_path)
    choose(window, preset="tiny", batch=4, steps=60)
    run_to_end(qtbot, window)
    _, y = curve(window)
    reference = engine_backend(names_corpus, "tiny", 60, 4).train(60)
    np.testing.assert_array_equal(y.astype(np.float32), reference)
    assert window.session.worker.backend.batch_size == 4
    bar = widget(window, QProgressBar, "progressBar")
    train_docs = len(names_corpus) - default_holdout(len(names_corpus))
    assert f"epoch {240 / train_docs:.2f} (240 names)" in bar.format()
    assert window.status_labels["step"].text() == f"Step 60 / 60 · epoch {240 / train_docs:.2f}"
    assert window.status_labels["step"].toolTip().startswith("240 names seen")
    view = window.loss_plot.plot.getPlotItem().vb  # the read-out says the epoch at the hovered step
    view.setRange(xRange=(0, 59), yRange=(1, 4), padding=0)
    window.loss_plot.plot.scene().sigMouseMoved.emit(view.mapViewToScene(QPointF(30.2, 2.0)))
    assert window.loss_plot.readout.text().startswith(f"step 30: loss {y[29]:.4f}, smoothed ")
    assert f", epoch {120 / train_docs:.2f}" in window.loss_plot.readout.text()


def test_the_epoch_is_said_once_it_says_more_than_the_step():
    # batches of one in the first epoch: the step already says it, unless asked always
    assert epoch_text(300, 1, 1000) == ""
    assert epoch_text(300, 1, 1000, always=True) == "epoch 0.30"
    assert epoch_text(1500, 1, 1000) == "epoch 1.50"  # past the first epoch
    assert epoch_text(300, 4, 1000) == "epoch 1.20"   # batches
    assert epoch_text(300, 4, 1000, names=True) == "epoch 1.20 (1,200 names)"
    assert epoch_text(300, 4, 0, always=True, names=True) == ""  # no training names (no run yet)


def test_the_heldout_curve_is_drawn_during_and_at_the_end_of_a_run(make_window, names_path, names_corpus, qtbot):
    window = make_window(names_path)
    choose(window, preset="tiny", batch=8, steps=3000)
    plot = window.loss_plot
    click(qtbot, window, "trainButton")
    qtbot.waitUntil(lambda: len(plot.heldout) >= 1, timeout=TIMEOUT_MS)
    during = plot.heldout[0]
    assert during.step < 3000  # evaluated while training, not only at the end
    wait_state(qtbot, window, "done")
    plot.flush()
    points = plot.heldout
    assert points[-1].step == 3000 and points[0] == during  # and once at the end
    assert [p.step for p in points] == sorted({p.step for p in points})
    x, y = plot.heldout_curve.getData()
    np.testing.assert_array_equal(x, [p.step for p in points])
    np.testing.assert_array_equal(y, [p.loss for p in points])
    assert "held-out" in [label.text for _, label in plot.legend.items]
    assert plot.heldout_curve.opts["symbol"] == "o"  # markers: one per evaluation
    expected = heldout_references(names_corpus, "tiny", 3000, 8, [p.step for p in points])
    np.testing.assert_allclose([p.loss for p in points], expected, rtol=1e-6)
    assert window.status_labels["heldout"].text() == f"Held-out {points[-1].loss:.4f}"
    assert window.session.worker.loop.holdout_schedule.evaluations == len(points)


def test_held_out_0_draws_no_heldout_curve(make_window, names_path, qtbot):
    window = make_window(names_path)
    choose(window, preset="tiny", holdout=0, steps=50)
    run_to_end(qtbot, window)
    assert window.loss_plot.heldout == [] and window.session.worker.backend.holdout == 0
    assert "held-out" not in [label.text for _, label in window.loss_plot.legend.items]
    assert window.status_labels["heldout"].text() == "Held-out -"


def test_the_x_axis_shows_steps_names_seen_or_training_time(make_window, names_path, qtbot):
    window = make_window(names_path)
    choose(window, preset="tiny", batch=4, steps=400)
    run_to_end(qtbot, window)
    plot = window.loss_plot
    steps = np.arange(1, 401)
    heldout_steps = np.array([p.step for p in plot.heldout], dtype=float)
    combo = widget(window, QComboBox, "lossXAxisCombo")
    assert [combo.itemData(i) for i in range(combo.count())] == [STEP, NAMES, SECONDS]

    plot.set_x_axis(NAMES)
    x, _ = curve(window)
    np.testing.assert_array_equal(x, steps * 4)
    np.testing.assert_array_equal(plot.heldout_curve.getData()[0], heldout_steps * 4)
    assert plot.plot.getPlotItem().getAxis("bottom").labelText.startswith("names seen (an epoch is ")

    plot.set_x_axis(SECONDS)
    x, y = curve(window)
    assert len(x) == 400 and np.all(np.diff(x) > 0)
    assert x[-1] == pytest.approx(window.session.worker.train_seconds, rel=1e-9)
    hx = plot.heldout_curve.getData()[0]
    np.testing.assert_allclose(hx, x[heldout_steps.astype(int) - 1])  # each point at its step's time

    plot.set_x_axis(STEP)
    x, _ = curve(window)
    np.testing.assert_array_equal(x, steps)


def test_the_runs_table_and_overlay_show_the_heldout_loss(make_window, names_path, qtbot):
    window = make_window(names_path)
    choose(window, preset="tiny", batch=4, steps=300)
    run_to_end(qtbot, window)
    panel = window.run_list
    window.tabs.setCurrentWidget(panel)
    record = panel.runs[0]
    points = window.loss_plot.heldout
    assert record.heldout == points
    qtbot.waitUntil(lambda: panel.table.item(0, COLUMNS.index("Final held-out")).text() != "-", timeout=TIMEOUT_MS)
    cell = lambda name: panel.table.item(0, COLUMNS.index(name)).text()  # noqa: E731
    assert cell("Batch") == "4"
    assert cell("Best held-out") == f"{min(p.loss for p in points):.4f}"
    assert cell("Final held-out") == f"{points[-1].loss:.4f}"
    assert cell("names/s") == f"{4 * 1e3 / record.ms_per_step:,.0f}"
    panel.set_y_values(HELDOUT)
    x, y = panel.curves[id(record)].getData()
    np.testing.assert_array_equal(x, [p.step for p in points])
    np.testing.assert_array_equal(y, [p.loss for p in points])
    assert panel.plot.getPlotItem().getAxis("left").labelText == "held-out loss"
    panel.set_x_axis("names")
    np.testing.assert_array_equal(panel.curves[id(record)].getData()[0], [4 * p.step for p in points])
    assert record.train.holdout == default_holdout(len(window.corpus))  # "auto", resolved
    assert "different numbers" not in panel.info.text()
    choose(window, holdout=500, steps=100)  # a second run, measured on other names
    run_to_end(qtbot, window)
    qtbot.waitUntil(lambda: len(panel.curves) == 2, timeout=TIMEOUT_MS)
    assert panel.runs[1].train.holdout == 500
    qtbot.waitUntil(lambda: "hold out different numbers of names" in panel.info.text(), timeout=TIMEOUT_MS)


def test_the_csv_has_the_heldout_column(make_window, names_path, qtbot, tmp_path):
    window = make_window(names_path)
    choose(window, preset="tiny", steps=200)
    run_to_end(qtbot, window)
    path = tmp_path / "loss.csv"
    with qtbot.waitSignal(window.exported, timeout=TIMEOUT_MS):
        window.export_csv(str(path))
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["step", "loss", "smoothed", "heldout"]
    heldout = {int(r["step"]): float(r["heldout"]) for r in rows if r["heldout"]}
    assert heldout == pytest.approx({p.step: p.loss for p in window.loss_plot.heldout}, abs=1e-6)
    assert 200 in heldout


def test_a_checkpoint_brings_its_heldout_curve_back(make_window, names_path, qtbot, tmp_path):
    window = make_window(names_path)
    choose(window, preset="tiny", batch=2, steps=8000)
    click(qtbot, window, "trainButton")
    qtbot.waitUntil(lambda: len(window.loss_plot.heldout) >= 1, timeout=TIMEOUT_MS)
    click(qtbot, window, "stopButton")
    wait_state(qtbot, window, "done")
    qtbot.waitUntil(lambda: window.loss_plot.heldout[-1].step == window.session.worker.step, timeout=TIMEOUT_MS)
    saved = list(window.loss_plot.heldout)
    path = tmp_path / "run.npz"
    window.save_checkpoint(str(path))
    qtbot.waitUntil(path.exists, timeout=TIMEOUT_MS)
    click(qtbot, window, "resetButton")
    qtbot.waitUntil(lambda: window.state == "none", timeout=TIMEOUT_MS)
    assert window.loss_plot.heldout == []

    window.load_checkpoint(str(path))
    wait_state(qtbot, window, "ready")
    qtbot.waitUntil(lambda: window.loss_plot.heldout == saved, timeout=TIMEOUT_MS)
    window.loss_plot.flush()
    np.testing.assert_array_equal(window.loss_plot.heldout_curve.getData()[1], [p.loss for p in saved])
    assert window.run_list.runs[-1].heldout == saved
    assert widget(window, QSpinBox, "batchSpin").value() == 2
    run_to_end(qtbot, window)  # resumed: the curve goes on from the checkpoint's points
    points = window.loss_plot.heldout
    assert points[: len(saved)] == saved and points[-1].step == 8000


def test_continue_keeps_the_heldout_curve(make_window, names_path, names_corpus, qtbot):
    window = make_window(names_path)
    choose(window, preset="tiny", batch=2, steps=200)
    run_to_end(qtbot, window)
    before = list(window.loss_plot.heldout)
    assert before[-1].step == 200
    set_steps(window, 400)
    assert widget(window, QPushButton, "trainButton").text() == "Continue to 400 steps"
    click(qtbot, window, "trainButton")
    qtbot.waitUntil(lambda: window.state == "done" and window.session.worker.step == 400, timeout=TIMEOUT_MS)
    points = window.loss_plot.heldout
    assert points[: len(before)] == before and points[-1].step == 400
    assert window.session.worker.backend.heldout_history == points  # the reopened backend kept them


def test_the_batch_held_out_and_x_axis_persist_between_windows(make_window, names_path):
    window = make_window(names_path)
    choose(window, preset="learn", batch=16, holdout=500)
    window.loss_plot.set_x_axis(NAMES)
    window.close()
    again = make_window(None)
    assert widget(again, QSpinBox, "batchSpin").value() == 16
    assert again.config_panel.train_config().holdout == 500
    assert again.loss_plot.x_axis == NAMES
    again.loss_plot.set_x_axis("no such axis")  # a hand-edited setting: the axis shown stays
    assert again.loss_plot.x_axis == NAMES


def test_a_long_evaluation_gives_way_to_pause(make_window, names_path, qtbot, monkeypatch):
    """An evaluation that would take 20 s (100 batches of 0.2 s) does not hold up Pause:
    it is cancelled between batches, and no point is recorded for it."""
    import time

    from engine.backends import base
    from engine.backends.numpy_backend import NumpyBackend
    from engine.training.protocol import Sample

    forward = NumpyBackend._doc_losses
    started = []

    def slow_doc_losses(self, batch):
        started.append(time.monotonic())
        time.sleep(0.2)
        return forward(self, batch)

    monkeypatch.setattr(base, "EVAL_MAX_DOCS", 10)
    monkeypatch.setattr(NumpyBackend, "_doc_losses", slow_doc_losses)
    window = make_window(names_path)
    choose(window, preset="tiny", steps=1_000_000)
    click(qtbot, window, "trainButton")
    qtbot.waitUntil(lambda: len(started) >= 2, timeout=TIMEOUT_MS)  # inside an evaluation
    asked = time.monotonic()
    click(qtbot, window, "trainButton")  # Pause
    wait_state(qtbot, window, "paused")
    qtbot.waitUntil(lambda: window.session.worker.call == "", timeout=TIMEOUT_MS)
    assert time.monotonic() - asked < 2.0  # one batch (0.2 s) and the machine's noise, not 20 s
    assert window.loss_plot.heldout == [] and window.session.worker.backend.heldout_history == []


def test_the_step_clock_sums_chunk_times_and_rewinds():
    from gui.plot_axes import StepClock

    clock = StepClock()
    clock.extend(0, 3, float("nan"))  # a checkpoint's steps: no time
    clock.extend(3, 2, 1.0)
    clock.extend(5, 4, 2.0)
    expected = [np.nan, np.nan, np.nan, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    np.testing.assert_array_equal(clock.seconds, expected)
    np.testing.assert_array_equal(clock.at_steps([0, 3, 4, 9, 10]), [np.nan, np.nan, 0.5, 3.0, np.nan])
    assert (clock.step_at(0.2), clock.step_at(1.0), clock.step_at(2.9)) == (4, 5, 9)
    clock.extend(6, 1, 4.0)  # rewound to step 6: its time follows step 6's
    np.testing.assert_array_equal(clock.seconds, expected[:6] + [5.5])
    clock.extend(7, 2, float("nan"))  # a later chunk without a time: at the last known time
    np.testing.assert_array_equal(clock.seconds, expected[:6] + [5.5, 5.5, 5.5])
    assert clock.timed == slice(3, 9)
    long = StepClock()
    for first in range(0, 5000, 100):
        long.extend(first, 100, 0.25)
    np.testing.assert_allclose(long.seconds, np.cumsum(np.full(5000, 0.0025)))


def test_a_final_evaluation_cut_short_by_a_sample_comes_again_when_idle(make_window, names_path, qtbot,
                                                                          monkeypatch):
    import time

    from engine.backends import base
    from engine.backends.numpy_backend import NumpyBackend
    from engine.training.protocol import Sample

    forward = NumpyBackend._doc_losses

    def slow_doc_losses(self, batch):
        time.sleep(0.05)
        return forward(self, batch)

    monkeypatch.setattr(base, "EVAL_MAX_DOCS", 25)  # 40 batches: an evaluation takes 2 s
    monkeypatch.setattr(NumpyBackend, "_doc_losses", slow_doc_losses)
    window = make_window(names_path)
    choose(window, preset="tiny", steps=50)
    click(qtbot, window, "trainButton")
    worker = window.session.worker
    # the worker evaluating, and the window caught up with its events (it refuses a
    # Sample while it still shows the run opening)
    qtbot.waitUntil(lambda: worker.step == 50 and worker.call == "evaluating the held-out loss"
                    and window.run.allows(Sample(3, 0.5, 0)), timeout=TIMEOUT_MS)
    with qtbot.waitSignal(window.sample_panel.samples_list.model().rowsInserted, timeout=TIMEOUT_MS):
        window.request_samples(3, 0.5, 0)  # cancels the evaluation: the names come first
    assert not window.loss_plot.heldout or window.loss_plot.heldout[-1].step < 50  # before the end's point
    wait_state(qtbot, window, "done")
    qtbot.waitUntil(lambda: bool(window.loss_plot.heldout) and window.loss_plot.heldout[-1].step == 50,
                    timeout=TIMEOUT_MS)
    assert worker.backend.heldout_history[-1].step == 50
