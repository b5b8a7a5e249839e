"""Random-click soak of the window: a seeded sequence of user actions (keys,
buttons, presets, fields, sliders, checkpoints, exports, datasets, closing and
reopening), with the work made slow by tests/gui/slow_backend.SlowBackend so
that Reset, close and load land while the worker is opening a model or
sampling. It checks what issue 13 asks:

  no event-loop stall over --max-stall-ms on the GUI thread (a 10 ms QTimer probe),
    the garbage collected on the GUI thread as the app does (gui/gui_thread_gc.py),
    less the time the process waited for a CPU (tests/gui/latency_probe.py)
  no Python exception in a slot, no Qt warning, no abort (run it as a process: abort = signal)
  every training thread finished at the end, every closed window really closed

    python scripts/soak.py [--seed 1] [--actions 300 | --minutes 30] [--json report.json] [--keep-files]

Its files (datasets, checkpoints, exports, settings) go in a temporary folder,
removed at the end unless --keep-files.

Exit status 0 when every check holds, 1 otherwise. Offscreen by default.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "gui")]
from dev_data import DEFAULT_DATA  # noqa: E402  (beside this script)

from soak_actions import ACTIONS, when  # noqa: E402  (beside this script)


class Soak:
    def __init__(self, app, args):
        from PySide6.QtCore import qInstallMessageHandler

        import slow_backend
        from gui.gui_thread_gc import GuiThreadCollector
        from gui.main_window import RESOURCES
        import latency_probe

        self.app, self.args = app, args
        self.rng = random.Random(args.seed)
        self.slow = slow_backend
        self.slow.register(slow_backend.Delays(open_s=1.0, train_s=0.01, sample_s=1.0))
        app.setStyleSheet((RESOURCES / "style.qss").read_text(encoding="utf-8"))
        self.folder = Path(tempfile.mkdtemp(prefix="microgpt-soak-"))
        os.environ["MICROGPT_GUI_SETTINGS"] = str(self.folder / "settings.ini")
        self.files = self._make_files()
        self.fifos: list[Path] = []
        self.probe = latency_probe.LatencyProbe(stacks=args.stacks)
        self.collector = GuiThreadCollector(app)  # as gui.app.run_gui runs it
        self.collector.start(freeze=True)
        self.windows: list = []   # windows not yet closed (a closed one is deleted)
        self.windows_made = self.windows_closed = 0
        self.window = None
        self.counts: Counter = Counter()
        self.exceptions: list[str] = []
        self.gave_up: list[str] = []
        self.done_actions = 0
        self.log: list[str] = []
        self.starting = None  # a new window still reading its dataset
        self.finishing = False  # the windows are closing: delayed actions are dropped
        self.qt_messages: Counter = Counter()
        qInstallMessageHandler(self._on_qt_message)
        self.started = time.monotonic()
        sys.excepthook = self._on_exception  # PySide reports exceptions in slots here

    # set-up -------------------------------------------------------------------
    def _make_files(self) -> dict[str, Path]:
        f = self.folder
        (f / "small.txt").write_text("ann\nbob\ncarla\ndan\neve\n", encoding="utf-8")
        (f / "empty.txt").write_text("\n\n", encoding="utf-8")
        (f / "corrupt.npz").write_bytes(b"not a checkpoint")
        return {"names": Path(self.args.data), "small": f / "small.txt", "empty": f / "empty.txt",
                "missing": f / "missing.txt", "corrupt": f / "corrupt.npz"}

    def _on_exception(self, kind, value, tb) -> None:
        self.exceptions.append("".join(traceback.format_exception(kind, value, tb)))
        sys.__excepthook__(kind, value, tb)

    def new_window(self) -> None:
        """A new window; the probe and the actions wait until it has its dataset
        (opening a window is its start-up, not a stall of a window in use)."""
        from gui.main_window import MainWindow

        self.probe.pause()
        window = MainWindow(data_path=str(self.files["names"]))
        window.message_hook = None
        window.ask_before_discarding = False  # a window-modal question would stop the actions
        window.exit_hook = self.gave_up.append
        window.resize(1180, 720)
        window.show()
        window.activateWindow()  # the Run menu's keys need the active window
        self.windows.append(window)
        self.windows_made += 1
        window.closed.connect(lambda: self._on_closed(window))
        self.window = window
        self.starting = window

    def _on_closed(self, window) -> None:
        """A window's close completed (its worker had finished): let it go, and collect
        its Python garbage here, on the GUI thread (Python's collector runs in whichever
        thread allocates; Qt objects must not be destroyed from a worker's)."""
        self.windows.remove(window)
        self.windows_closed += 1
        window.deleteLater()
        self.later(0, self._collect)

    def _collect(self) -> None:
        self.probe.pause()  # the driver's own work: the app never deletes its window
        gc.collect()
        self.probe.resume()

    def _on_qt_message(self, kind, context, message: str) -> None:
        if not message.startswith("This plugin does not support"):  # the offscreen platform's notices
            self.qt_messages[message] += 1

    # the run ------------------------------------------------------------------
    def start(self) -> None:
        self.new_window()
        when(self, lambda: not self.window.reading_dataset, self._begin, patience_s=60)

    def _begin(self) -> None:
        if self.window.corpus is None:
            self.exceptions.append(f"cannot open the dataset {self.args.data}: {self.window.messages}")
            self.finish()
            return
        self.step()

    def finished(self) -> bool:
        if self.args.minutes:
            return time.monotonic() - self.started > 60 * self.args.minutes
        return self.done_actions >= self.args.actions

    def step(self) -> None:
        from PySide6.QtCore import QTimer

        if self.finished():
            self.finish()
            return
        if self.starting is not None:
            if self.starting.reading_dataset:
                QTimer.singleShot(20, self.step)
                return
            self.starting = None
            self.probe.resume()
        name = self.rng.choices(list(ACTIONS), weights=[w for w, _ in ACTIONS.values()])[0]
        self.probe.label = name
        self.counts[name] += 1
        if self.done_actions == 0:
            print(f"GUI thread {threading.get_native_id()} of process {os.getpid()}", flush=True)
        self.log.append(f"{time.monotonic() - self.started:7.2f} {name:26} {self.window.state:9} "
                        f"{self.window.config_panel.backend_name()} {self.window.config_panel.preset_combo.currentText()}"
                        f" corpus={self.window.corpus is not None} problem={self.window._train_problem()!r}")
        self.done_actions += 1
        try:
            ACTIONS[name][1](self)
        except Exception:  # a driver bug, or a public method raising: both are failures
            self.exceptions.append(f"action {name}:\n{traceback.format_exc()}")
        pause_ms = self.rng.choice([0, 10, 50, 100, 200, 400, 800, 1500])
        QTimer.singleShot(pause_ms, self.step)

    def later(self, ms: int, fn) -> None:
        """Part of an action that happens after ms (the event loop runs meanwhile)."""
        from PySide6.QtCore import QTimer

        def run():
            if self.finishing:  # its window may be closed and deleted by now
                return
            try:
                fn()
            except Exception:
                self.exceptions.append(f"delayed action:\n{traceback.format_exc()}")

        QTimer.singleShot(ms, run)

    def finish(self) -> None:
        from PySide6.QtCore import QTimer
        from gui.sessions import running_sessions

        self.probe.label = "closing at the end"
        self.finishing = True
        for window in list(self.windows):
            window.close()
        for fifo in self.fifos:  # release readers still waiting on a FIFO
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                os.close(fd)
            except OSError:
                pass
        deadline = time.monotonic() + 60

        def check():
            busy = running_sessions() or any(w.sessions.busy_ending for w in self.windows)
            if busy and time.monotonic() < deadline:
                QTimer.singleShot(50, check)
                return
            self.probe.stop()
            self.collector.stop()
            self.app.exit(0)

        check()

    def report(self) -> dict:
        import latency_probe
        from gui.sessions import running_sessions

        limit = self.args.max_stall_ms
        return {
            "seed": self.args.seed, "started_monotonic": self.started, "actions": self.done_actions, "seconds": round(time.monotonic() - self.started, 1),
            "windows": self.windows_made, "probe_ticks": self.probe.ticks,
            "max_stall_ms": round(self.probe.max_ms, 1), "max_stall_during": self.probe.max_label,
            # a stall's own part: all of it but the time this process waited for a free CPU
            # (other processes' load); over the limit, that part fails the soak
            "max_own_stall_ms": round(self.probe.max_own_ms, 1),
            "stalls_over_limit": [s.brief() for s in self.probe.stalls if s.own_ms > limit],
            "stalls_over_50ms": [s.brief() for s in self.probe.stalls],
            "stall_fields": latency_probe.FIELDS,
            "stall_stacks": [(s.brief(), s.stacks) for s in self.probe.stalls if s.stacks],
            # who ran while the GUI thread waited: (stall, GUI thread's sleeps, ms of garbage collection
            # in other threads, [(thread, ms on a CPU, ms waiting for one)], s into the soak at its end)
            "stall_threads": [(s.brief(), s.gui_sleeps, round(s.other_gc_ms), s.threads,
                               round(s.ended_at - self.started, 2)) for s in self.probe.stalls],
            # Python's garbage collections of 10 ms or more: (s into the soak, thread, generation, ms)
            "collections_over_10ms": [c for c in self.probe.collections if c[3] >= 10],
            "exceptions": self.exceptions, "gave_up": self.gave_up,
            "qt_warnings": dict(self.qt_messages),
            "threads_running_at_end": len(running_sessions()),
            "windows_still_open": self.windows_made - self.windows_closed,
            "action_counts": dict(sorted(self.counts.items())),
            "slow_backend_calls": dict(self.slow.SlowBackend.calls),
        }



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--actions", type=int, default=300, help="number of actions (ignored with --minutes)")
    parser.add_argument("--minutes", type=float, help="run for this long instead of a number of actions")
    parser.add_argument("--max-stall-ms", type=float, default=100.0)
    parser.add_argument("--max-windows", type=int, default=1000, help="windows made by close-and-reopen, at most")
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument("--stacks", action="store_true",
                        help="sample the GUI thread's stack every 2 ms and report it for each stall over 50 ms")
    parser.add_argument("--json", help="also write the report to this file")
    parser.add_argument("--keep-files", action="store_true", help="keep the soak's temporary folder (printed)")
    args = parser.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    from PySide6.QtWidgets import QApplication

    import gui  # noqa: F401  (the PySide6 6.12 reference-count guard)

    app = QApplication([sys.argv[0]])
    app.setQuitOnLastWindowClosed(False)  # windows close and reopen; finish() ends the soak
    soak = Soak(app, args)
    soak.start()
    app.exec()
    report = soak.report()
    if args.keep_files:
        print(f"the soak's files: {soak.folder}")
    else:
        shutil.rmtree(soak.folder, ignore_errors=True)
    text = json.dumps(report, indent=1)
    if args.json:
        Path(args.json).write_text(text)
        Path(args.json).with_suffix(".log").write_text("\n".join(soak.log))
    ok = (not report["exceptions"] and not report["gave_up"] and not report["stalls_over_limit"]
          and not report["qt_warnings"]
          and report["threads_running_at_end"] == 0 and report["windows_still_open"] == 0)
    print(text)
    print(f"soak {'passed' if ok else 'FAILED'}: seed {args.seed}, {report['actions']} actions in "
          f"{report['seconds']} s, max stall {report['max_stall_ms']} ms ({report['max_stall_during']}), "
          f"max own stall {report['max_own_stall_ms']} ms, load average {os.getloadavg()[0]:.1f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
