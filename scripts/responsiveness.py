"""Measure how the window keeps up while it trains (issue targets in brackets):

  plot updates per second during training            [>= 10]
  longest event-loop stall: a 10 ms QTimer's lateness [<= 100 ms up to s128]
  Stop latency: click to the run having ended         [<= 500 ms at s128]
  with --tab "Next character": keystroke to bars drawn [<= 100 ms at s128]

    python scripts/responsiveness.py [--presets tiny s128] [--seconds 5] [--backend numpy]
                                     [--tab "Next character"]

With --tab, that tab is on screen while training is measured (a model tab makes
the worker send parameter snapshots); on the Next character tab a typist types
a prefix throughout, one key 50 to 150 ms after the previous key's bars.

Runs the real window offscreen (set QT_QPA_PLATFORM=xcb with a DISPLAY to use X).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dev_data import DEFAULT_DATA  # noqa: E402  (beside this script)
TICK_MS = 10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument("--presets", nargs="+", default=["tiny", "s128"])
    parser.add_argument("--backend", default="numpy")
    parser.add_argument("--seconds", type=float, default=5.0, help="training time measured per preset")
    parser.add_argument("--switch-interval", type=float, help="override sys.setswitchinterval (seconds)")
    parser.add_argument("--holdout", type=int, default=None,
                        help="names held out (default: the window's auto; 0: no held-out evaluation)")
    parser.add_argument("--stops", type=int, default=3, help="Stop latency trials per preset")
    parser.add_argument("--tab", default="Training", help="the tab shown while measuring")
    args = parser.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["MICROGPT_GUI_SETTINGS"] = os.path.join(tempfile.mkdtemp(), "settings.ini")

    from PySide6.QtCore import QElapsedTimer, QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from gui.main_window import MainWindow

    app = QApplication([sys.argv[0]])
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    window = MainWindow(data_path=args.data)
    window.message_hook = None
    window.ask_before_discarding = False  # Reset and a new run between trials: no save question to wait on
    window.resize(1180, 720)
    window.show()
    while window.reading_dataset:  # read off the GUI thread
        app.processEvents(QEventLoop.AllEvents, 5)
        time.sleep(0.001)
    if window.corpus is None or not window.config_panel.select_backend(args.backend):
        print("cannot start: " + (window.messages[-1][2] if window.messages else f"no backend {args.backend}"))
        return 1

    def wait_for(predicate, timeout_s=120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError("the window did not reach the expected state")
            app.processEvents(QEventLoop.AllEvents, 5)
            time.sleep(0.001)

    def run_for(seconds: float) -> None:
        loop = QEventLoop()
        QTimer.singleShot(int(seconds * 1000), loop.quit)
        loop.exec()

    def start(preset: str) -> None:
        wait_for(lambda: window.state in ("none", "done"))  # a run ended just before has finished
        window.config_panel.preset_combo.setCurrentText(preset)
        window.config_panel.steps_spin.setValue(10_000_000)
        if args.holdout is not None:
            window.config_panel.holdout_spin.setValue(args.holdout)
        window.start_run()
        wait_for(lambda: window.state == "running" and window.loss_plot.series.n > 0)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"backend {args.backend}, Qt platform {app.platformName()}, {os.cpu_count()} CPUs, load average {load:.1f}")
    print(f"{'preset':8} {'steps/s':>8} {'k/chunk':>8} {'plot updates/s':>15} {'max stall ms':>13} "
          f"{'p99 stall ms':>13} {'Stop ms (max of n)':>19}")
    def measure_stalls() -> list[float]:
        """Lateness of a 10 ms timer over args.seconds of running the event loop."""
        lateness: list[float] = []
        clock = QElapsedTimer()
        ticker = QTimer(interval=TICK_MS)
        ticker.timeout.connect(lambda: (lateness.append(clock.nsecsElapsed() / 1e6 - TICK_MS), clock.restart()))
        clock.start()
        ticker.start()
        run_for(args.seconds)
        ticker.stop()
        return sorted(lateness)

    tabs = window.tabs
    titles = [tabs.tabText(i).replace("&", "") for i in range(tabs.count())]
    if args.tab not in titles:
        print(f"no tab {args.tab!r}; the tabs are {titles}")
        return 2
    tabs.setCurrentIndex(titles.index(args.tab))
    from typist import Typist, latency_summary

    typist = Typist(window.next_char_panel, max_prefix=10) if args.tab == "Next character" else None

    def p99(values: list[float]) -> float:
        return values[int(0.99 * (len(values) - 1))] if values else float("nan")

    idle = measure_stalls()  # the machine's own noise, with nothing training
    print(f"{'(idle)':8} {'-':>8} {'-':>8} {'-':>15} {max(idle):13.1f} {p99(idle):13.1f} {'-':>19}", flush=True)
    for preset in args.presets:
        start(preset)
        redraws0, steps0, t0 = window.loss_plot.redraws, window.loss_plot.series.n, time.perf_counter()
        if typist is not None:
            typist.start()
        lateness = measure_stalls()
        if typist is not None:
            typist.stop()
        elapsed = time.perf_counter() - t0
        updates = (window.loss_plot.redraws - redraws0) / elapsed
        rate = (window.loss_plot.series.n - steps0) / elapsed
        k = window.session.worker.steps_per_chunk
        stops = []
        for trial in range(args.stops):
            if trial:
                start(preset)
                run_for(0.5)
            t_stop = time.perf_counter()
            window.stop()
            wait_for(lambda: window.state == "done")
            stops.append(1000 * (time.perf_counter() - t_stop))
        print(f"{preset:8} {rate:8.0f} {k:8d} {updates:15.1f} {max(lateness):13.1f} {p99(lateness):13.1f} "
              f"{max(stops):12.0f} (n={len(stops)})", flush=True)
        if typist is not None and typist.latencies_ms:
            keys, median, p90, most = latency_summary(typist.latencies_ms)
            print(f"{'':8} keystroke to bars: {keys} keys, median {median:.0f} ms, "
                  f"p90 {p90:.0f} ms, max {most:.0f} ms", flush=True)
        window.reset()
        wait_for(lambda: window.state == "none")
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
