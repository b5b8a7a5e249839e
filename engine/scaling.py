"""The scaling study: ms per step against parameter count, one (backend,
preset) at a time, measured by `microgpt-gui bench`'s own code (engine.bench).

A measure function has the narrow signature

    measure(backend, preset, seconds, cancel) -> engine.bench.BenchResult

(params, ms_per_step, status, reason ...), and raises engine.Cancelled when
cancel() turns true. `isolated_measure(data)` makes one from
engine.bench.run_isolated, which runs the configuration in a fresh process.
"""
from __future__ import annotations

import csv
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import bench
from .bench import BenchResult
from .errors import Cancelled

MeasureFn = Callable[[str, str, float, Callable[[], bool]], BenchResult]
CSV_COLUMNS = ("backend", "preset", "params", "ms_per_step", "steps_per_s", "status", "reason")
POLL_S = 0.05


def isolated_measure(data: str | Path) -> MeasureFn:
    """A measure function over engine.bench.run_isolated on the dataset `data`.

    run_isolated picks bench's automatic lengths (about AUTO_WARMUP_S + AUTO_MEASURE_S
    of steps), so `seconds` is not used here. It cannot be interrupted: on cancel this
    returns at once (raising Cancelled) and the child process finishes its few
    seconds on its own, its result dropped.
    """
    def measure(backend: str, preset: str, seconds: float, cancel: Callable[[], bool]) -> BenchResult:
        box: dict = {}
        done = threading.Event()

        def run() -> None:
            try:
                box["result"] = bench.run_isolated(backend, preset, Path(data), None, None)
            except Exception as exc:  # reported as the row's error
                box["result"] = BenchResult(backend, preset, "error", reason=f"{type(exc).__name__}: {exc}")
            done.set()

        threading.Thread(target=run, name=f"bench-{backend}-{preset}", daemon=True).start()
        while not done.wait(POLL_S):
            if cancel():
                raise Cancelled(f"measuring {backend} {preset} was cancelled")
        return box["result"]

    return measure


@dataclass(frozen=True)
class Plan:
    """What a study will do: rows to report at once (backends that cannot run
    here, one per preset, with the reason) and the (backend, preset) jobs."""

    skipped: list[BenchResult]
    jobs: list[tuple[str, str]]


def plan(backends: list[str], presets: list[str],
         availability: Callable[[list[str]], dict[str, tuple[bool, str]]] = bench.availability) -> Plan:
    """Backends take turns on each preset (as `bench` does), so the lines grow together."""
    status = availability(list(backends))
    skipped = [BenchResult(b, p, "skipped", reason=status[b][1]) for b in backends if not status[b][0]
               for p in presets]
    jobs = [(b, p) for p in presets for b in backends if status[b][0]]
    return Plan(skipped, jobs)


def write_csv(path: str | Path, results: list[BenchResult]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        for r in results:
            writer.writerow([r.backend, r.preset, r.params or "", f"{r.ms_per_step:.6g}" if r.status == "ok" else "",
                             f"{r.steps_per_s:.6g}" if r.status == "ok" else "", r.status, r.reason])
