"""What a sweep's runner reports, one JSON object per line, and the table of
trials built from those lines. Qt-free and Ray-free: the command line and the
window read the same lines (from the runner's stdout, or its events.jsonl),
and the runner keeps the same table on disk (results.json).

    {"event": "sweep", "name": ..., "dir": ..., "address": ..., "cpus": ..., "resumed": false}
    (every event also has "time": seconds since the runner started)
    {"event": "trial_started", "trial": "a1b2c_00000", "settings": {...}}
    {"event": "trial_result", "trial": ..., "step": ..., "num_steps": ..., "names_seen": ...,
     "train_seconds": ..., "eval_seconds": ..., "wall_seconds": ..., "first_step": ...,
     "losses": [...], "block": 1,
     "heldout": [[step, loss], ...], "heldout_loss": ..., "node": ..., "checkpoint": path or null}
    {"event": "trial_ended", "trial": ..., "status": "done", "message": "", "checkpoint": path or null}
    {"event": "sweep_ended", "status": "done", "message": "", "seconds": ...}
    {"event": "error", "message": ...}   (the sweep cannot go on; sweep_ended follows)

A trial's `losses` are its chunk's training losses as block means of `block`
steps each (a long chunk is cut to at most MAX_LOSS_POINTS points).
"""
from __future__ import annotations

import enum
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

MAX_LOSS_POINTS = 256  # a trial_result's losses: at most this many block means
EVENTS_FILE = "events.jsonl"
RESULTS_FILE = "results.json"
SPEC_FILE = "sweep.toml"


class TrialStatus(str, enum.Enum):
    RUNNING = "running"
    DONE = "done"                    # trained all its steps
    STOPPED_EARLY = "stopped early"  # cut by ASHA
    STOPPED = "stopped"              # by the user, the time budget or the sweep's end
    DIVERGED = "diverged"            # its loss became NaN or inf
    FAILED = "failed"                # an error (the message says which)

    @property
    def ended(self) -> bool:
        return self != TrialStatus.RUNNING


class SweepStatus(str, enum.Enum):
    RUNNING = "running"
    DONE = "done"
    STOPPED = "stopped"
    FAILED = "failed"


def to_line(event: dict) -> str:
    """One event as a JSON line: NaN and infinities as null (JSON has neither)."""
    return json.dumps(_finite(event), separators=(",", ":")) + "\n"


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def parse_line(line: str) -> dict | None:
    """The event on a line, or None for anything else (a library's stray output)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("event"), str) else None


def block_means(losses, max_points: int = MAX_LOSS_POINTS) -> tuple[list[float], int]:
    """(means of consecutive blocks of `block` losses, block): at most max_points means;
    the last block may be shorter."""
    n = len(losses)
    block = max(1, math.ceil(n / max_points))
    means = [float(sum(losses[i:i + block]) / len(losses[i:i + block])) for i in range(0, n, block)]
    return means, block


# ---- the table of trials --------------------------------------------------------------

@dataclass
class TrialRecord:
    """One trial as the events tell it: settings, progress, curves, status."""

    trial: str
    settings: dict
    status: TrialStatus = TrialStatus.RUNNING
    step: int = 0
    num_steps: int = 0
    names_seen: int = 0
    train_seconds: float = 0.0
    message: str = ""
    checkpoint: str | None = None
    node: str = ""                               # the Ray node it ran on
    losses: list = field(default_factory=list)   # (last step of the block, mean loss), by step
    heldout: list = field(default_factory=list)  # (step, loss), by step

    @property
    def best_heldout(self) -> float:
        return min((loss for _, loss in self.heldout if loss is not None), default=math.nan)

    @property
    def final_heldout(self) -> float:
        return self.heldout[-1][1] if self.heldout and self.heldout[-1][1] is not None else math.nan

    @property
    def names_per_second(self) -> float:
        return self.names_seen / self.train_seconds if self.train_seconds > 0 else math.nan

    def add_result(self, event: dict) -> None:
        first, block = int(event.get("first_step", self.step)), int(event.get("block", 1))
        # a resumed trial goes on from its checkpoint: what it had after that step is replaced
        while self.losses and self.losses[-1][0] > first:
            self.losses.pop()
        while self.heldout and self.heldout[-1][0] > first:
            self.heldout.pop()
        for i, loss in enumerate(event.get("losses") or ()):
            end = min(first + (i + 1) * block, int(event.get("step", first)))
            self.losses.append((end, math.nan if loss is None else float(loss)))
        for step, loss in event.get("heldout") or ():
            while self.heldout and self.heldout[-1][0] >= step:
                self.heldout.pop()
            self.heldout.append((int(step), loss))
        for key in ("step", "num_steps", "names_seen"):
            if key in event:
                setattr(self, key, int(event[key]))
        if event.get("train_seconds") is not None:
            self.train_seconds = float(event["train_seconds"])
        if event.get("checkpoint"):
            self.checkpoint = event["checkpoint"]
        self.node = event.get("node") or self.node
        self.status = TrialStatus.RUNNING

    def summary(self) -> dict:
        """What --json and results.json keep of a trial (no curves)."""
        return {"trial": self.trial, "settings": self.settings, "status": self.status.value,
                "best_heldout": _none_if_nan(self.best_heldout), "final_heldout": _none_if_nan(self.final_heldout),
                "steps": self.step, "num_steps": self.num_steps, "names_seen": self.names_seen,
                "train_seconds": self.train_seconds, "names_per_s": _none_if_nan(self.names_per_second),
                "checkpoint": self.checkpoint, "node": self.node, "message": self.message}


def _none_if_nan(value: float):
    return None if value is None or not math.isfinite(value) else value


class SweepTable:
    """Every trial of a sweep, kept up to date by apply(event), in the order they started."""

    def __init__(self) -> None:
        self.trials: dict[str, TrialRecord] = {}
        self.status = SweepStatus.RUNNING
        self.message = ""
        self.info: dict = {}  # the "sweep" event: name, dir, address, cpus

    def apply(self, event: dict) -> TrialRecord | None:
        """Fold one event in; the trial it changed, if any."""
        kind, trial_id = event.get("event"), event.get("trial")
        if kind == "sweep":
            self.info = dict(event)
            self.status = SweepStatus.RUNNING
            return None
        if kind == "sweep_ended":
            self.status = SweepStatus(event.get("status", "done"))
            self.message = event.get("message") or self.message
            return None
        if kind == "error":
            self.message = event.get("message", "")
            return None
        if trial_id is None:
            return None
        record = self.trials.get(trial_id)
        if record is None:
            record = self.trials[trial_id] = TrialRecord(trial_id, dict(event.get("settings") or {}))
        if kind == "trial_started":
            record.settings = dict(event.get("settings") or record.settings)
            record.status = TrialStatus.RUNNING
        elif kind == "trial_result":
            record.add_result(event)
        elif kind == "trial_ended":
            record.status = TrialStatus(event.get("status", "done"))
            record.message = event.get("message") or ""
            if event.get("checkpoint"):
                record.checkpoint = event["checkpoint"]
        return record

    def best(self) -> TrialRecord | None:
        scored = [t for t in self.trials.values() if math.isfinite(t.best_heldout)]
        return min(scored, key=lambda t: t.best_heldout, default=None)

    def summaries(self) -> list[dict]:
        return [t.summary() for t in self.trials.values()]


def read_events(path: str | Path) -> list[dict]:
    """The events in a sweep's events.jsonl (a line cut short by a crash is skipped)."""
    events = []
    with open(path, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            event = parse_line(line)
            if event is not None:
                events.append(event)
    return events


def write_json_atomic(path: str | Path, data) -> None:
    """data as JSON at path, through a temporary file renamed over it (a crash leaves the old file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(_finite(data), out, indent=1)
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
