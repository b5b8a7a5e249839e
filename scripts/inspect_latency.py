"""Measure how long the next-character bars take to follow a keystroke.

    python scripts/inspect_latency.py [--preset s128] [--keys 40] [--data names.txt]

Opens the next-character, attention and character-map panels on one
InspectHub (offscreen), types into the prefix box key by key, and times each
keystroke from the key event to the bars drawn with the new prefix's
distribution (the signal plus a forced repaint of the plot). It does so
with the model idle, and while a thread trains the same model in chunks of
about 50 ms and hands the panels a new snapshot every 250 ms, as the window
does; the two conditions take turns. Target: 100 ms at s128.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dev_data import DEFAULT_DATA  # noqa: E402  (beside this script)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument("--preset", default="s128")
    parser.add_argument("--keys", type=int, default=60, help="keystrokes per condition")
    parser.add_argument("--rounds", type=int, default=3, help="turns the conditions take")
    args = parser.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    import gui  # noqa: F401  (PySide6 6.12 workaround before any Qt call)
    import shiboken6
    from PySide6.QtCore import QEventLoop, QObject, Qt, QTimer, Signal
    from PySide6.QtWidgets import QApplication, QTabWidget
    from typist import Typist, latency_summary

    import engine
    from engine.model import introspect as ins
    from gui.attention_view import AttentionPanel
    from gui.char_map import CharMapPanel
    from gui.inspect_hub import InspectHub
    from gui.next_char_panel import NextCharPanel

    app = QApplication([sys.argv[0]])
    corpus = engine.Corpus.from_file(args.data)
    preset = engine.PRESETS[args.preset].with_steps(100_000)
    backend = engine.open_backend("numpy", preset.model, preset.train, corpus)
    backend.train(20)
    hub = InspectHub()
    tabs = QTabWidget()
    panel = NextCharPanel(hub)
    tabs.addTab(panel, "Next character")
    attention, char_map = AttentionPanel(hub), CharMapPanel(hub)
    tabs.addTab(attention, "Attention")
    tabs.addTab(char_map, "Character map")
    tabs.resize(900, 650)
    tabs.show()
    hub.set_snapshot(ins.Snapshot.from_backend(backend))
    attention.set_text("isabella")

    class Feed(QObject):
        snapshot = Signal(object)

    feed = Feed()
    feed.snapshot.connect(hub.set_snapshot, Qt.QueuedConnection)
    stop = threading.Event()

    def train() -> None:  # the window's worker in miniature: ~50 ms chunks, a snapshot every 250 ms
        k, last = 1, 0.0
        while not stop.is_set():
            started = time.perf_counter()
            backend.train(k)
            spent = time.perf_counter() - started
            k = max(1, min(2 * k, int(0.05 / max(spent / k, 1e-7))))
            if time.perf_counter() - last > 0.25:
                feed.snapshot.emit(ins.Snapshot.from_backend(backend))
                last = time.perf_counter()

    def wait(seconds: float) -> None:
        loop = QEventLoop()  # not app.quit(): in Qt 6 that also closes the windows
        QTimer.singleShot(int(1000 * seconds), loop.quit)
        loop.exec()

    def trial(keys: int) -> list[float]:
        """Type `keys` keystrokes from the running event loop (scripts/typist.py)."""
        loop = QEventLoop()
        typist = Typist(panel, preset.model.block_size - 2, keys=keys, on_done=loop.quit)
        panel.prefix_edit.setFocus()
        typist.start()
        loop.exec()
        typist.close()
        return typist.latencies_ms

    def report(name: str, ms: list[float], note: str = "") -> None:
        keys, median, p90, most = latency_summary(ms)
        print(f"{name:<24} keystrokes {keys:3d}  median {median:6.1f} ms  "
              f"p90 {p90:6.1f} ms  max {most:6.1f} ms{note}")

    print(f"preset {args.preset} ({backend.num_params:,} parameters), numpy backend, "
          f"platform {app.platformName()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    wait(0.5)
    # the conditions take turns, so a neighbour's load falls on all of them alike
    conditions = ["model idle", "during training"]
    latencies = {name: [] for name in conditions}
    steps = {name: 0 for name in conditions}
    seconds = {name: 0.0 for name in conditions}
    sys.setswitchinterval(0.0005)  # as gui.worker does once a run starts
    per_round = max(1, args.keys // args.rounds)
    for _ in range(args.rounds):
        for name in conditions:
            trainer = None
            if name != "model idle":
                stop.clear()
                trainer = threading.Thread(target=train, daemon=True)
                trainer.start()
                wait(0.5)
            before, started = backend.step, time.perf_counter()
            latencies[name] += trial(per_round)
            steps[name] += backend.step - before
            seconds[name] += time.perf_counter() - started
            if trainer is not None:
                stop.set()
                trainer.join()
    for name in conditions:
        rate = f"  ({steps[name] / seconds[name]:.0f} training steps/s)" if steps[name] else ""
        report(name, latencies[name], rate)
    print(f"load at the end {os.getloadavg()[0]:.1f}")
    hub.close()
    backend.close()
    tabs.close()
    shiboken6.delete(tabs)  # before the QApplication goes: Python frees locals in no set order
    return 0


if __name__ == "__main__":
    sys.exit(main())
