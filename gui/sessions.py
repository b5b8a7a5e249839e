"""Runs and their endings, without ever waiting on the GUI thread.

A Session is one TrainingWorker in its own QThread. Ending one only asks the
worker to end (send(End())); the Session stays referenced until its
thread has finished, so a running QThread is never destroyed (Qt aborts the
process when that happens). Sessions holds the current session and the ones
still ending, and says when the last of them has finished.

At interpreter exit a session may still be ending (the event loop stopped
before its thread did): exit_when_sessions_end waits for it, up to a bound,
and then leaves with os._exit rather than let Python destroy a running QThread.
"""
from __future__ import annotations

import atexit
import os
import sys
import time
import weakref

from PySide6.QtCore import QObject, QThread, Qt, QTimer, Signal, Slot

from engine.training.loop import SAVING
from engine.training.protocol import End, Error, Event, RunSpec, Saved

from .background import emit_while_alive
from .worker import TrainingWorker

# While a worker or a file read computes in Python, the GUI thread waits for the GIL
# at each of its many short Qt calls, up to one switch interval (5 ms by default)
# every time; a shorter interval keeps the event loop's stalls small.
GIL_SWITCH_INTERVAL_S = 0.0005
# How long a closed window (or an exiting interpreter) waits for a worker inside
# a call that cannot be cut short (opening a huge model, compiling kernels).
END_BOUND_S = 20.0

_alive: set["Session"] = set()  # started and not yet finished, whoever else holds them
_finishing: list["Session"] = []  # finished signal seen, QThread still ending


class WorkerReports(QObject):
    """The worker's events, re-emitted on the GUI thread, until its session ends.

    The window listens here, not to the worker: `reported` is emitted on the GUI
    thread (queued from the worker's), and once the session has ended it is
    silent, so nothing an ended worker still had queued reaches the window, but
    for what became of the checkpoints asked for before the end (an ending worker
    still writes them): their Saved and any Error come by `reportedAfterEnd`.
    (Never name a signal `event`: it hides QObject.event, and PySide then keeps a
    reference for every event Qt delivers, so the object is never freed.)"""

    reported = Signal(object)          # an engine.training.protocol event
    reportedAfterEnd = Signal(object)  # a Saved or an Error that came after the end

    def __init__(self):
        super().__init__()
        self.ended = False

    def relay(self, worker: TrainingWorker) -> None:
        worker.reported.connect(self._relay)  # queued: self lives on the GUI thread

    @Slot(object)
    def _relay(self, event: Event) -> None:
        if not self.ended:
            self.reported.emit(event)
        elif isinstance(event, (Saved, Error)):
            self.reportedAfterEnd.emit(event)


class Session:
    """One run: a TrainingWorker moved to its own QThread, reporting through `reports`."""

    def __init__(self, spec: RunSpec):
        self.worker = TrainingWorker(spec)
        self.reports = WorkerReports()
        self.reports.relay(self.worker)
        self.thread = QThread()
        self.thread.setObjectName("training")
        self.worker.moveToThread(self.thread)
        self.thread.started.connect(self.worker.run)
        # the worker ends its own thread: this works with no event loop running in the GUI
        self.worker.finished.connect(self.thread.quit, Qt.DirectConnection)

    def start(self) -> None:
        shorten_gil_switch_interval()
        _alive.add(self)  # Sessions drops it once the thread has finished
        self.thread.start()

    def end(self, serve_saves: bool = True) -> None:
        """Ask the worker to end; returns at once (thread.finished follows). Its
        reports stop here, but for its checkpoints' (reportedAfterEnd)."""
        self.reports.ended = True
        self.worker.send(End(serve_saves))

    @property
    def waiting_for(self) -> str:
        """The call the worker is inside now, e.g. 'sampling 200 names' ('' if none)."""
        return self.worker.call

    @property
    def saving(self) -> bool:
        """The worker is writing a checkpoint (which is never given up on)."""
        return self.worker.call == SAVING

    @property
    def saves_pending(self) -> bool:
        """A checkpoint asked for is still to be written (queued or being written)."""
        return self.worker.saves_pending


class Sessions(QObject):
    """The current session and those still ending; `allEnded` when the last one has."""

    allEnded = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.current: Session | None = None
        self.ending: list[Session] = []

    def start(self, spec: RunSpec) -> Session:
        """A new current session (the previous one must have been ended first)."""
        assert self.current is None, "end the current session before starting another"
        session = self.current = Session(spec)
        # queued to the GUI thread (where the QThread object lives): the last
        # reference to a QThread must never be dropped on that thread itself.
        # A weak reference: the connection must not keep the session alive.
        ref = weakref.ref(session)
        session.thread.finished.connect(lambda: self._on_thread_finished(ref()))
        return session

    def end_current(self, serve_saves: bool = True) -> None:
        """Ask the current session to end; it is kept in `ending` until its thread finishes."""
        session, self.current = self.current, None
        if session is None:
            return
        session.end(serve_saves)
        if session in _alive:
            self.ending.append(session)

    def _on_thread_finished(self, session: Session | None) -> None:
        if session is None:
            return
        _alive.discard(session)
        _release_when_finished(session)
        if session in self.ending:
            self.ending.remove(session)
            if not self.ending:
                emit_while_alive(self.allEnded)  # the window may have been deleted meanwhile

    @property
    def busy_ending(self) -> bool:
        return bool(self.ending)

    def waiting_for(self) -> str:
        """What the ending sessions are inside, e.g. 'sampling 200 names'."""
        return ", ".join(dict.fromkeys(s.waiting_for for s in self.ending if s.waiting_for))

    def saving(self) -> bool:
        """An ending session is writing a checkpoint."""
        return any(s.saving for s in self.ending)

    def saves_pending(self) -> list[Session]:
        """The ending sessions that still have a checkpoint to write."""
        return [s for s in self.ending if s.saves_pending]


def _release_when_finished(session: Session) -> None:
    """Hold the session until its thread is past QThread's own ending, then let it go:
    dropping the last reference before that would make the QThread destructor wait."""
    if session.thread.isFinished():
        return
    _finishing.append(session)

    def retry() -> None:
        _finishing.remove(session)
        _release_when_finished(session)

    QTimer.singleShot(20, retry)


def shorten_gil_switch_interval() -> None:
    """The GUI thread's many short Python calls each wait for the GIL up to one switch
    interval while another thread computes: keep that interval short."""
    sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))


def running_sessions() -> list[Session]:
    return [s for s in list(_alive) if s.thread.isRunning()]


def saving_sessions() -> list[Session]:
    """Running sessions with a checkpoint still to write (the process must wait for them)."""
    return [s for s in running_sessions() if s.saves_pending]


def exit_now(message: str, status: int = 0) -> None:
    """Say why on stderr and leave at once: no Python or Qt teardown that could
    destroy a running thread (os._exit skips it; buffered output is flushed first)."""
    print(f"microgpt-gui: {message}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def exit_when_sessions_end(bound_s: float | None = None) -> None:
    """At interpreter exit: wait (up to bound_s, default END_BOUND_S) for sessions
    still ending, then exit without tearing down a running QThread."""
    bound_s = END_BOUND_S if bound_s is None else bound_s
    deadline = time.monotonic() + bound_s
    for session in running_sessions():
        session.end()
        remaining_ms = max(0, int(1000 * (deadline - time.monotonic())))
        if not session.thread.wait(remaining_ms):
            exit_now(f"the training thread is still busy ({session.waiting_for or 'ending'}) after "
                     f"{bound_s:g} s; exiting without waiting for it")


atexit.register(exit_when_sessions_end)
