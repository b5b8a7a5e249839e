"""Make docs/*.png of the inspect panels after real runs on names.txt.

    python scripts/screenshot_panels.py [--data names.txt] [--steps 1000] [--out docs]
                                        [--backends numpy,futhark-c,cupy] [--no-study]

Trains microgpt (`tiny`, NumPy backend) for --steps steps, feeding the
panels a parameter snapshot every 50 steps as the window does, then grabs:
next_char.png (prefix "ma", completions, names sampled from it),
attention.png, char_map.png (with the trails of the last snapshots),
run_overlay.png (that run and two more: tiny at another learning rate, and
s32) and scaling_study.png (a real study of --backends on tiny..s128; a
backend that cannot run here shows its reason). Offscreen by default.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dev_data import DEFAULT_DATA  # noqa: E402  (beside this script)
SNAPSHOT_EVERY = 50


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=DEFAULT_DATA, help="dataset (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--out", default=str(ROOT / "docs"))
    parser.add_argument("--backends", default="numpy,futhark-c,cupy", help="for the scaling study")
    parser.add_argument("--no-study", action="store_true", help="skip the scaling study (its measurements take ~20 s)")
    args = parser.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    import gui  # noqa: F401  (PySide6 6.12 workaround before any Qt call)
    import shiboken6
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    import engine
    from engine.model import introspect as ins
    from engine.training.records import RunRecord
    from gui.attention_view import AttentionPanel
    from gui.char_map import CharMapPanel
    from gui.inspect_hub import InspectHub
    from gui.main_window import RESOURCES
    from gui.next_char_panel import NextCharPanel
    from gui.run_list import RunListPanel
    from gui.scaling_study import ScalingStudyDialog

    app = QApplication([sys.argv[0]])
    app.setStyleSheet((RESOURCES / "style.qss").read_text(encoding="utf-8"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = engine.load_corpus(args.data)

    def settle(seconds: float = 0.4) -> None:
        loop = QEventLoop()  # not app.quit(): in Qt 6 that also closes the windows
        QTimer.singleShot(int(1000 * seconds), loop.quit)
        loop.exec()

    def save(widget, name: str) -> None:
        settle()
        path = out / name
        if not widget.grab().save(str(path), "PNG"):
            raise SystemExit(f"screenshot_panels: could not write {path}")
        print(f"screenshot_panels: {path} ({path.stat().st_size // 1024} KiB)")

    hub = InspectHub()
    next_char, attention, char_map = NextCharPanel(hub), AttentionPanel(hub), CharMapPanel(hub)
    for panel, size in ((next_char, (820, 600)), (attention, (640, 600)), (char_map, (700, 600))):
        panel.resize(*size)
        panel.show()
    next_char.set_prefix("ma")
    attention.set_text("isabella")

    def train(preset: str, name: str, lr: float | None = None, feed: bool = False) -> tuple:
        p = engine.PRESETS[preset].with_steps(args.steps)
        if lr is not None:
            p = replace(p, train=replace(p.train, learning_rate=lr))
        backend = engine.open_backend("numpy", p.model, p.train, corpus)
        record = RunRecord(name, backend.name, p.model, p.train)
        while not backend.finished:
            first, started = backend.step, time.perf_counter()
            losses = backend.train(SNAPSHOT_EVERY)
            record.extend(losses, first, time.perf_counter() - started)
            if feed:
                hub.set_snapshot(ins.Snapshot.from_backend(backend))
                settle(0.05)
        record.status = "finished"
        return backend, record

    backend, first_run = train("tiny", "run 1", feed=True)
    # "Sample from this prefix", routed to Backend.sample as the window does
    next_char.sampleRequested.connect(lambda prefix, n, temperature, seed: next_char.show_samples(
        backend.sample(n, temperature, seed, prefix=prefix), backend.step))
    next_char.sample_button.click()
    settle(1.5)  # the last beam search (at most a second after the one before)
    save(next_char, "next_char.png")
    attention.select(0, 2)
    save(attention, "attention.png")
    save(char_map, "char_map.png")
    backend.close()

    windows = [next_char, attention, char_map]
    runs = RunListPanel()
    windows.append(runs)
    runs.resize(820, 560)
    runs.show()
    runs.add_run(first_run)
    for preset, name, lr in (("tiny", "run 2", 0.003), ("s32", "run 3", None)):
        other, record = train(preset, name, lr)
        other.close()
        runs.add_run(record)
    runs.set_x_axis("seconds")
    save(runs, "run_overlay.png")

    if not args.no_study:
        study = ScalingStudyDialog(data_path=args.data)
        study.set_checked(args.backends.split(","), ["tiny", "s32", "s64", "s128"])
        study.show()
        loop = QEventLoop()
        study.studyFinished.connect(loop.quit)
        study.run()
        loop.exec()
        study.run_button.setFocus()  # no focus frame in the table
        save(study, "scaling_study.png")
        windows.append(study)
    hub.close()
    for window in windows:  # before the QApplication goes: Python frees locals in no set order
        window.close()
        shiboken6.delete(window)
    return 0


if __name__ == "__main__":
    sys.exit(main())
