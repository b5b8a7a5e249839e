"""The loss plot's display logic: growing buffers, TensorBoard's smoothing,
the uniform-guess line and the log-y toggle."""
import math

import numpy as np
import pytest

from gui.loss_plot import GrowingSeries, LossPlot, ema


def tensorboard_smoothing(values, weight):
    """TensorBoard's debiased EMA, written as its plain loop."""
    out, last = [], 0.0
    for i, value in enumerate(np.asarray(values, dtype=np.float64)):
        last = last * weight + (1 - weight) * value
        out.append(last / (1 - weight ** (i + 1)) if weight > 0 else last)
    return np.array(out)


@pytest.mark.parametrize("weight", [0.0, 0.6, 0.95, 0.999])
def test_ema_matches_the_plain_loop(weight):
    values = np.random.default_rng(1).normal(3.0, 0.5, 2000)
    np.testing.assert_allclose(ema(values, weight)[0], tensorboard_smoothing(values, weight), rtol=1e-12, atol=1e-12)


def test_series_grows_in_chunks_and_rewinds():
    values = np.random.default_rng(2).random(5000).astype(np.float32)
    series, first = GrowingSeries(), 0
    for size in np.random.default_rng(3).integers(1, 300, 100):
        chunk = values[first:first + size]
        series.extend(chunk, first, 0.9)
        first += len(chunk)
        if first >= len(values):
            break
    np.testing.assert_array_equal(series.y[: series.n], values[: series.n].astype(np.float64))
    np.testing.assert_allclose(series.smooth[: series.n], tensorboard_smoothing(values[: series.n], 0.9), rtol=1e-9)
    assert len(series.y) < 4 * series.n  # grown by doubling, not per chunk
    series.extend(values[:10], 0, 0.9)  # a run that restarts from step 0 replaces the data
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
    np.testing.assert_array_equal(x, np.arange(400))
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
