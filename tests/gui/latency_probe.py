"""How late a 10 ms QTimer fires on the GUI thread: event-loop stalls, and
what they were made of.

A stall on a shared machine is partly the window's own doing (the GUI thread
computing, or waiting for the GIL or a lock) and partly other processes' (the
GUI thread, or the thread holding the GIL, runnable but waiting for a CPU).
On Linux each stall records, from /proc/self/task/*/schedstat, how long the
GUI thread ran, how long it waited for a CPU, and the longest any other
thread of the process waited for one, and from /proc/stat the time the
hypervisor gave this virtual machine's CPUs to others (steal, per CPU);
`own_ms` is the stall less those waits. Each stall also keeps what every
other thread did meanwhile (ms on a CPU, ms waiting for one) and how often the
GUI thread went to sleep: a GUI thread that ran little and slept often was
blocked (on the GIL, most likely), and the thread that ran meanwhile held it;
and Python's garbage collections in any thread (one holds the GIL throughout).
With stacks=True a thread samples every thread's Python stack every 2 ms and
each stall keeps the stacks seen most often during it.
"""
from __future__ import annotations

import collections
import gc
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

from PySide6.QtCore import QElapsedTimer, QObject, QTimer

TICK_MS = 10
NOTE_MS = 50  # stalls longer than this are recorded


@dataclass
class Stall:
    ms: float
    label: str            # what the driver was doing (LatencyProbe.label)
    gui_cpu_ms: float     # the GUI thread ran
    gui_wait_ms: float    # the GUI thread was runnable, waiting for a CPU
    other_wait_ms: float  # the longest another thread of the process waited for a CPU
    steal_ms: float       # CPU time the hypervisor gave to other machines, per CPU
    gc_ms: float          # Python's garbage collection on the GUI thread
    stacks: list[str] = field(default_factory=list)
    # every other thread that ran or waited for a CPU meanwhile: (name, ms on a CPU, ms waiting for one),
    # and how often the GUI thread went to sleep (blocked: on the GIL, a lock, a read)
    threads: list[tuple[str, float, float]] = field(default_factory=list)
    gui_sleeps: int = 0
    other_gc_ms: float = 0.0  # garbage collection in other threads (holding the GIL throughout)
    ended_at: float = 0.0     # time.monotonic() when the late tick came

    @property
    def own_ms(self) -> float:
        """The stall less the time this process waited for a CPU (other processes' load)."""
        return max(0.0, self.ms - self.gui_wait_ms - self.other_wait_ms - self.steal_ms)

    def brief(self) -> tuple:
        return (round(self.ms), self.label, round(self.own_ms), round(self.gui_cpu_ms), round(self.gui_wait_ms),
                round(self.other_wait_ms), round(self.steal_ms), round(self.gc_ms))


FIELDS = "ms, during, own ms, GUI on CPU, GUI waiting for a CPU, other thread waiting, steal, gc ms"


def steal_ms() -> float:
    """The machine's steal time so far, per CPU, in ms (0 where /proc/stat has none)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) * 1000 / os.sysconf("SC_CLK_TCK") / (os.cpu_count() or 1)
    except (OSError, ValueError, IndexError):
        return 0.0


def voluntary_switches(tid: str) -> int:
    """How often thread tid has gone to sleep so far (Linux; 0 elsewhere)."""
    try:
        with open(f"/proc/self/task/{tid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def thread_names() -> dict[str, str]:
    """{thread id: name}: Python's name where Python knows the thread, else the kernel's (comm)."""
    names = {str(t.native_id): t.name for t in threading.enumerate() if t.native_id is not None}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return names
    for tid in tasks:
        if tid not in names:
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    names[tid] = f.read().strip()
            except OSError:
                pass
    return names


def thread_schedstats() -> dict[str, tuple[int, int]]:
    """{thread id: (ns on a CPU, ns runnable but waiting for a CPU)} for this process (Linux)."""
    stats = {}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return stats
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                on_cpu, waiting, _ = f.read().split()
            stats[tid] = (int(on_cpu), int(waiting))
        except (OSError, ValueError):
            pass
    return stats


class LatencyProbe(QObject):
    def __init__(self, stacks: bool = False):
        super().__init__()
        self.label = ""
        self.ticks = 0
        self.stalls: list[Stall] = []
        self.max_ms, self.max_label = 0.0, ""
        self._gui_thread, self._gui_tid = threading.get_ident(), str(threading.get_native_id())
        self._last: dict[str, tuple[int, int]] = {}
        self._last_steal = 0.0
        self._last_sleeps = 0
        self._gc_ms = self._other_gc_ms = 0.0
        self._gc_starts: dict[int, float] = {}  # thread: when its collection started
        # every collection of this process: (seconds since the probe was made, thread name, generation, ms)
        self.collections: list[tuple[float, str, int, float]] = []
        self._made = time.perf_counter()
        gc.callbacks.append(self._on_gc)
        self._samples: collections.deque = collections.deque(maxlen=8192)
        if stacks:
            threading.Thread(target=self._sample_stacks, name="stack-sampler", daemon=True).start()
        self._clock = QElapsedTimer()
        self._timer = QTimer(self, interval=TICK_MS)
        self._timer.timeout.connect(self._tick)

    @property
    def max_own_ms(self) -> float:
        return max((s.own_ms for s in self.stalls), default=0.0)

    def start(self) -> None:
        self._clock.start()
        self._last, self._last_steal = thread_schedstats(), steal_ms()
        self._last_sleeps = voluntary_switches(self._gui_tid)
        self._gc_ms = self._other_gc_ms = 0.0  # a collection while stopped is no part of a stall
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    pause = stop  # e.g. while the driver itself builds a new window

    def resume(self) -> None:
        self.start()

    def _tick(self) -> None:
        late = self._clock.nsecsElapsed() / 1e6 - TICK_MS
        self._clock.restart()
        now, steal, sleeps = thread_schedstats(), steal_ms(), voluntary_switches(self._gui_tid)
        before, self._last = self._last, now
        slept, self._last_sleeps = sleeps - self._last_sleeps, sleeps
        stolen, self._last_steal = steal - self._last_steal, steal
        gc_ms, self._gc_ms = self._gc_ms, 0.0
        other_gc_ms, self._other_gc_ms = self._other_gc_ms, 0.0
        self.ticks += 1
        if late > self.max_ms:
            self.max_ms, self.max_label = late, self.label
        if late <= NOTE_MS:
            return
        delta = {tid: ((now[tid][0] - before[tid][0]) / 1e6, (now[tid][1] - before[tid][1]) / 1e6)
                 for tid in now if tid in before}
        gui_cpu, gui_wait = delta.get(self._gui_tid, (0.0, 0.0))
        other_wait = max((wait for tid, (_, wait) in delta.items() if tid != self._gui_tid), default=0.0)
        names = thread_names()
        others = sorted(((names.get(tid, tid), cpu, wait) for tid, (cpu, wait) in delta.items()
                         if tid != self._gui_tid and cpu + wait >= 1.0), key=lambda t: -t[1] - t[2])
        self.stalls.append(Stall(late, self.label, gui_cpu, gui_wait, other_wait, stolen, gc_ms,
                                 self._stacks_since(late), [(n, round(c, 1), round(w, 1)) for n, c, w in others],
                                 slept, other_gc_ms, time.monotonic()))

    def _on_gc(self, phase: str, info: dict) -> None:
        ident, now = threading.get_ident(), time.perf_counter()
        if phase == "start":
            self._gc_starts[ident] = now
            return
        ms = 1000 * (now - self._gc_starts.pop(ident, now))
        if ident == self._gui_thread:
            self._gc_ms += ms
        else:
            self._other_gc_ms += ms
        if ms >= 1.0:
            known = threading._active.get(ident)  # (current_thread() would make a stand-in for a QThread)
            name = "GUI" if ident == self._gui_thread else known.name if known else str(threading.get_native_id())
            self.collections.append((round(now - self._made, 2), name, info.get("generation", -1), round(ms, 1)))

    def _sample_stacks(self) -> None:
        me = threading.get_ident()
        while True:
            for ident, frame in sys._current_frames().items():
                if ident != me:
                    try:
                        stack = traceback.extract_stack(frame, limit=10)
                    except Exception:  # a frame that changed while it was read (CPython 3.11): skip it
                        continue
                    where = "GUI: " if ident == self._gui_thread else "other: "
                    self._samples.append((time.perf_counter(), where + " <- ".join(
                        f"{s.filename.rsplit('/', 1)[-1]}:{s.lineno} {s.name}" for s in reversed(stack[-6:]))))
            frame = None
            time.sleep(0.002)

    def _stacks_since(self, late_ms: float) -> list[str]:
        start = time.perf_counter() - late_ms / 1000 - TICK_MS / 1000
        seen = collections.Counter(stack for t, stack in list(self._samples) if t > start)
        return [f"{n}x {stack}" for stack, n in seen.most_common(6)]
