"""Starting and ending a sweep's runner (engine.sweep.runner, run as python -m engine.sweep) from a parent:
the command line that starts it, the folder a new sweep writes to, and
ending it with every process it started.

The runner is a session leader; a local Ray's processes (its GCS, raylet and
workers) stay in its session, though the workers are process groups of
their own. So ending a sweep is: ask it ({"stop": "all"} on its stdin, which
lets Tune save its state for --resume), wait a little, then signal every
process of its session (end_session). The command line uses a SweepProcess
(subprocess); the window starts the same command with a QProcess and ends it
with end_session.
"""
from __future__ import annotations

import collections
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

from ..data.corpus import user_data_dir
from .events import parse_line

STOP_GRACE_S = 20.0  # a stopped sweep saves Tune's state and shuts Ray down within this
KILL_GRACE_S = 3.0   # after SIGTERM, before SIGKILL
STDERR_LINES = 40    # the runner's last stderr lines, kept for a message when it fails


def ray_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def default_sweep_dir(name: str, now: datetime | None = None) -> Path:
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return user_data_dir() / "sweeps" / f"{name}-{stamp}"


def runner_command(folder: Path, spec: Path | None = None, address: str | None = None,
                   resume: bool = False, commands: bool = True) -> list[str]:
    command = [sys.executable, "-m", "engine.sweep", "--dir", str(folder)]
    command += ["--resume"] if resume else ["--spec", str(spec)]
    if address:
        command += ["--address", address]
    if commands:
        command.append("--commands")
    return command


def runner_environment(environ=None) -> dict[str, str]:
    """This process's environment, with the folder holding this `engine` first on
    PYTHONPATH: the runner and Ray's local workers import the same code as the parent."""
    env = dict(os.environ if environ is None else environ)
    root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    env["PYTHONPATH"] = os.pathsep.join([root, *paths])
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


# ---- ending a session -------------------------------------------------------------------

def session_processes(sid: int) -> list[int]:
    """Every live process of session sid (Linux /proc; elsewhere `ps`)."""
    pids = []
    proc = Path("/proc")
    if proc.is_dir():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) "
            if len(fields) > 3 and fields[0] != "Z" and int(fields[3]) == sid:
                pids.append(int(entry.name))
        return pids
    try:
        out = subprocess.run(["ps", "-A", "-o", "pid=,sess=,stat="], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return pids
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1].isdigit() and int(parts[1]) == sid and not parts[2].startswith("Z"):
            pids.append(int(parts[0]))
    return pids


def signal_session(sid: int, signum: int) -> int:
    """signum to every process of session sid; how many there were."""
    pids = session_processes(sid)
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass
    return len(pids)


def end_session(sid: int, grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM to every process of the session, then SIGKILL to what is left after grace_s."""
    if not signal_session(sid, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not session_processes(sid):
            return
        time.sleep(0.1)
    signal_session(sid, signal.SIGKILL)


# ---- a runner as a subprocess (the command line) ----------------------------------------

class SweepProcess:
    """A runner child: its events on a queue (parsed JSON lines), its stderr's last lines,
    stop() and end()."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None):
        self.events: queue.Queue = queue.Queue()
        self.stderr_tail: collections.deque = collections.deque(maxlen=STDERR_LINES)
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, encoding="utf-8",
                                        errors="replace", env=env if env is not None else runner_environment())
        self._readers = [threading.Thread(target=self._read_events, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read_events(self) -> None:
        for line in self.process.stdout:
            event = parse_line(line)
            if event is not None:
                self.events.put(event)
        self.events.put(None)  # the runner's stdout closed: it has ended

    def _read_stderr(self) -> None:
        for line in self.process.stderr:
            if line.strip():
                self.stderr_tail.append(line.rstrip())

    def send(self, command: dict) -> None:
        try:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # it has ended

    def stop(self, trial: str = "all") -> None:
        self.send({"stop": trial})

    def end(self, grace_s: float = STOP_GRACE_S) -> int:
        """Stop the sweep, wait up to grace_s for it to end, then end its session."""
        self.stop()
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        end_session(self.process.pid)
        return self.wait()

    def wait(self) -> int:
        code = self.process.wait()
        end_session(self.process.pid)  # whatever it left (a worker still exiting)
        for reader in self._readers:
            reader.join(5)
        return code
