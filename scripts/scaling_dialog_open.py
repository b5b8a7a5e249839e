"""How much GUI-thread work opening the scaling study's dialog puts between two
ticks of a 10 ms QTimer (the soak's probe, tests/gui/latency_probe.py, counts
a stall so).

    python scripts/scaling_dialog_open.py [--opens 8] [--root DIR]

Each opening does what Tools > Scaling study... and the soak do: build the
dialog, show it, start a study (it only checks the backends in the
background here: nothing is measured before it is closed), then runs the
event loop for 0.6 s; the GUI thread's CPU time (time.thread_time) between
consecutive ticks is recorded, and the three longest per opening printed:
CPU, not wall time, so other processes' load counts for little. Each
threading.Thread.start made meanwhile is timed too (wall time: it returns
only once the new thread has run, so under load the GUI thread waits there
for the new thread to get a CPU). The style
sheet is the window's. --root DIR measures another checkout's gui (before
and after a change; alternate runs on a shared machine). Offscreen unless
QT_QPA_PLATFORM says otherwise.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--opens", type=int, default=8)
    parser.add_argument("--root", default=str(ROOT), help="the checkout whose gui is measured")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.root).resolve()))
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QEventLoop, QTimer, qInstallMessageHandler
    from PySide6.QtWidgets import QApplication, QMainWindow

    qInstallMessageHandler(lambda *_: None)  # offscreen's "does not support raise()"
    app = QApplication([])
    import gui
    from engine.data.corpus import DEFAULT_DATASET_PATH
    from gui.main_window import RESOURCES
    from gui.scaling_study import ScalingStudyDialog

    app.setStyleSheet((RESOURCES / "style.qss").read_text(encoding="utf-8"))
    host = QMainWindow()
    host.resize(1180, 720)
    host.show()
    starts: list[float] = []  # ms each threading.Thread.start took
    real_start = threading.Thread.start

    def timed_start(thread):
        began = time.perf_counter()
        real_start(thread)
        starts.append(1e3 * (time.perf_counter() - began))

    threading.Thread.start = timed_start
    gaps: list[float] = []
    last = [time.thread_time()]

    def tick():
        now = time.thread_time()
        gaps.append(1e3 * (now - last[0]))
        last[0] = now

    probe = QTimer(interval=10)
    probe.timeout.connect(tick)
    probe.start()

    def run_loop(ms: int) -> None:
        loop = QEventLoop()
        QTimer.singleShot(ms, loop.quit)
        loop.exec()

    longest = []
    for _ in range(args.opens):
        opened = []

        def open_dialog():
            dialog = ScalingStudyDialog(data_path=str(DEFAULT_DATASET_PATH), parent=host)
            dialog.show()
            dialog.raise_()
            dialog.activateWindow()
            dialog.run()
            opened.append(dialog)

        QTimer.singleShot(100, open_dialog)
        gaps.clear()
        last[0] = time.thread_time()
        run_loop(700)
        longest.append(sorted(gaps, reverse=True)[:3])
        opened[0].cancel()
        opened[0].close()
        opened[0].deleteLater()
        run_loop(200)
    print(f"gui {Path(gui.__file__).parent}; load {os.getloadavg()[0]:.1f}")
    print("GUI-thread CPU ms between ticks, the three longest of each opening: "
          + "; ".join(" ".join(f"{x:.0f}" for x in three) for three in longest))
    print(f"median of the longest {statistics.median(t[0] for t in longest):.1f} ms, "
          f"of the second {statistics.median(t[1] for t in longest):.1f} ms")
    print(f"threading.Thread.start calls: {len(starts)}, wall ms each: " + " ".join(f"{x:.1f}" for x in starts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
