"""An exclusive lock on a file, across processes: two processes building the
same library wait for each other instead of corrupting the cache."""
from __future__ import annotations

import sys
import time
from pathlib import Path


class FileLock:
    """An exclusive lock on a file (flock, or msvcrt on Windows), across processes."""

    def __init__(self, path: Path, timeout: float | None = None, poll: float = 0.2):
        self.path, self.timeout, self.poll = Path(path), timeout, poll
        self._file = None

    def acquire(self) -> "FileLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+b")
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            try:
                _lock_nb(handle)
                self._file = handle
                return self
            except OSError:
                if deadline is not None and time.monotonic() >= deadline:
                    handle.close()
                    raise TimeoutError(f"{self.path} is locked by another process") from None
                time.sleep(self.poll)

    def release(self) -> None:
        if self._file is not None:
            _unlock(self._file)
            self._file.close()
            self._file = None

    def __enter__(self) -> "FileLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


if sys.platform == "win32":
    import msvcrt

    def _lock_nb(handle) -> None:
        handle.seek(0)
        msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)

    def _unlock(handle) -> None:
        handle.seek(0)
        msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
else:
    import fcntl

    def _lock_nb(handle) -> None:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock(handle) -> None:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
