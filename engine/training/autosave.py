"""Autosave, Qt-free: a checkpoint every N minutes of training into the data
directory, the newest few kept. The clock counts training time (pauses and a
stopped run do not count), so an idle window writes nothing.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

from ..data.corpus import user_data_dir

DEFAULT_KEEP = 3
PREFIX = "autosave-"
_NAME = re.compile(re.escape(PREFIX) + r".+\.npz")


def autosave_dir() -> Path:
    return user_data_dir() / "autosaves"


def autosave_path(folder: Path, run_name: str, step: int, now: float | None = None) -> Path:
    """folder/autosave-<run>-<time>-step<step>.npz (run_name made file-name safe)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", run_name).strip("_") or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    return Path(folder) / f"{PREFIX}{safe}-{stamp}-step{step}.npz"


def autosaves(folder: Path) -> list[Path]:
    """The autosaves in folder, newest first."""
    try:
        found = [Path(e.path) for e in os.scandir(folder) if _NAME.fullmatch(e.name) and e.is_file()]
    except OSError:
        return []
    return sorted(found, key=_mtime, reverse=True)


def prune_autosaves(folder: Path, keep: int = DEFAULT_KEEP) -> list[Path]:
    """Delete all but the newest `keep` autosaves in folder; return what went."""
    removed = []
    for path in autosaves(folder)[max(0, keep):]:
        try:
            path.unlink()
            removed.append(path)
        except OSError:  # gone meanwhile, or not ours to delete
            continue
    return removed


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


class AutosaveClock:
    """When the next autosave is due, in seconds of training (0 minutes: never)."""

    def __init__(self, minutes: float = 0.0):
        self.minutes = float(minutes)
        self._last = 0.0  # training seconds at the last autosave (or the run's start)

    @property
    def enabled(self) -> bool:
        return self.minutes > 0

    def restart(self, train_seconds: float = 0.0) -> None:
        """A new run, or a save: count from here."""
        self._last = train_seconds

    def due(self, train_seconds: float) -> bool:
        return self.enabled and train_seconds - self._last >= 60.0 * self.minutes
