"""The loss plot's display logic: growing buffers, TensorBoard's smoothing
(against its plain loop, and applied off the GUI thread for long runs), the
uniform-guess line and the log-y toggle."""
import math
import threading

import numpy as np
import pytest

from gui import loss_series
from gui.loss_plot import LossPlot
from gui.loss_series import GrowingSeries, ema, ema_last


def tensorboard_smoothing(values, weight):
    """TensorBoard's debiased EMA, written as its plain loop."""
    out, last = [], 0.0
    for i, value in enumerate(np.asarray(values, dtype=np.float64)):
        last = last * weight + (1 - weight) * value
        out.append(last / (1 - weight ** (i + 1)) if weight > 0 else last)
    return np.array(out)


@pytest.mark.parametrize("weight", [0.0, 0.6, 0.95, 0.999])
@pytest.mark.parametrize("n", [1, 63, 64, 65, 2000, 300_007])  # one block, its edges, three levels of blocks
def test_ema_matches_the_plain_loop(weight, n):
    values = np.random.default_rng(1).normal(3.0, 0.5, n)
    np.testing.assert_allclose(ema(values, weight)[0], tensorboard_smoothing(values, weight), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("weight", [0.5, 0.999])
def test_ema_continues_a_series_from_its_carry(weight):
    values = np.random.default_rng(5).normal(3.0, 0.5, 5000)
    head, carry = ema(values[:1234], weight)
    tail, _ = ema(values[1234:], weight, carry, 1234)
    np.testing.assert_allclose(np.concatenate([head, tail]), tensorboard_smoothing(values, weight), rtol=1e-12)


@pytest.mark.parametrize("weight", [0.0, 0.6, 0.95, 0.999])
@pytest.mark.parametrize("n", [1, 700, 300_007])  # shorter and longer than the values felt at each weight
def test_ema_last_is_the_full_emas_last_value(weight, n):
    values = np.random.default_rng(7).normal(3.0, 0.5, n).astype(np.float32)  # as a run's losses
    full = ema(values, weight)[0][-1]
    last = ema_last(values, weight)
    if weight == 0 or n <= loss_series.faded_after(weight):
        assert last == full  # every value is felt: the same computation
    np.testing.assert_allclose(last, full, rtol=1e-13)
    assert f"{last:.4f}" == f"{full:.4f}"  # the Runs table's text


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_ema_last_keeps_an_inf_or_nan_as_the_full_ema_does(bad):
    values = np.random.default_rng(8).normal(3.0, 0.5, 5000)
    values[10] = bad  # long faded at weight 0.6, yet never forgotten by the full EMA
    with np.errstate(invalid="ignore"):  # the block sums' inf x 0
        np.testing.assert_equal(ema_last(values, 0.6), ema(values, 0.6)[0][-1])
        assert not np.isfinite(ema_last(values, 0.6))
    assert ema_last(values[:0], 0.6) is None  # no steps: nothing to show


def test_series_grows_in_chunks_and_rewinds():
    values = np.random.default_rng(2).random(5000).astype(np.float32)
    series, first = GrowingSeries(0.9), 0
    for size in np.random.default_rng(3).integers(1, 300, 100):
        chunk = values[first:first + size]
        series.extend(chunk, first)
        first += len(chunk)
        if first >= len(values):
            break
    np.testing.assert_array_equal(series.y[: series.n], values[: series.n].astype(np.float64))
    np.testing.assert_allclose(series.smooth[: series.n], tensorboard_smoothing(values[: series.n], 0.9), rtol=1e-9)
    assert len(series.y) < 4 * series.n  # grown by doubling, not per chunk
    np.testing.assert_array_equal(series.steps, np.arange(1, series.n + 1))  # steps count from 1
    series.extend(values[100:110], 40)  # a run rewound to step 40 (a checkpoint) keeps what came before
    kept = np.concatenate([values[:40], values[100:110]])
    np.testing.assert_allclose(series.smoothed, tensorboard_smoothing(kept, 0.9), rtol=1e-9)
    series.extend(values[:10], 0)  # a run that restarts from step 0 replaces the data
    assert series.n == 10
    np.testing.assert_allclose(series.smooth[:10], tensorboard_smoothing(values[:10], 0.9), rtol=1e-9)


def test_plot_curves_smoothing_slider_and_log_toggle(qtbot):
    plot = LossPlot()
    qtbot.addWidget(plot)
    losses = np.linspace(3.3, 2.0, 400) + np.random.default_rng(4).normal(0, 0.2, 400)
    plot.append(losses[:150], 0)
    plot.append(losses[150:], 150)
    plot.flush()
    plot.redraw()
    x, y = plot.raw_curve.getOriginalDataset()
    np.testing.assert_array_equal(x, np.arange(1, 401))
    np.testing.assert_array_equal(y, losses)
    plot.smoothing_slider.setValue(0)  # no smoothing: the smoothed curve is the raw one
    plot.redraw()
    np.testing.assert_allclose(plot.smooth_curve.getOriginalDataset()[1], losses)
    plot.smoothing_slider.setValue(990)
    plot.redraw()
    np.testing.assert_allclose(plot.smooth_curve.getOriginalDataset()[1], tensorboard_smoothing(losses, 0.99))
    plot.set_vocab_size(27)
    assert plot.uniform_line.value() == pytest.approx(math.log(27))
    plot.log_y.setChecked(True)
    assert plot.plot.getPlotItem().ctrl.logYCheck.isChecked()
    assert plot.uniform_line.value() == pytest.approx(math.log10(math.log(27)))


def long_plot(qtbot, n, weight_slider=950):
    plot = LossPlot()
    qtbot.addWidget(plot)
    plot.smoothing_slider.setValue(weight_slider)
    losses = np.linspace(3.3, 2.0, n) + np.random.default_rng(6).normal(0, 0.2, n)
    plot.append(losses, 0)
    plot.flush()
    return plot, losses


def shows_weight(plot, weight, losses):
    y = plot.smooth_curve.getOriginalDataset()[1]
    return plot.series.weight == weight and y is not None and len(y) == len(losses)


def test_a_long_run_is_smoothed_again_off_the_gui_thread(qtbot, monkeypatch):
    """Past SYNC_STEPS the slider's handler only asks: the EMA runs in another thread,
    the curve keeps its old weight until the result comes, and then shows the new one."""
    n = loss_series.SYNC_STEPS + 20_000
    plot, losses = long_plot(qtbot, n)
    threads = []
    real_ema = loss_series.ema

    def spy(values, *args):
        threads.append((len(values), threading.current_thread()))
        return real_ema(values, *args)

    monkeypatch.setattr(loss_series, "ema", spy)
    plot.smoothing_slider.setValue(990)
    assert plot.series.weight == 0.95 and not any(size == n for size, _ in threads if _ is threading.main_thread())
    qtbot.waitUntil(lambda: shows_weight(plot, 0.99, losses), timeout=10_000)
    assert [t for size, t in threads if size == n] and all(
        t is not threading.main_thread() for size, t in threads if size == n)
    np.testing.assert_allclose(plot.smooth_curve.getOriginalDataset()[1], tensorboard_smoothing(losses, 0.99),
                               rtol=1e-10)


def test_steps_arriving_during_a_background_smoothing_are_smoothed_at_the_new_weight(qtbot):
    n = loss_series.SYNC_STEPS + 20_000
    plot, losses = long_plot(qtbot, n)
    for value in (700, 800, 900, 300):  # a drag: only the last weight counts
        plot.smoothing_slider.setValue(value)
    more = np.random.default_rng(7).normal(2.0, 0.2, 777)
    plot.append(more, n)  # a chunk arrives before the result
    everything = np.concatenate([losses, more])
    qtbot.waitUntil(lambda: shows_weight(plot, 0.3, everything), timeout=10_000)
    np.testing.assert_allclose(plot.smooth_curve.getOriginalDataset()[1], tensorboard_smoothing(everything, 0.3),
                               rtol=1e-10)
    steps, values, smoothed = plot.data()
    np.testing.assert_array_equal(steps, np.arange(1, len(everything) + 1))
    np.testing.assert_allclose(smoothed, tensorboard_smoothing(everything, 0.3), rtol=1e-10)


def test_a_rewind_during_a_background_smoothing_is_smoothed_again(qtbot):
    n = loss_series.SYNC_STEPS + 20_000
    plot, losses = long_plot(qtbot, n)
    plot.smoothing_slider.setValue(600)
    rewound = np.concatenate([losses[:1000], np.full(loss_series.SYNC_STEPS, 2.5)])
    plot.append(rewound[1000:], 1000)  # resumed from a checkpoint at step 1,000
    qtbot.waitUntil(lambda: shows_weight(plot, 0.6, rewound), timeout=10_000)
    np.testing.assert_allclose(plot.smooth_curve.getOriginalDataset()[1], tensorboard_smoothing(rewound, 0.6),
                               rtol=1e-10)


def test_an_export_during_a_background_smoothing_has_the_sliders_weight(qtbot):
    n = loss_series.SYNC_STEPS + 20_000
    plot, losses = long_plot(qtbot, n)
    plot.smoothing_slider.setValue(500)
    _, _, smoothed = plot.data()
    np.testing.assert_allclose(smoothed, tensorboard_smoothing(losses, 0.5), rtol=1e-10)
