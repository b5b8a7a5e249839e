"""The window's memory over many Train / Sample / Reset cycles (issue 19: it
grew 35 MiB over 300 cycles when every run kept its whole curve in the Runs
tab). Offscreen, NumPy backend, tiny preset; prints the resident set size
every --every cycles and the growth from the first report to the last.

    python scripts/run_memory.py --cycles 300 --steps 200
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from dev_data import DEFAULT_DATA  # noqa: E402  (beside this script)


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--data", default=DEFAULT_DATA)
    args = parser.parse_args()

    from PySide6.QtWidgets import QApplication
    app = QApplication.instance() or QApplication([])
    from gui.main_window import MainWindow

    def wait(predicate, timeout_s=120.0):
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError("the window did not get there in time")
            app.processEvents()
            time.sleep(0.002)

    window = MainWindow(data_path=args.data)
    window.message_hook = None
    window.ask_before_discarding = False
    window.show()
    wait(lambda: window.corpus is not None)
    window.config_panel.steps_spin.setValue(args.steps)
    first = None
    for cycle in range(1, args.cycles + 1):
        window.start_run()
        wait(lambda: window.state == "done")
        window.sample_panel.request()
        wait(lambda: window.sample_panel.names())
        window.reset()
        wait(lambda: window.state == "none")
        if cycle % args.every == 0 or cycle == 1:
            gc.collect()
            now = rss_mib()
            first = now if first is None else first
            print(f"cycle {cycle:4d}: {now:7.1f} MiB, runs listed {len(window.run_list.runs)}, "
                  f"curves {len(window.run_list.curves)}", flush=True)
    print(f"growth from cycle 1 to {args.cycles}: {rss_mib() - first:+.1f} MiB")
    getattr(window, "close_without_asking", window.close)()  # (an older build: close)
    wait(lambda: not window.isVisible())
    return 0


if __name__ == "__main__":
    sys.exit(main())
