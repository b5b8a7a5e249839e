"""How long the GUI thread stalls when the Smoothing slider moves, at a given
run length (the loss plot alone, offscreen).

    python scripts/smoothing_latency.py [--steps 1000000] [--moves 20]

Fills a LossPlot with --steps losses, then moves the slider --moves times,
each time waiting until the curve shows the new weight. Prints the GUI
thread's time inside the slider's handler (per move), and the longest
event-loop stall over the whole drag (tests/gui/latency_probe.py, a 10 ms
timer): as measured, and less the time the process waited for a CPU (on a
shared machine, other processes' doing), and the GUI thread's CPU time in it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "gui")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--moves", type=int, default=20)
    args = parser.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    import numpy as np
    from latency_probe import LatencyProbe
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from gui.loss_plot import LossPlot
    from gui.loss_series import ema

    app = QApplication([sys.argv[0]])
    plot = LossPlot()
    plot.resize(900, 500)
    plot.show()
    rng = np.random.default_rng(0)
    losses = (np.linspace(3.3, 2.0, args.steps) + rng.normal(0, 0.2, args.steps)).astype(np.float32)
    plot.append(losses, 0)
    plot.flush()

    def settle(ms: int) -> None:
        loop = QEventLoop()
        QTimer.singleShot(ms, loop.quit)
        loop.exec()

    settle(200)
    probe = LatencyProbe()
    probe.start()
    handler_ms, shown_ms = [], []
    for i in range(args.moves):
        value = 900 + (37 * i) % 99
        started = time.perf_counter()
        plot.smoothing_slider.setValue(value)
        handler_ms.append(1e3 * (time.perf_counter() - started))
        # shown: the curve's last point is the EMA at the new weight (5,000 steps back are forgotten)
        expect = ema(losses[-5000:].astype(np.float64), value / 1000)[0][-1]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            app.processEvents()
            y = plot.smooth_curve.getOriginalDataset()[1]
            if y is not None and len(y) == args.steps and abs(y[-1] - expect) < 1e-6:
                break
            time.sleep(0.001)
        shown_ms.append(1e3 * (time.perf_counter() - started))
        settle(30)
    probe.stop()
    print(f"{args.steps:,} steps, {args.moves} slider moves; load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"GUI thread in the slider handler: median {statistics.median(handler_ms):.1f} ms, max {max(handler_ms):.1f} ms")
    print(f"until the curve shows the new weight: median {statistics.median(shown_ms):.1f} ms, "
          f"max {max(shown_ms):.1f} ms")
    cpu = max((s.gui_cpu_ms for s in probe.stalls), default=0.0)
    print(f"longest event-loop stall: {probe.max_ms:.0f} ms as measured, {probe.max_own_ms:.0f} ms less CPU waits; "
          f"most GUI-thread CPU in a stall over 50 ms: {cpu:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
