"""How long Quit (after the save question's Discard) and Stop take while a run
trains: issue 27 measured 1.4-1.8 s for Quit and 0.6-0.8 s for Stop at s256
on NumPy.

  Quit: the app as `microgpt-gui` runs it (main.main, in a child process per
        trial) trains for --train-s seconds; the window is closed and Discard
        clicked; the time is from the click to the process's exit.
  Stop: in one child process, --trials times: train for 1 to 2 s, Stop, and the
        time until the window shows the run stopped (its phase "done").

    python scripts/quit_stop_latency.py [--preset s256] [--backend numpy] [--trials 5]
        [--root CHECKOUT]  (measure another checkout's code, e.g. the commit before a fix)

Offscreen by default (QT_QPA_PLATFORM=xcb under xvfb-run for an X server).
Each child has its own settings file. Timings swing on a shared machine: compare
two checkouts side by side, in one sitting.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

QUIT_CHILD = r"""
import os, sys, time
root, preset, backend, train_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
sys.path[:0] = [root]
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMessageBox
app = QApplication([sys.argv[0]])
import main
from gui.main_window import MainWindow

def quit_when_trained():
    window = next(w for w in app.topLevelWidgets() if isinstance(w, MainWindow))
    if window.state != "running" or window.loss_plot.series.n == 0:
        QTimer.singleShot(50, quit_when_trained)
        return
    def discard():
        box = window.findChild(QMessageBox, "saveQuestion")
        if box is None or not box.isVisible():
            QTimer.singleShot(5, discard)
            return
        print(f"DISCARD {time.time():.6f} {window.session.worker.call!r}", flush=True)
        box.button(QMessageBox.Discard).click()
    QTimer.singleShot(int(1000 * train_s), lambda: (window.close(), discard()))

QTimer.singleShot(0, quit_when_trained)
sys.exit(main.main(["--preset", preset, "--backend", backend, "--autorun-steps", "1000000"]))
"""

STOP_CHILD = r"""
import json, os, random, sys, time
root, preset, backend, trials = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path[:0] = [root]
from PySide6.QtWidgets import QApplication
app = QApplication([sys.argv[0]])
import gui  # noqa: F401  (the PySide6 reference-count guard)
from gui.main_window import MainWindow

def wait(predicate, timeout_s=600.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the window did not get there")
        app.processEvents()
        time.sleep(0.001)

def run_for(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.002)

window = MainWindow()
window.message_hook = None
window.ask_before_discarding = False
window.show()
wait(lambda: window.corpus is not None)
window.config_panel.preset_combo.setCurrentText(preset)
assert window.config_panel.select_backend(backend), backend
window.config_panel.steps_spin.setValue(1_000_000)
rng = random.Random(1)
for trial in range(trials):
    window.start_run() if trial == 0 else window.train_or_pause()  # Train, then Resume
    wait(lambda: window.state == "running" and window.loss_plot.series.n > 0)
    run_for(1.0 + rng.random())
    call = window.session.worker.call
    started = time.monotonic()
    window.stop()
    wait(lambda: window.state == "done")
    print(json.dumps({"stop_ms": 1000 * (time.monotonic() - started), "call": call}), flush=True)
window.close_without_asking()
wait(lambda: not window.isVisible())
"""


def child_env(folder: str) -> dict:
    env = dict(os.environ, MICROGPT_GUI_SETTINGS=str(Path(folder) / "settings.ini"))
    env.setdefault("QT_QPA_PLATFORM", "offscreen")
    return env


def measure_quit(args, folder: str) -> list[tuple[float, str]]:
    results = []
    for _ in range(args.trials):
        child = subprocess.Popen([sys.executable, "-c", QUIT_CHILD, str(args.root), args.preset, args.backend,
                                  str(args.train_s)], cwd=args.root, env=child_env(folder),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        discard, call = None, ""
        for line in child.stdout:
            if line.startswith("DISCARD "):
                _, stamp, call = line.rstrip("\n").split(" ", 2)
                discard = float(stamp)
        child.wait()
        exited = time.time()
        if discard is None or child.returncode != 0:
            raise RuntimeError(f"the quit child failed ({child.returncode}): {child.stderr.read()[-2000:]}")
        results.append((1000 * (exited - discard), call))
    return results


def measure_stop(args, folder: str) -> list[tuple[float, str]]:
    out = subprocess.run([sys.executable, "-c", STOP_CHILD, str(args.root), args.preset, args.backend,
                          str(args.trials)], cwd=args.root, env=child_env(folder), capture_output=True, text=True,
                         timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"the stop child failed ({out.returncode}): {out.stderr[-2000:]}")
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return [(row["stop_ms"], row["call"]) for row in rows]


def summary(name: str, results: list[tuple[float, str]]) -> str:
    ms = [r[0] for r in results]
    slowest = max(results)
    return (f"{name}: median {statistics.median(ms):.0f} ms, max {max(ms):.0f} ms over {len(ms)} "
            f"({', '.join(f'{m:.0f}' for m in ms)}); the slowest during {slowest[1] or 'no call'!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="s256")
    parser.add_argument("--backend", default="numpy")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--train-s", type=float, default=3.0, help="training before each Quit")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose code is measured")
    parser.add_argument("--only", choices=["quit", "stop"])
    args = parser.parse_args()
    print(f"{args.root} ({args.preset}, {args.backend}, {os.environ.get('QT_QPA_PLATFORM', 'offscreen')}), "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="microgpt-latency-") as folder:
        if args.only != "stop":
            print(summary("Quit (Discard to exit)", measure_quit(args, folder)), flush=True)
        if args.only != "quit":
            print(summary("Stop (to stopped)", measure_stop(args, folder)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
