"""Training off the GUI thread: the Qt side of engine.training.loop.TrainingLoop.

A TrainingWorker is a QObject that its session moves to a QThread of its own;
there it runs one TrainingLoop, which opens, trains and closes the backend
(Futhark contexts are not thread-safe, so all of it happens in that thread).
The worker adds nothing to the loop: the GUI's commands (send) go straight to
the loop, which never waits, and each event the loop emits is re-emitted by
one signal, `reported` (queued to the GUI thread by gui.sessions.WorkerReports).
What the window reads without waiting (`phase`, `call`, `step`,
`train_seconds`, `loss_history()`, `saves_pending`) are the loop's snapshots.

When the loop returns, the worker moves back to the GUI thread and emits
`finished`, which ends its QThread; the session then lets go of it there (a
QObject is deleted in its own thread, never another's).
"""
from __future__ import annotations

import weakref

from PySide6.QtCore import QCoreApplication, QObject, Signal, Slot

from engine.training import protocol as rs
from engine.training.loop import LoopSettings, TrainingLoop
from engine.training.protocol import RunSpec

# The window's loop: chunks of about 50 ms, held-out evaluation on its schedule,
# a first-use Futhark build shown while the backend opens
WINDOW_LOOP = LoopSettings(report_builds=True)


class TrainingWorker(QObject):
    reported = Signal(object)  # a protocol event (named so: see gui.sessions.WorkerReports)
    finished = Signal()        # the loop has returned (backend closed); the thread ends next

    def __init__(self, spec: RunSpec, settings: LoopSettings = WINDOW_LOOP):
        super().__init__()
        self.loop = TrainingLoop(spec, _emitter(self), settings)

    # the loop's interface, for the GUI thread (none of it waits) ---------------
    def send(self, command: rs.Command) -> None:
        self.loop.send(command)

    @property
    def spec(self) -> RunSpec:
        return self.loop.spec

    @property
    def phase(self):
        return self.loop.phase

    @property
    def call(self) -> str:
        return self.loop.call

    @property
    def step(self) -> int:
        return self.loop.step

    @property
    def train_seconds(self) -> float:
        return self.loop.train_seconds

    @property
    def steps_per_chunk(self) -> int:
        return self.loop.steps_per_chunk

    @property
    def saves_pending(self) -> bool:
        return self.loop.saves_pending

    @property
    def backend(self):
        """The loop's backend (tests look at it; the window never does)."""
        return self.loop.backend

    def loss_history(self):
        return self.loop.loss_history()

    # the worker's thread ------------------------------------------------------
    @Slot()
    def run(self) -> None:
        try:
            self.loop.run()
        finally:
            # back to the GUI thread, where the session lets go of this object once the
            # thread has ended: a QObject is deleted in its own thread, never another's
            app = QCoreApplication.instance()
            if app is not None:
                self.moveToThread(app.thread())
            self.finished.emit()


def _emitter(worker: TrainingWorker):
    """The loop's emit: worker.reported.emit, through a weak reference, so that the
    loop (held by the worker) does not hold the worker in a cycle that the garbage
    collector might break in any thread."""
    ref = weakref.ref(worker)

    def emit(event: rs.Event) -> None:
        w = ref()
        if w is not None:
            w.reported.emit(event)

    return emit
