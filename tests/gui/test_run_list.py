"""The run list and overlay: one curve per ticked run, the loss plot's smoothing,
step or wall-clock x axis."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from PySide6.QtCore import Qt

import engine
from engine.training.records import RunRecord
from gui.loss_plot import LossPlot
from gui.loss_series import ema
from gui.run_list import RunListPanel, COLUMNS


def record(name, preset, lr, steps, seconds_per_step, seed):
    p = engine.PRESETS[preset]
    r = RunRecord(name, "numpy", p.model, engine.TrainConfig(learning_rate=lr))
    losses = 3.3 - np.linspace(0, 1, steps) + np.random.default_rng(seed).normal(0, 0.3, steps)
    for first in range(0, steps, 50):
        chunk = losses[first:first + 50]
        r.extend(chunk, first, seconds_per_step * len(chunk))
    r.status = "finished"
    return r


@pytest.fixture
def panel(qtbot):
    panel = RunListPanel()
    qtbot.addWidget(panel)
    panel.resize(800, 600)
    panel.show()
    return panel


def test_the_overlay_shows_one_curve_per_ticked_run(qtbot, panel):
    runs = [record("run 1", "tiny", 0.01, 300, 0.001, 1), record("run 2", "s32", 0.005, 500, 0.002, 2),
            record("run 3", "tiny", 0.003, 200, 0.0005, 3)]
    for r in runs:
        panel.add_run(r, checked=False)
    assert panel.table.rowCount() == 3 and not panel.curves
    assert [panel.table.item(1, c).text() for c in range(len(COLUMNS))] == [
        "run 2", "finished", "s32", "numpy", "0.005", "1", "500", f"{ema(runs[1].losses, 0.95)[0][-1]:.4f}", "-",
        "-", "2", "500", "-"]  # batch 1, no held-out points, 1 name per 2 ms

    with qtbot.waitSignal(panel.checkedChanged):
        panel.table.item(0, 0).setCheckState(Qt.Checked)  # as a click on the box does
    panel.set_checked(runs[2], True)
    assert panel.checked_runs() == [runs[0], runs[2]]
    assert set(panel.curves) == {id(runs[0]), id(runs[2])}
    legend = [label.text for _, label in panel.legend.items]
    assert legend == ["run 1: lr 0.01", "run 3: lr 0.003"]  # what differs between the ticked runs
    colors = {panel.curves[id(r)].opts["pen"].color().getRgb()[:3] for r in (runs[0], runs[2])}
    assert len(colors) == 2  # distinct
    for r in (runs[0], runs[2]):
        x, y = panel.curves[id(r)].getOriginalDataset()
        np.testing.assert_array_equal(x, np.arange(1, r.steps + 1))
        np.testing.assert_allclose(y, ema(r.losses, 0.95)[0])

    panel.set_x_axis("seconds")
    x, y = panel.curves[id(runs[2])].getOriginalDataset()
    np.testing.assert_allclose(x, 0.0005 * np.arange(1, 201))
    panel.set_smoothing(0.5)
    np.testing.assert_allclose(panel.curves[id(runs[0])].getOriginalDataset()[1], ema(runs[0].losses, 0.5)[0])

    panel.set_checked(runs[0], False)
    assert set(panel.curves) == {id(runs[2])} and len(panel.legend.items) == 1


def test_a_live_run_grows_its_curve_and_row(qtbot, panel):
    p = engine.PRESETS["tiny"]
    live = RunRecord("run 1", "numpy", p.model, p.train)
    panel.add_run(live)
    live.extend(np.full(10, 3.0), 0, 0.01)
    panel.update_run(live)
    live.extend(np.full(5, 2.0), 10, 0.01)
    panel.update_run(live)  # coalesced with the one before
    qtbot.waitUntil(lambda: panel.table.item(0, COLUMNS.index("Steps")).text() == "15", timeout=2000)
    y = panel.curves[id(live)].getOriginalDataset()[1]
    np.testing.assert_allclose(y, ema(live.losses, 0.95)[0])


def test_an_unticked_live_runs_row_shows_the_full_smoothings_last_value(qtbot, panel):
    p = engine.PRESETS["tiny"]
    live = RunRecord("run 1", "numpy", p.model, p.train)
    panel.add_run(live, checked=False)
    cell = panel.table.item(0, COLUMNS.index("Smoothed loss"))
    assert cell.text() == "-"
    losses = 3.3 - np.linspace(0, 1, 120_000) + np.random.default_rng(4).normal(0, 0.3, 120_000)
    for first, weight in [(0, 0.999), (40_000, 0.999), (80_000, 0.95)]:  # longer than 0.999 feels
        panel.set_smoothing(weight)
        live.extend(losses[first:first + 40_000], first, 40.0)
        panel.update_run(live)
        expected = f"{ema(live.losses, weight)[0][-1]:.4f}"
        qtbot.waitUntil(lambda: panel.table.item(0, COLUMNS.index("Steps")).text() == f"{first + 40_000:,}",
                        timeout=2000)
        assert cell.text() == expected
    assert not panel.curves  # unticked: no curve


def test_runs_without_timings_stay_off_the_time_axis(qtbot, panel):
    p = engine.PRESETS["tiny"]
    loaded = RunRecord("checkpoint", "numpy", p.model, p.train, status="loaded")
    loaded.extend(np.full(100, 2.5), 0)  # a checkpoint's history has no step times
    panel.add_run(loaded)
    assert panel.table.item(0, COLUMNS.index("ms/step")).text() == "-"
    panel.set_x_axis("seconds")
    x, _ = panel.curves[id(loaded)].getOriginalDataset()
    assert x is None or len(x) == 0
    assert "No step times for checkpoint" in panel.info.text()


def test_the_overlay_offers_the_loss_plots_x_axes_in_its_words(qtbot, panel):
    plot = LossPlot()
    qtbot.addWidget(plot)
    offered = [[(c.itemData(i), c.itemText(i)) for i in range(c.count())] for c in (panel.x_axis_combo,
                                                                                 plot.x_axis_combo)]
    assert offered[0] == offered[1] == [("step", "step"), ("names", "names seen"), ("seconds", "training time")]
    for axis, label, units in [("seconds", "training time", "s"), ("names", "names seen", ""), ("step", "step", "")]:
        panel.set_x_axis(axis)
        bottom = panel.plot.getPlotItem().getAxis("bottom")
        assert (bottom.labelText, bottom.labelUnits) == (label, units)  # no epoch: runs' datasets may differ


def test_a_compacted_run_follows_a_new_smoothing_at_the_blocks_weight(qtbot, panel):
    live, ended = record("run 1", "tiny", 0.01, 300, 0.001, 1), record("run 2", "tiny", 0.01, 5000, 0.001, 2)
    for r in (live, ended):
        panel.add_run(r)
    ended.compact(max_points=1000)  # what run_ended does at MAX_POINTS, with a small budget
    panel.run_ended(ended)  # its series rebuilt from the block means
    block = ended.block
    assert block == 5 and len(ended.losses) == 1000
    panel.set_smoothing(0.8)
    x, y = panel.curves[id(ended)].getOriginalDataset()
    np.testing.assert_array_equal(x, 1 + block * np.arange(1000))  # each block's first step, from 1
    np.testing.assert_allclose(y, ema(ended.losses, 0.8 ** block)[0])  # the EMA over the steps, per block
    np.testing.assert_allclose(panel.curves[id(live)].getOriginalDataset()[1], ema(live.losses, 0.8)[0])
    assert panel.table.item(1, COLUMNS.index("Smoothed loss")).text() == f"{ema(ended.losses, 0.8 ** block)[0][-1]:.4f}"


def test_legend_labels_say_what_differs_between_the_ticked_runs(qtbot, panel):
    """Issue 27: the legend entries of different runs read the same."""
    p = engine.PRESETS["tiny"]
    base = RunRecord("run 1", "numpy", p.model, p.train)
    longer = RunRecord("run 2", "numpy", p.model, replace(p.train, num_steps=3000, seed=7))
    wider = RunRecord("run 3", "numpy", replace(p.model, n_embd=32), p.train)  # custom
    twin = RunRecord("run 4", "numpy", p.model, p.train)
    for r in (base, longer, wider, twin):
        r.extend(np.linspace(3, 2, 20), 0, 0.02)
        panel.add_run(r, checked=False)

    def legend():
        return [label.text for _, label in panel.legend.items]

    panel.set_checked(base, True)
    assert legend() == ["run 1: tiny, numpy, lr 0.01"]  # alone: its summary
    panel.set_checked(longer, True)
    assert legend() == ["run 1: 1,000 steps, seed 42", "run 2: 3,000 steps, seed 7"]
    panel.set_checked(wider, True)  # another network: the preset says it, not its fields
    assert legend() == ["run 1: tiny, 1,000 steps, seed 42", "run 2: tiny, 3,000 steps, seed 7",
                        "run 3: custom, 1,000 steps, seed 42"]
    panel.set_checked(longer, False)
    panel.set_checked(wider, False)
    panel.set_checked(twin, True)  # the same settings: the names tell them apart
    assert legend() == ["run 1: tiny, numpy, lr 0.01", "run 4: tiny, numpy, lr 0.01"]


def test_the_table_fits_the_runs_pane_of_the_default_window(make_window, names_path, qtbot):
    """Issue 27: the table was wider than its pane (Dataset cut, Status only by scrolling)."""
    from test_window import train_to_end

    window = make_window(names_path)
    window.resize(1200, 760)  # the window's first size
    train_to_end(qtbot, window, 20)
    window.tabs.setCurrentWidget(window.run_list)
    table = window.run_list.table
    qtbot.waitUntil(lambda: table.item(0, COLUMNS.index("Steps")).text() == "20", timeout=5000)
    header = table.horizontalHeader()
    assert header.length() <= table.viewport().width() and table.horizontalScrollBar().maximum() == 0
    status = COLUMNS.index("Status")
    assert header.sectionViewportPosition(status) + header.sectionSize(status) <= table.viewport().width()
    assert table.item(0, status).text() == "finished"
    dataset = table.item(0, COLUMNS.index("Dataset"))
    assert dataset.toolTip() == "names.txt" and header.sectionSize(COLUMNS.index("Dataset")) >= (
        table.fontMetrics().horizontalAdvance("names.txt"))


def test_a_new_smoothing_sets_only_the_cells_it_changes_and_waits_for_a_hidden_tab(qtbot):
    """Issue 27: the smoothing slider stalled the window (150-196 ms) once many runs were
    listed: every cell of every row was set again, and each change made the table
    measure its columns over every row."""
    panel = RunListPanel()
    qtbot.addWidget(panel)
    panel.resize(800, 600)
    runs = [record(f"run {i + 1}", "tiny", 0.01, 200, 0.001, i) for i in range(30)]
    for r in runs:
        panel.add_run(r)
    changed = []
    panel.table.model().dataChanged.connect(lambda top, bottom, roles: changed.append((top.row(), top.column())))
    smoothed = COLUMNS.index("Smoothed loss")
    panel.set_smoothing(0.5)  # hidden: nothing drawn yet
    assert changed == []
    panel.show()
    qtbot.waitUntil(lambda: len(changed) == len(runs), timeout=2000)
    assert sorted(changed) == [(row, smoothed) for row in range(len(runs))]
    assert [panel.table.item(row, smoothed).text() for row in range(len(runs))] == [
        f"{ema(r.losses, 0.5)[0][-1]:.4f}" for r in runs]
    changed.clear()
    panel.set_smoothing(0.5)  # the same weight: nothing changes
    qtbot.wait(50)
    assert changed == []
