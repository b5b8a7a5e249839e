"""Building a Futhark backend's libraries ahead of their first use, in a child
process, while something else trains: the automatic choice (engine.backends.choice)
never makes a person wait tens of seconds for a build.

The child (`python -m engine.backends.prebuild TARGET...`) runs
engine.futhark.build.build for each, which builds under a file lock into a temporary
folder renamed into place when complete: a second process building or
opening the same library waits for it instead of corrupting the cache. The
child lives as long as the build: it outlives a parent that exits first (the
next run finds the library built), and runs in a session of its own, so a
Ctrl+C meant for the parent does not end it. Its outcome is written beside the
build's log; a failed build is remembered (last_failure) until the library is
built, so a backend whose build fails is not tried again on every start.
"""
from __future__ import annotations

import enum
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import ModelConfig, TrainConfig
from ..errors import BackendError
from ..futhark import build as futhark_build

TERMINATE_WAIT_S = 10.0  # cancel(): how long the child may take to clean up after SIGTERM


def futhark_class(backend: str):
    """The FutharkBackend subclass registered as `backend`, or None."""
    from .futhark_backend import FutharkBackend

    pending = [FutharkBackend]
    while pending:
        cls = pending.pop()
        if cls.name == backend and cls is not FutharkBackend:
            return cls
        pending.extend(cls.__subclasses__())
    return None


def library_targets(backend: str, model: ModelConfig, train: TrainConfig, vocab_size: int) -> tuple[str, ...]:
    """The Futhark builds whose libraries `backend` would open for this model and batch
    size, the training one first (futhark-multicore opens futhark-c's on one thread;
    batches also open the program for one document a step, for held-out losses and
    sampling), asked of the backend class itself without opening anything; none for
    a backend that builds nothing, and where the backend cannot say (a bad
    MICROGPT_FUTHARK_THREADS: opening it says so)."""
    cls = futhark_class(backend)
    if cls is None:
        return ()
    unopened = object.__new__(cls)  # library_targets reads only these two attributes
    unopened.num_params, unopened.train_config = model.num_params(vocab_size), train
    try:
        return unopened.library_targets()
    except BackendError:
        return ()


def library_dir(target: str) -> Path | None:
    """Where target's library is (or will be) in the build cache; None where it cannot be built."""
    try:
        return futhark_build.plan(target).libdir
    except BackendError:
        return None


def unbuilt_targets(backend: str, model: ModelConfig, train: TrainConfig, vocab_size: int) -> tuple[str, ...]:
    """The builds `backend` would open for this model that are not built yet (also
    those that cannot be built here: opening it says why)."""
    return tuple(t for t in library_targets(backend, model, train, vocab_size)
                 if (libdir := library_dir(t)) is None or not futhark_build.is_complete(libdir))


def is_built(backend: str, model: ModelConfig, train: TrainConfig, vocab_size: int) -> bool:
    """Whether opening `backend` now needs no build first (a NumPy or CuPy backend: always)."""
    return not unbuilt_targets(backend, model, train, vocab_size)


def build_estimate(*targets: str) -> str:
    """"about 20-40 s": how long a first build of target usually takes; of several,
    "2 libraries, about 20-40 s each"."""
    def one(target: str) -> str:
        try:
            return futhark_build.BUILD_ESTIMATES[futhark_build.plan(target).origin.kind]
        except BackendError:
            return futhark_build.BUILD_ESTIMATES["shipped"]

    estimates = list(dict.fromkeys(one(t) for t in targets))
    if len(targets) == 1:
        return estimates[0]
    return f"{len(targets)} libraries, " + (f"{estimates[0]} each" if len(estimates) == 1 else " and ".join(estimates))


def outcome_path(libdir: Path) -> Path:
    return futhark_build.log_path(libdir).with_name(f"{libdir.name}.background.json")


def child_log_path(libdir: Path) -> Path:
    """The child's own output (the build's is in futhark_build.log_path)."""
    return futhark_build.log_path(libdir).with_name(f"{libdir.name}.background.log")


def last_failure(target: str) -> str:
    """Why the last background build of target's library failed, while it is still
    not built ("" otherwise)."""
    libdir = library_dir(target)
    if libdir is None or futhark_build.is_complete(libdir):
        return ""
    try:
        outcome = json.loads(outcome_path(libdir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    return "" if outcome.get("ok", True) else str(outcome.get("message", "the build failed"))


class BuildPhase(enum.Enum):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class BuildOutcome:
    backend: str
    targets: tuple[str, ...]
    phase: BuildPhase  # DONE, FAILED or CANCELLED
    message: str       # "built futhark-c in 34 s", or why it failed
    seconds: float


class BackgroundBuild:
    """One backend's libraries being built by a child process, started at once, one
    after the other (a batch's training library, then the one for held-out losses
    and sampling).

    poll() is None while it runs, then the BuildOutcome; wait(timeout) blocks
    for it; on_done(outcome), if given, is called once from a watcher thread
    (a window hands it to its own thread). cancel() ends the child and its
    compiler; otherwise the child runs to the end of the builds, even after this
    process exits.
    """

    def __init__(self, backend: str, targets: tuple[str, ...], on_done: Callable[[BuildOutcome], None] | None = None):
        self.backend, self.targets = backend, tuple(targets)
        self.libdir = library_dir(self.targets[0])  # where the child's own log goes
        self.estimate = build_estimate(*self.targets)
        self.started = time.monotonic()
        self._outcome: BuildOutcome | None = None
        self._lock = threading.Lock()
        log = child_log_path(self.libdir) if self.libdir is not None else Path(os.devnull)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w", encoding="utf-8") as out:  # the child keeps its own handle
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "engine.backends.prebuild", *self.targets], stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, env=_child_env(), start_new_session=os.name == "posix")
        if on_done is not None:
            threading.Thread(target=lambda: on_done(self.wait()), name=f"prebuild-{backend}", daemon=True).start()

    @property
    def log(self) -> Path | None:
        """The first build's log (the compiler's output), where a person looks when it
        fails (a failed later build's message names its own)."""
        return None if self.libdir is None else futhark_build.log_path(self.libdir)

    def status_text(self) -> str:
        """"building futhark-c in the background (first use, about 20-40 s): 12 s so far"."""
        outcome = self.poll()
        if outcome is not None:
            return outcome.message
        return (f"building {self.backend} in the background (first use, {self.estimate}): "
                f"{time.monotonic() - self.started:.0f} s so far")

    def poll(self) -> BuildOutcome | None:
        with self._lock:
            if self._outcome is None and self._proc.poll() is not None:
                self._outcome = self._read_outcome()
            return self._outcome

    def wait(self, timeout: float | None = None) -> BuildOutcome | None:
        """The outcome, once the child ends; None if timeout seconds pass first."""
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.poll()

    def cancel(self) -> None:
        """End the child if it still runs (SIGTERM, so it removes its half-built folder)."""
        if self._proc.poll() is None:
            try:
                if os.name == "posix":
                    os.killpg(self._proc.pid, signal.SIGTERM)  # the compiler too (its own session)
                else:
                    self._proc.terminate()
                self._proc.wait(TERMINATE_WAIT_S)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                if os.name == "posix":
                    os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.kill()
                self._proc.wait()
        self.poll()

    def _read_outcome(self) -> BuildOutcome:
        seconds = time.monotonic() - self.started
        code = self._proc.returncode
        if code == EXIT_CANCELLED or code < 0:
            return BuildOutcome(self.backend, self.targets, BuildPhase.CANCELLED,
                                f"the build of {self.backend} was cancelled", seconds)
        failure = ""
        for target in self.targets:  # the child stops at the first that fails
            libdir = library_dir(target)
            try:
                outcome = json.loads(outcome_path(libdir).read_text(encoding="utf-8"))
            except (OSError, ValueError, TypeError):
                outcome = {"ok": False, "message": f"the background build of {self.backend} ended with exit "
                                                   f"status {code}; see {child_log_path(self.libdir) if self.libdir else 'its log'}"}
            if not outcome.get("ok", False):
                failure = str(outcome.get("message"))
                break
        ok = code == 0 and not failure
        message = f"built {self.backend} in {seconds:.0f} s" if ok else failure or f"exit status {code}"
        return BuildOutcome(self.backend, self.targets, BuildPhase.DONE if ok else BuildPhase.FAILED, message, seconds)


def start_build(backend: str, model: ModelConfig, train: TrainConfig, vocab_size: int,
                on_done: Callable[[BuildOutcome], None] | None = None) -> BackgroundBuild | None:
    """Build the libraries `backend` opens for this model in a child process; None when
    there is nothing to build (not a Futhark backend, already built, or it cannot
    be built here: opening it says why)."""
    targets = tuple(t for t in unbuilt_targets(backend, model, train, vocab_size) if library_dir(t) is not None)
    return BackgroundBuild(backend, targets, on_done) if targets else None


def _child_env() -> dict[str, str]:
    """The child imports this very engine package, installed or not."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


# the child ------------------------------------------------------------------

EXIT_CANCELLED = 143


def _cancelled(signum, frame):
    raise SystemExit(EXIT_CANCELLED)  # unwinds the build: its half-built folder is removed


def _child(targets: list[str]) -> int:
    signal.signal(signal.SIGTERM, _cancelled)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl+C meant for the parent (Windows has no sessions)
    futhark_build.add_build_listener(lambda event: print(event.message(), flush=True))
    for target in targets:
        if not _build_one(target):
            return 1
    return 0


def _build_one(target: str) -> bool:
    """Build target, writing its outcome beside its log; whether it was built."""
    libdir = library_dir(target)
    start = time.monotonic()
    try:
        futhark_build.build(target)
        outcome = {"ok": True, "message": "built"}
    except BackendError as exc:
        log = futhark_build.log_path(libdir) if libdir is not None else None
        message = str(exc) if log is None or str(log) in str(exc) else f"{exc} (log: {log})"
        outcome = {"ok": False, "message": message}
    outcome.update(seconds=round(time.monotonic() - start, 1), target=target,
                   date=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    if libdir is not None:
        path = outcome_path(libdir)
        scratch = path.with_name(f".{path.name}.{os.getpid()}")
        scratch.write_text(json.dumps(outcome) + "\n", encoding="utf-8")
        os.replace(scratch, path)
    print(outcome["message"], flush=True)
    return outcome["ok"]


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
