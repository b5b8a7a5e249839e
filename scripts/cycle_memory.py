"""The window's resident memory over many Train / Sample / Reset cycles, as
issue 27 measured it: RSS at cycle 25 and at the last cycle, and the growth
between them (it was 114 MiB over 300 cycles while every finished run left its
worker alive; issue 19's was every run keeping its whole curve). Offscreen,
NumPy backend, tiny preset, a settings file of its own (the user's is never
touched). Exit status 1 when the growth is --limit-mib or more.

    python scripts/cycle_memory.py [--cycles 300] [--steps 200] [--limit-mib 10]
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from dev_data import DEFAULT_DATA  # noqa: E402  (beside this script)

BASELINE_CYCLE = 25  # the window has settled by then (caches, first allocations)


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=25, help="print the RSS every this many cycles")
    parser.add_argument("--limit-mib", type=float, default=10.0)
    parser.add_argument("--data", default=DEFAULT_DATA)
    args = parser.parse_args()
    if args.cycles <= BASELINE_CYCLE:
        parser.error(f"--cycles must be above {BASELINE_CYCLE}")

    folder = tempfile.TemporaryDirectory(prefix="microgpt-cycle-memory-")
    os.environ["MICROGPT_GUI_SETTINGS"] = str(Path(folder.name) / "settings.ini")
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

    def settled_rss() -> float:
        for _ in range(10):  # queued deletions and the sessions' release timers
            app.processEvents()
            time.sleep(0.01)
        gc.collect()
        return rss_mib()

    window = MainWindow(data_path=args.data)
    window.message_hook = None
    window.ask_before_discarding = False
    window.show()
    wait(lambda: window.corpus is not None)
    window.config_panel.preset_combo.setCurrentText("tiny")
    window.config_panel.steps_spin.setValue(args.steps)
    baseline = None
    started = time.monotonic()
    for cycle in range(1, args.cycles + 1):
        window.start_run()
        wait(lambda: window.state == "done")
        window.sample_panel.request()
        wait(lambda: window.sample_panel.names())
        window.reset()
        wait(lambda: window.state == "none")
        if cycle % args.every == 0 or cycle in (1, BASELINE_CYCLE, args.cycles):
            now = settled_rss()
            baseline = now if cycle == BASELINE_CYCLE else baseline
            print(f"cycle {cycle:4d}: {now:7.1f} MiB, runs listed {len(window.run_list.runs)}", flush=True)
    growth = settled_rss() - baseline
    per_cycle_kib = 1024 * growth / (args.cycles - BASELINE_CYCLE)
    ok = growth < args.limit_mib
    print(f"growth from cycle {BASELINE_CYCLE} to {args.cycles}: {growth:+.1f} MiB ({per_cycle_kib:.0f} KiB a cycle, "
          f"{time.monotonic() - started:.0f} s); limit {args.limit_mib:g} MiB: {'passed' if ok else 'FAILED'}")
    window.close_without_asking()
    wait(lambda: not window.isVisible())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
