"""The event-loop stall each GUI action causes while a run trains: issue 27
found 254 ms on the log-y toggle at gpt2-small, 219 ms on Stop (s64) and
150-196 ms on the smoothing and temperature sliders and Export PNG in the soak.

Trains --preset on --backend for --train-s seconds (the loss curve grows),
then does each action --repeats times, a second apart, training on, while a
10 ms QTimer probe (tests/gui/latency_probe.py) measures how late the event
loop is: as measured, and "own" (less the time the process waited for a CPU,
on a shared machine other processes' doing). Prints the longest of each
action; --stacks adds the GUI thread's stacks seen most during each stall.

    python scripts/action_stalls.py [--preset s64] [--backend numpy] [--train-s 20]
        [--actions log-y smoothing temperature export-png stop] [--repeats 5] [--stacks]
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "gui")]
from dev_data import DEFAULT_DATA  # noqa: E402  (beside this script)

ACTIONS = ("log-y", "smoothing", "temperature", "export-png", "x-axis", "stop")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="s64")
    parser.add_argument("--backend", default="numpy")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--train-s", type=float, default=20.0, help="training before the actions")
    parser.add_argument("--actions", nargs="+", choices=ACTIONS, default=list(ACTIONS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--stacks", action="store_true")
    parser.add_argument("--data", default=DEFAULT_DATA)
    args = parser.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    folder = tempfile.TemporaryDirectory(prefix="microgpt-stalls-")
    os.environ["MICROGPT_GUI_SETTINGS"] = str(Path(folder.name) / "settings.ini")

    from PySide6.QtWidgets import QApplication
    app = QApplication([sys.argv[0]])
    import latency_probe
    from gui.main_window import RESOURCES, MainWindow

    app.setStyleSheet((RESOURCES / "style.qss").read_text(encoding="utf-8"))  # as the app does

    def run_for(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents()
            time.sleep(0.002)

    def wait(predicate, timeout_s: float = 600.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError("the window did not get there")
            app.processEvents()
            time.sleep(0.002)

    window = MainWindow(data_path=args.data)
    window.message_hook = None
    window.ask_before_discarding = False
    window.resize(1200, 760)
    window.show()
    wait(lambda: window.corpus is not None)
    panel = window.config_panel
    panel.preset_combo.setCurrentText(args.preset)
    if not panel.select_backend(args.backend):
        parser.error(f"backend {args.backend} is not available")
    panel.steps_spin.setValue(args.steps)
    window.start_run()
    wait(lambda: window.state == "running")
    run_for(args.train_s)
    rng = random.Random(1)
    png = Path(folder.name) / "loss.png"

    def act(name: str) -> None:
        if name == "log-y":
            window.loss_plot.log_y.toggle()
        elif name == "smoothing":
            window.loss_plot.smoothing_slider.setValue(rng.randrange(0, 1000))
        elif name == "temperature":
            window.sample_panel.temperature_slider.setValue(rng.randrange(1, 21))
        elif name == "export-png":
            window.export_png(str(png))
        elif name == "x-axis":
            combo = window.loss_plot.x_axis_combo
            combo.setCurrentIndex((combo.currentIndex() + 1) % combo.count())
        elif name == "stop":
            if window.state == "running":
                window.stop()
            elif window.state == "done":
                window.train_or_pause()  # Resume

    print(f"{args.preset} on {args.backend}: {window.loss_plot.series.n:,} steps trained, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    worst = 0.0
    for name in args.actions:
        probe = latency_probe.LatencyProbe(stacks=args.stacks)
        probe.label = name
        probe.start()
        for _ in range(args.repeats):
            act(name)
            run_for(1.0)
        if name == "stop" and window.state == "done":
            window.train_or_pause()
            wait(lambda: window.state == "running")
        probe.stop()
        own = probe.max_own_ms
        worst = max(worst, own)
        print(f"{name:12} max stall {probe.max_ms:6.0f} ms, own {own:6.0f} ms ({len(probe.stalls)} over "
              f"{latency_probe.NOTE_MS} ms; steps now {window.loss_plot.series.n:,})", flush=True)
        if args.stacks:
            for stall in sorted(probe.stalls, key=lambda s: -s.own_ms)[:2]:
                print(f"    {stall.brief()}")
                for stack in stall.stacks[:4]:
                    print(f"      {stack}")
    window.close_without_asking()
    wait(lambda: not window.isVisible())
    print(f"the longest own stall: {worst:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
