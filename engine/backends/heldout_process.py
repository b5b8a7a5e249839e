"""The NumPy backend's held-out evaluation, in a child process of its own.

A forward pass over the held-out documents is some fifty NumPy calls, each
letting go of the GIL and taking it back. While another Python thread of this
process keeps the GIL busy (a window with work to do, a test polling in a
tight loop), taking it back waits up to the switch interval each time, so an
evaluation stretched many times over (docs/loop-latency.md, scripts/loop_latency.py).
The child has a GIL of its own; this process only waits for its answer.

One child serves every NumPy backend of this process (`shared()`), one
evaluation at a time. A backend's Session sends its held-out batches once and
writes its parameters, before each evaluation, into a file both processes
map; the child computes exactly what NumpyBackend._doc_losses computes, so the
losses are the same to the last bit. A cancelled evaluation returns at once
(the child stops after its batch, and the next evaluation waits for that).
Whatever goes wrong with the child (it cannot start, it died, it failed)
raises Unavailable, and the backend evaluates in its own process as before.

The child: `python -m engine.backends.heldout_process`, messages framed by
their length on its stdin and stdout.
"""
from __future__ import annotations

import atexit
import itertools
import os
import pickle
import queue
import struct
import subprocess
import sys
import tempfile
import threading
import weakref
from pathlib import Path

import numpy as np

from ..errors import Cancelled

POLL_S = 0.005  # how often a waiting evaluation asks its cancel()
HEADER = 64     # bytes before the parameters in the shared file: [0] is the cancel flag
_FRAME = struct.Struct("<Q")


class Unavailable(Exception):
    """The child cannot evaluate (not started, gone, or it failed): evaluate here instead."""


def _write(stream, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_FRAME.pack(len(data)) + data)
    stream.flush()


def _read(stream):
    """The next message, or None at the end of the stream."""
    head = stream.read(_FRAME.size)
    if len(head) < _FRAME.size:
        return None
    size = _FRAME.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


def _reserved_file(size: int) -> str:
    """A new file of size bytes for the parameters, in memory-backed /dev/shm where
    there is room, else in the temporary folder. Its space is reserved first where
    the system can (posix_fallocate): writing a mapped page of a file system that is
    full kills the process (SIGBUS), so a full one must fail here, with OSError."""
    shm = Path("/dev/shm")
    folders = [str(shm)] if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else []
    error = None
    for folder in [*folders, None]:
        fd, path = tempfile.mkstemp(prefix="microgpt-heldout-", suffix=".f32", dir=folder)
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size)
            else:
                os.ftruncate(fd, size)
            return path
        except OSError as exc:  # no room there (a container's small /dev/shm)
            error = exc
            os.unlink(path)
        finally:
            os.close(fd)
    raise error


# this process's side -------------------------------------------------------------------

class HeldoutProcess:
    """The child process and its replies (read by a thread of their own into a queue)."""

    def __init__(self):
        root = str(Path(__file__).resolve().parents[2])  # the child imports this very engine
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        self._proc = subprocess.Popen([sys.executable, "-m", "engine.backends.heldout_process"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, env=env)
        self.pid = os.getpid()  # the process it serves
        self._replies: queue.Queue = queue.Queue()
        self._lock = threading.Lock()  # one request at a time
        self._owed = 0  # replies to requests given up on (cancelled): read before the next one
        self._closing: list[int] = []  # sessions ended: sent before the next request
        self._alive = True
        threading.Thread(target=self._read_replies, name="heldout-replies", daemon=True).start()

    @property
    def alive(self) -> bool:
        return self._alive and self._proc.poll() is None

    def _read_replies(self) -> None:
        try:
            while (message := _read(self._proc.stdout)) is not None:
                self._replies.put(message)
        except (OSError, ValueError, pickle.UnpicklingError):
            pass
        self._alive = False
        self._replies.put(None)  # wakes a waiting evaluation: the child is gone

    def send(self, message) -> None:
        try:
            _write(self._proc.stdin, message)
        except (OSError, ValueError) as exc:  # a closed pipe: the child is gone
            self._alive = False
            raise Unavailable(f"the held-out process is gone: {exc}") from None

    def request(self, prepare, message, cancel, on_cancel) -> tuple:
        """prepare(), send message, and return the child's reply; cancel() is asked
        every POLL_S while waiting: True calls on_cancel() and raises Cancelled at once
        (the reply is read before the next request's)."""
        while not self._lock.acquire(timeout=POLL_S):
            _check(cancel)
        try:
            while self._owed:  # replies to cancelled requests come first
                self._reply(cancel, None)
                self._owed -= 1
            while self._closing:
                self.send(("close", self._closing.pop()))
            _check(cancel)  # a cancel already due: no evaluation starts
            prepare()
            self.send(message)
            return self._reply(cancel, on_cancel)
        finally:
            self._lock.release()

    def forget(self, key: int) -> None:
        """A session ended: the child drops it with the next request (never waits:
        this runs in finalizers, in any thread)."""
        self._closing.append(key)

    def _reply(self, cancel, on_cancel) -> tuple:
        while True:
            if not self.alive and self._replies.empty():
                raise Unavailable("the held-out process is gone")
            try:
                reply = self._replies.get(timeout=POLL_S)
            except queue.Empty:
                if cancel is not None and cancel():
                    if on_cancel is not None:
                        on_cancel()
                        self._owed += 1  # its reply comes later
                    raise Cancelled("the held-out evaluation was cancelled")
                continue
            if reply is None:
                raise Unavailable("the held-out process is gone")
            return reply

    def close(self) -> None:
        """End the child (its stdin closes: it returns) and wait for it briefly."""
        self._alive = False
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _check(cancel) -> None:
    if cancel is not None and cancel():
        raise Cancelled("the held-out evaluation was cancelled")


_shared: HeldoutProcess | None = None
_shared_lock = threading.Lock()
_ids = itertools.count(1)


def shared() -> HeldoutProcess:
    """This process's child, started on first use; Unavailable where it cannot run
    or has died (it is not started again: evaluations stay in this process)."""
    global _shared
    with _shared_lock:
        if _shared is not None and _shared.pid != os.getpid():  # a forked copy of this process
            _shared = None  # the child's pipes are the parent's: this process needs its own
        if _shared is None:
            if not sys.executable:
                raise Unavailable("no Python executable to start a held-out process with")
            try:
                _shared = HeldoutProcess()
            except OSError as exc:
                raise Unavailable(f"cannot start the held-out process: {exc}") from None
            atexit.register(_shared.close)
        if not _shared.alive:
            raise Unavailable("the held-out process is gone")
        return _shared


class Session:
    """One backend's held-out evaluations in the child: its batches (sent with the
    first evaluation) and the file its parameters are written into."""

    def __init__(self, model, vocab_size: int, num_params: int, small_products: bool, batches: list):
        self.key = next(_ids)
        self.positions = [batch.positions for batch in batches]
        self.path = _reserved_file(HEADER + 4 * num_params)
        self._header = np.memmap(self.path, dtype=np.uint8, mode="r+", shape=(HEADER,))
        self._params = np.memmap(self.path, dtype=np.float32, mode="r+", offset=HEADER, shape=(num_params,))
        self._opening = ("open", self.key, model, vocab_size, self.path, num_params, small_products,
                         [(np.asarray(b.tokens), np.asarray(b.lengths)) for b in batches])
        self._process: HeldoutProcess | None = None
        self._finalizer = weakref.finalize(self, _forget, self.key, self.path, None)

    def doc_losses(self, params: np.ndarray, cancel) -> list:
        """Each batch's document losses at params, computed by the child (Unavailable:
        evaluate here instead)."""
        process = shared()

        def prepare():  # the child is idle now: nothing reads the file
            if self._opening is not None:  # the first evaluation: the child learns the batches
                process.send(self._opening)
                self._opening = None
            self._params[...] = params
            self._header[0] = 0

        def cancelled():
            self._header[0] = 1  # the child stops after its batch

        if self._process is None:
            self._process = process
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _forget, self.key, self.path, process)
        reply = process.request(prepare, ("evaluate", self.key), cancel, cancelled)
        if os.name == "posix" and os.path.exists(self.path):
            os.unlink(self.path)  # both processes have it mapped: nothing to leave behind
        if reply[0] == "done":
            return reply[1]
        if reply[0] == "cancelled":
            raise Cancelled("the held-out evaluation was cancelled")
        if reply[0] == "memory":
            raise MemoryError(reply[1])
        raise Unavailable(f"the held-out process failed: {reply[1]}")

    def close(self) -> None:
        self._header = self._params = None  # unmapped first: Windows deletes no file still mapped
        self._finalizer()


def _forget(key: int, path: str, process: HeldoutProcess | None) -> None:
    """A session's end: the child drops its batches; the file goes."""
    if process is not None:
        process.forget(key)
    try:
        os.unlink(path)
    except OSError:
        pass


# the child ----------------------------------------------------------------------------

class _ChildSession:
    def __init__(self, model, vocab_size, path, num_params, small_products, batches):
        from ..model.gpt import Weights
        from ..params import param_specs

        self.header = np.memmap(path, dtype=np.uint8, mode="r", shape=(HEADER,))
        flat = np.memmap(path, dtype=np.float32, mode="r", offset=HEADER, shape=(num_params,))
        self.weights = Weights(flat, param_specs(model, vocab_size), model)
        self.model, self.small_products, self.batches = model, small_products, batches

    def evaluate(self) -> list | None:
        """Each batch's document losses as NumpyBackend._doc_losses computes them; None
        when the parent cancelled."""
        from ..model.gpt import doc_losses
        from .blas import one_blas_thread

        sums = []
        for tokens, lengths in self.batches:
            if self.header[0]:
                return None
            with np.errstate(over="ignore", invalid="ignore"), one_blas_thread(self.small_products):
                batch_sums = doc_losses(self.weights, tokens[:, :-1], tokens[:, 1:], lengths, self.model, np)
            sums.append(np.array(batch_sums, dtype=np.float32, copy=True))
        return sums


def serve(inp, out) -> None:
    sessions: dict[int, _ChildSession] = {}
    while (message := _read(inp)) is not None:
        kind, key = message[0], message[1]
        if kind == "open":
            sessions[key] = _ChildSession(*message[2:])
        elif kind == "close":
            sessions.pop(key, None)
        elif kind == "evaluate":
            try:
                sums = sessions[key].evaluate()
                reply = ("cancelled",) if sums is None else ("done", sums)
            except MemoryError as exc:
                reply = ("memory", str(exc) or "out of memory")
            except Exception as exc:  # the parent evaluates itself then, and reports what it finds
                reply = ("failed", f"{type(exc).__name__}: {exc}")
            _write(out, reply)


def main() -> None:
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print must not corrupt a reply
    serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    main()
