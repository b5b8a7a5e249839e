"""Make docs/screenshot.png: the window after a run of the `learn` preset (its
held-out curve on the loss plot) and a round of samples.

    python scripts/screenshot.py [--data names.txt] [--preset learn] [--steps N] [--out docs/screenshot.png]

Runs offscreen by default (QT_QPA_PLATFORM=offscreen); set QT_QPA_PLATFORM=xcb
with a DISPLAY (e.g. under xvfb-run) to render through a real X server.
It uses a throwaway settings file, so your own settings are left alone.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dev_data import DEFAULT_DATA  # noqa: E402  (beside this script)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=DEFAULT_DATA, help="dataset (default: %(default)s)")
    parser.add_argument("--preset", default="learn")
    parser.add_argument("--steps", type=int, default=None, help="default: the preset's")
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshot.png"))
    parser.add_argument("--size", default="1180x720", help="window size WxH")
    args = parser.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["MICROGPT_GUI_SETTINGS"] = os.path.join(tempfile.mkdtemp(), "settings.ini")

    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from gui.main_window import RESOURCES, MainWindow

    app = QApplication([sys.argv[0]])
    app.setStyleSheet((RESOURCES / "style.qss").read_text(encoding="utf-8"))
    window = MainWindow(data_path=args.data)
    window.message_hook = None
    width, height = (int(v) for v in args.size.split("x"))
    window.resize(width, height)
    window.config_panel.preset_combo.setCurrentText(args.preset)
    if args.steps is not None:
        window.config_panel.steps_spin.setValue(args.steps)
    window.show()

    def on_state(state: str) -> None:
        if state == "done":
            window.sample_panel.count_spin.setValue(12)
            window.sample_panel.sample_button.click()
        elif state == "failed":
            app.exit(1)

    def on_samples(*_) -> None:
        QTimer.singleShot(300, grab)  # let the last redraw and the list settle

    def grab() -> None:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        if not window.grab().save(str(out), "PNG"):
            print(f"screenshot: could not write {out}", file=sys.stderr)
            app.exit(1)
            return
        print(f"screenshot: {out} ({out.stat().st_size // 1024} KiB) after {window.loss_plot.series.n} steps")
        app.exit(0)

    def on_message(kind: str, text: str) -> None:
        if window.corpus is None:  # the dataset could not be read
            print(f"screenshot: cannot open {args.data}: {text}", file=sys.stderr)
            app.exit(1)

    window.stateChanged.connect(on_state)
    window.messageShown.connect(on_message)
    window.sample_panel.samples_list.model().rowsInserted.connect(on_samples)
    window.datasetChanged.connect(lambda _: window.start_run() or app.exit(1))
    status = app.exec()
    window.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
