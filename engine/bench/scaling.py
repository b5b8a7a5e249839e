"""The scaling study: ms per step against parameter count, one (backend,
preset) at a time, measured by `microgpt-gui bench`'s own code (engine.bench.measure).

A measure function has the narrow signature

    measure(backend, preset, seconds, cancel) -> engine.bench.measure.BenchResult

(params, ms_per_step, status, reason ...), and raises engine.Cancelled when
cancel() turns true. `isolated_measure(data)` makes one from
engine.bench.measure.run_isolated, which runs the configuration in a fresh process
(the code `microgpt-gui bench` runs) and kills it when cancelled.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import measure as bench
from .measure import BenchResult
from .report import is_busy

MeasureFn = Callable[[str, str, float, Callable[[], bool]], BenchResult]
CSV_COLUMNS = ("backend", "preset", "params", "ms_per_step", "steps_per_s", "status", "reason", "load_avg", "busy")


def isolated_measure(data: str | Path, sample_names: int = 0) -> MeasureFn:
    """A measure function over engine.bench.measure.run_isolated on the dataset `data`:
    the configuration runs in a fresh process for at least `seconds` of steps
    (bench's Budget), and cancel() kills that process within bench.POLL_S."""
    def measure(backend: str, preset: str, seconds: float, cancel: Callable[[], bool]) -> BenchResult:
        budget = bench.Budget(seconds=seconds, sample_names=sample_names)
        return bench.run_isolated(backend, preset, Path(data), budget, cancel)

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
            ok = r.status == "ok"
            writer.writerow([r.backend, r.preset, r.params or "", f"{r.ms_per_step:.6g}" if ok else "",
                             f"{r.steps_per_s:.6g}" if ok else "", r.status, r.reason,
                             "" if r.load_avg is None else f"{r.load_avg:.2f}", "busy" if is_busy(r) else ""])
