"""A sweep's runner (engine.sweep.runner) as the window's child process: a
QProcess whose stdout lines are the sweep's events, read on the GUI thread
as they come (no thread of ours, and never Ray in this process: Ray's
processes are tied to the thread that starts them).

Stop asks the runner to stop ({"stop": "all"} on its stdin: Tune saves its
state, so the sweep can be resumed); end() stops it and, if it has not ended
within a grace period, ends every process of its session (the runner and a
local Ray's processes), as at the application's quit, so no Ray process
outlives the window. A sweep submitted as a Ray job (a job server's address)
has no Ray process here: the runner stops the job on the cluster as soon as
it is asked (or sent SIGTERM), and the job ends there on its own.
"""
from __future__ import annotations

import collections
import json
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QObject, QProcess, QProcessEnvironment, QTimer, Signal

from engine.sweep import launch
from engine.sweep.events import parse_line

from .background import run_in_background

END_GRACE_MS = 8000  # a stopped sweep's Ray shuts down within this, else its session is ended


class SweepRunner(QObject):
    event = Signal(dict)      # one engine.sweep.events event
    ended = Signal(int, str)  # the runner's exit status (-1: it did not start), and why, when it failed

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.process: QProcess | None = None
        self.stderr_tail: collections.deque = collections.deque(maxlen=launch.STDERR_LINES)
        self._buffer = b""
        self._error = ""
        self._pid = 0
        self._kill_timer = QTimer(self, singleShot=True)
        self._kill_timer.timeout.connect(self._end_session_in_background)
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.kill_now)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.state() != QProcess.NotRunning

    @property
    def pid(self) -> int:
        """The runner's process id (its session's id), kept after it has ended; 0 before a start."""
        return self._pid

    def start(self, folder: Path, spec: Path | None = None, address: str | None = None, resume: bool = False) -> None:
        if self.running:
            raise RuntimeError("a sweep is running")
        command = launch.runner_command(folder, spec, address or None, resume=resume)
        process = self.process = QProcess(self)
        env = QProcessEnvironment()
        for key, value in launch.runner_environment().items():
            env.insert(key, value)
        process.setProcessEnvironment(env)
        process.setProgram(command[0])
        process.setArguments(command[1:])
        process.readyReadStandardOutput.connect(self._read_events)
        process.readyReadStandardError.connect(self._read_stderr)
        process.finished.connect(self._finished)
        process.errorOccurred.connect(self._failed_to_start)
        process.started.connect(lambda: setattr(self, "_pid", int(process.processId()) or self._pid))
        self._buffer, self._error, self._pid = b"", "", 0
        self.stderr_tail.clear()
        process.start()
        self._pid = int(process.processId())  # 0 when it failed to start

    def stop(self, trial: str = "all") -> None:
        """Stop the sweep (resumable), or one trial (for good)."""
        if self.running:
            self.process.write((json.dumps({"stop": trial}) + "\n").encode())

    def end(self, grace_ms: int = END_GRACE_MS) -> None:
        """Stop the sweep; end its session if it is still going after grace_ms."""
        if self.running:
            self.stop()
            self._kill_timer.start(grace_ms)

    def kill_now(self) -> None:
        """End the runner's session at once (the application quits)."""
        if self.running:
            launch.end_session(self.pid)

    def _end_session_in_background(self) -> None:
        if self.running:
            run_in_background(launch.end_session, self.pid, parent=self, name="end sweep")

    # the process's output ---------------------------------------------------------
    def _read_events(self) -> None:
        self._buffer += bytes(self.process.readAllStandardOutput())
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            event = parse_line(line.decode("utf-8", errors="replace"))
            if event is None:
                continue
            if event["event"] == "error":
                self._error = event.get("message", "")
            self.event.emit(event)

    def _read_stderr(self) -> None:
        text = bytes(self.process.readAllStandardError()).decode("utf-8", errors="replace")
        self.stderr_tail.extend(line for line in text.splitlines() if line.strip())

    def _finished(self, code: int, status) -> None:
        self._read_events()
        self._kill_timer.stop()
        pid = self.pid
        if pid:  # whatever of its session is left (a worker still exiting)
            run_in_background(launch.end_session, pid, parent=self, name="end sweep")
        message = self._error
        if status == QProcess.CrashExit and not message:
            message = "the sweep's runner was ended"
        elif code not in (0, 3) and not message:
            message = "the sweep's runner failed: " + (self.stderr_tail[-1] if self.stderr_tail else f"status {code}")
        self.ended.emit(code if status != QProcess.CrashExit else -1, message)

    def _failed_to_start(self, error) -> None:
        if error == QProcess.FailedToStart:
            self.ended.emit(-1, f"the sweep's runner could not start: {self.process.errorString()}")
