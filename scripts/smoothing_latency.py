"""How long the GUI thread stalls when the Smoothing slider moves, at a given
run length (the loss plot alone, offscreen).

    python scripts/smoothing_latency.py [--steps 1000000] [--moves 20]

Fills a LossPlot with --steps losses, then moves the slider --moves times,
each time waiting until the curve shows the new weight. Prints the GUI
thread's time inside the slider's handler (per move), and the longest gap
between ticks of a 5 ms heartbeat timer over the whole drag: the stall a
user would feel, whatever part of the code it comes from.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--moves", type=int, default=20)
    args = parser.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    import numpy as np
    from PySide6.QtCore import QElapsedTimer, QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from gui.loss_plot import LossPlot

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
    gaps, clock = [], QElapsedTimer()
    clock.start()
    heartbeat = QTimer(interval=5)

    def beat() -> None:
        gaps.append(clock.restart())

    heartbeat.timeout.connect(beat)
    heartbeat.start()
    handler_ms, shown_ms = [], []
    for i in range(args.moves):
        value = 900 + (37 * i) % 99
        started = time.perf_counter()
        plot.smoothing_slider.setValue(value)
        handler_ms.append(1e3 * (time.perf_counter() - started))
        weight = value / 1000
        deadline = time.monotonic() + 30
        # shown: the curve's last point is the EMA at the new weight
        expect = None
        while time.monotonic() < deadline:
            app.processEvents()
            y = plot.smooth_curve.getOriginalDataset()[1]
            if expect is None:
                from gui.loss_plot import ema
                expect = ema(losses[-5000:].astype(np.float64), weight, 0.0)[0][-1]  # converged: no memory of 5000 steps back
            if y is not None and len(y) == args.steps and abs(y[-1] - expect) < 1e-6:
                break
            time.sleep(0.001)
        shown_ms.append(1e3 * (time.perf_counter() - started))
        settle(30)
    heartbeat.stop()
    print(f"{args.steps:,} steps, {args.moves} slider moves; load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"GUI thread in the slider handler: median {statistics.median(handler_ms):.1f} ms, max {max(handler_ms):.1f} ms")
    print(f"until the curve shows the new weight: median {statistics.median(shown_ms):.1f} ms, "
          f"max {max(shown_ms):.1f} ms")
    print(f"longest GUI-thread stall (5 ms heartbeat gap): {max(gaps[1:]):.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
