"""`microgpt-gui` without a subcommand: open the window with the options
engine.cli.commands.window_args has parsed and checked, run Qt, and leave
at once when the window has closed."""
from __future__ import annotations

import argparse
import os
import sys

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from .gui_thread_gc import GuiThreadCollector
from .main_window import APPLICATION, ORGANIZATION, RESOURCES, MainWindow
from .sessions import saving_sessions


def autorun(window: MainWindow, steps: int, quit_when_done: bool) -> None:
    """Train `steps` steps once a dataset is in; optionally quit when the run ends."""
    app = QApplication.instance()
    errors_before = len(window.messages)

    def start(*_):
        window.app.with_steps(steps)  # the Steps field follows the model
        if not window.start_run() and quit_when_done:
            print(f"microgpt-gui: cannot train: {window.messages[-1][2]}", file=sys.stderr)
            app.exit(1)

    def on_state(state: str):
        if quit_when_done and state in ("done", "failed"):
            failed = state == "failed" or any(kind == "error" for kind, *_ in window.messages[errors_before:])
            print(f"microgpt-gui: run {'failed' if failed else 'ended'} at step {window.loss_plot.series.n:,} "
                  f"on the {app.platformName()} platform",
                  file=sys.stderr if failed else sys.stdout)
            app.exit(1 if failed else 0)

    def on_message(kind: str, text: str):
        if quit_when_done and window.corpus is None and kind in ("error", "warning"):
            print(f"microgpt-gui: no dataset: {text}", file=sys.stderr)
            app.exit(1)

    window.stateChanged.connect(on_state)
    if window.corpus is not None:
        QTimer.singleShot(0, start)
    elif quit_when_done and any(kind == "error" for kind, *_ in window.messages):
        QTimer.singleShot(0, lambda: on_message("error", window.messages[-1][2]))
    else:
        window.datasetChanged.connect(start)
        window.messageShown.connect(on_message)


def apply_options(window: MainWindow, args: argparse.Namespace) -> None:
    """--preset and --backend written into the application model (the fields follow it;
    --data is the window's own argument: it reads that file first)."""
    if args.preset:
        window.app.select_preset(args.preset)
    if args.backend and not window.app.select_backend(args.backend):
        print(f"microgpt-gui: backend {args.backend!r} is not available here", file=sys.stderr)


def run_gui(args: argparse.Namespace) -> int:
    """args: engine.cli.commands.window_args's; the preset and backend are known to be valid here."""
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)
    collector = GuiThreadCollector(app)  # Qt objects are destroyed on the GUI thread only
    collector.start(freeze=True)  # the imports' objects stay out of full collections
    style = RESOURCES / "style.qss"
    if style.is_file():  # cosmetic: the window works without it
        app.setStyleSheet(style.read_text(encoding="utf-8"))
    window = MainWindow(data_path=args.data)
    # quit when the window has really closed: with a worker inside a long call it
    # hides at once and closes only when the worker has finished
    app.setQuitOnLastWindowClosed(False)
    window.closed.connect(app.quit)
    apply_options(window, args)
    window.show()
    if args.autorun_steps:
        autorun(window, args.autorun_steps, args.quit_when_done)
    status = app.exec()
    window.close_without_asking()  # the event loop has ended: nobody could answer a question
    collector.stop()
    return status


def leave(status: int) -> int:
    """After run_gui: exit now, as pyqtgraph.exit does, without tearing down every Qt
    and Python object (hundreds of ms under X) or waiting for a worker still inside a
    call of the run the window discarded (the closed window wrote every checkpoint
    asked for first). Returns only while a session still has one to write: the
    interpreter's exit then waits for it (gui.sessions.exit_when_sessions_end)."""
    if saving_sessions():
        return status
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
