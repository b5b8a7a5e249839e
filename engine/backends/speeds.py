"""Measured training speeds per (backend, preset, batch): the table shipped
with the engine, and the user's own `microgpt-gui bench` measurements, which
bench records in the user's data folder. engine.backends.choice picks the
fastest available backend from them ("auto").

The shipped figures are SHIPPED below: one SpeedTable per bench run (its date,
machine and command) holding the rows of it still current, one per measured
configuration (where two tables held the same (backend, preset, batch), the
later would win). To update them after a kernel change, run the command on a
quiet machine with `--json FILE`, then `python -m engine.backends.speeds FILE
[FILE...]` prints the rows to paste here as a new table (date, machine and
command to match); delete the rows it replaces, and a table left empty.
docs/backends.md ("The automatic choice") says how the choice reads them.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..data.corpus import user_data_dir
from ..futhark.lock import FileLock

SHIPPED_SOURCE = "shipped"
BENCH_SOURCE = "bench"
RECORDS_FILE = "speeds.json"  # in user_data_dir()
RECORDS_FORMAT = 1
MAX_RECORDS = 500  # the newest are kept: one per (backend, preset, batch, machine)


@dataclass(frozen=True)
class Speed:
    """One configuration's measured training speed."""
    backend: str
    preset: str
    params: int       # the model's parameters on the dataset measured (names.txt: vocabulary 27)
    batch: int        # documents per step
    ms_per_step: float
    date: str         # when it was measured, ISO 8601 ("2026-12-02", or with a time)
    source: str       # SHIPPED_SOURCE or BENCH_SOURCE
    load: float | None = None  # the 1-minute load average while it ran, where known
    machine: str = ""  # "Intel(R) Xeon(R) Processor, 2 cores"

    @property
    def names_per_s(self) -> float:
        return 1000.0 * self.batch / self.ms_per_step


@dataclass(frozen=True)
class SpeedTable:
    """One bench run's figures."""
    date: str
    machine: str
    command: str
    rows: tuple[tuple[str, str, int, int, float], ...]  # (backend, preset, params, batch, ms/step)

    def speeds(self) -> list[Speed]:
        return [Speed(backend, preset, params, batch, ms, self.date, SHIPPED_SOURCE, machine=self.machine)
                for backend, preset, params, batch, ms in self.rows]


# The rows still current, by the bench run that measured them, each
# configuration's fastest round (table_rows). When a run measures a
# configuration again, its row replaces the earlier one here, and a run left
# with no rows goes; docs/performance.md keeps every run's figures ("The
# automatic choice's table" and the sections it links). The first table: one
# name per step and gpt2-small, on a shared Intel Xeon (load average 3.8 to
# 5.9) with the kernel from before issue 28's batched step (its batch-32 rows
# since replaced); the second: batch 32 at tiny and s32, on the kernel of
# 2026-12-03 (4 x 2 product tiles) on a Zen 2 machine; the third: batch 32
# at learn, s64, s128 and s256, on the kernel of 2026-12-03, 21:00.
SHIPPED: tuple[SpeedTable, ...] = (
    SpeedTable(
        date="2026-12-02",
        machine="Intel(R) Xeon(R) Processor, 2 cores, shared (load average 3.8-5.9)",
        command="microgpt-gui bench --backends numpy,futhark-c,futhark-multicore "
                "--presets learn,tiny,s32,s64,s128,s256 --batch 1,32 --sample-names 0 --rounds 2; "
                "the same with --presets gpt2-small --batch 1",
        rows=(
            ("numpy", "learn", 26_816, 1, 0.477),
            ("futhark-c", "learn", 26_816, 1, 0.4334),
            ("futhark-multicore", "learn", 26_816, 1, 0.4206),
            ("numpy", "tiny", 4_192, 1, 0.146),
            ("futhark-c", "tiny", 4_192, 1, 0.0581),
            ("futhark-multicore", "tiny", 4_192, 1, 0.0656),
            ("numpy", "s32", 27_328, 1, 0.3902),
            ("futhark-c", "s32", 27_328, 1, 0.2742),
            ("futhark-multicore", "s32", 27_328, 1, 0.2689),
            ("numpy", "s64", 155_008, 1, 1.644),
            ("futhark-c", "s64", 155_008, 1, 1.181),
            ("futhark-multicore", "s64", 155_008, 1, 0.9979),
            ("numpy", "s128", 809_728, 1, 9.856),
            ("futhark-c", "s128", 809_728, 1, 1.931),
            ("futhark-multicore", "s128", 809_728, 1, 1.999),
            ("numpy", "s256", 4_797_952, 1, 30.99),
            ("futhark-c", "s256", 4_797_952, 1, 12.13),
            ("futhark-multicore", "s256", 4_797_952, 1, 16.62),
            ("numpy", "gpt2-small", 85_762_560, 1, 1797.0),
            ("futhark-c", "gpt2-small", 85_762_560, 1, 224.0),
            ("futhark-multicore", "gpt2-small", 85_762_560, 1, 261.7),
        ),
    ),
    SpeedTable(
        date="2026-12-03",
        machine="AMD EPYC (Zen 2, AVX2), 2 cores, shared (load average 1.0-1.4)",
        command="microgpt-gui bench --backends numpy,torch,futhark-c,futhark-multicore "
                "--presets learn,tiny,s32,s64,s128,s256 --batch 32 --sample-names 0 --rounds 2",
        rows=(
            ("numpy", "tiny", 4_192, 32, 1.087),
            ("futhark-c", "tiny", 4_192, 32, 1.161),
            ("futhark-multicore", "tiny", 4_192, 32, 1.238),
            ("numpy", "s32", 27_328, 32, 2.658),
            ("futhark-c", "s32", 27_328, 32, 3.849),
            ("futhark-multicore", "s32", 27_328, 32, 3.88),
        ),
    ),
    # Products by tasks in the multicore program (2026-12-03, 21:00): the
    # first of that section's two bench runs.
    SpeedTable(
        date="2026-12-03",
        machine="AMD EPYC (Zen 2, AVX2), 2 cores, shared (load average 1.3-1.6)",
        command="microgpt-gui bench --backends numpy,torch,futhark-c,futhark-multicore "
                "--presets learn,s64,s128,s256 --batch 32 --sample-names 0 --rounds 2",
        rows=(
            ("numpy", "learn", 26_816, 32, 2.49),
            ("futhark-c", "learn", 26_816, 32, 2.33),
            ("futhark-multicore", "learn", 26_816, 32, 2.345),
            ("numpy", "s64", 155_008, 32, 7.184),
            ("futhark-c", "s64", 155_008, 32, 8.649),
            ("futhark-multicore", "s64", 155_008, 32, 5.421),
            ("numpy", "s128", 809_728, 32, 26.23),
            ("futhark-c", "s128", 809_728, 32, 36.79),
            ("futhark-multicore", "s128", 809_728, 32, 21.23),
            ("numpy", "s256", 4_797_952, 32, 89.73),
            ("futhark-c", "s256", 4_797_952, 32, 206.5),
            ("futhark-multicore", "s256", 4_797_952, 32, 106.8),
        ),
    ),
)


def shipped_speeds() -> list[Speed]:
    """Every shipped figure, the later table's where two measured the same configuration."""
    newest: dict[tuple[str, str, int], Speed] = {}
    for table in SHIPPED:
        for speed in table.speeds():
            newest[(speed.backend, speed.preset, speed.batch)] = speed
    return list(newest.values())


# the user's measurements ------------------------------------------------------

def records_path() -> Path:
    return user_data_dir() / RECORDS_FILE


def this_machine() -> str:
    """What identifies this machine's figures: the CPU model and the core count (a home
    folder shared between machines keeps each machine's measurements apart)."""
    from ..bench.report import cpu_model  # reads /proc/cpuinfo; nothing heavy

    return f"{cpu_model()}, {os.cpu_count()} cores"


def _read_records(path: Path) -> list[dict]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or damaged: no measurements (the next bench rewrites it)
        return []
    records = doc.get("records") if isinstance(doc, dict) else None
    return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []


def _speed(record: dict) -> Speed | None:
    try:
        speed = Speed(str(record["backend"]), str(record["preset"]), int(record["params"]), int(record["batch"]),
                      float(record["ms_per_step"]), str(record["date"]), BENCH_SOURCE,
                      None if record.get("load") is None else float(record["load"]), str(record["machine"]))
    except (KeyError, TypeError, ValueError):
        return None
    return speed if speed.ms_per_step > 0 and speed.batch >= 1 and speed.params >= 1 else None


def measured_speeds(path: Path | None = None, machine: str | None = None) -> list[Speed]:
    """This machine's bench measurements, the newest for each (backend, preset, batch)."""
    machine = this_machine() if machine is None else machine
    newest: dict[tuple[str, str, int], Speed] = {}
    for record in _read_records(path or records_path()):
        speed = _speed(record)
        if speed is None or speed.machine != machine:
            continue
        key = (speed.backend, speed.preset, speed.batch)
        if key not in newest or speed.date >= newest[key].date:
            newest[key] = speed
    return list(newest.values())


def all_speeds(path: Path | None = None, machine: str | None = None) -> list[Speed]:
    """The shipped table, with this machine's own measurement in place of a shipped row
    wherever bench measured the same (backend, preset, batch)."""
    mine = measured_speeds(path, machine)
    measured = {(s.backend, s.preset, s.batch) for s in mine}
    return [s for s in shipped_speeds() if (s.backend, s.preset, s.batch) not in measured] + mine


def record_bench(results, command: list[str], path: Path | None = None, machine: str | None = None,
                 now: datetime.datetime | None = None) -> int:
    """Add bench's timed rows (engine.bench.timing.BenchResult, status "ok") to the
    user's measurements, replacing older ones of the same (backend, preset, batch) on
    this machine; returns how many were recorded. Under a file lock, written whole
    and renamed into place: two bench runs at once never leave a damaged file."""
    machine = this_machine() if machine is None else machine
    when = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    new = [{"backend": r.backend, "preset": r.preset, "params": r.params, "batch": r.batch,
            "ms_per_step": round(r.ms_per_step, 6), "date": when, "load": r.load_avg, "machine": machine,
            "command": " ".join(command)}
           for r in results if r.status == "ok" and r.ms_per_step > 0 and r.target_loss is None]
    if not new:
        return 0
    path = path or records_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(path.with_name(f".{path.name}.lock")):
        replaced = {(r["backend"], r["preset"], r["batch"], machine) for r in new}
        kept = [r for r in _read_records(path)
                if (r.get("backend"), r.get("preset"), r.get("batch"), r.get("machine")) not in replaced]
        records = (kept + new)[-MAX_RECORDS:]
        scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        scratch.write_text(json.dumps({"format": RECORDS_FORMAT, "records": records}, indent=1) + "\n",
                           encoding="utf-8")
        os.replace(scratch, path)
    return len(new)


# updating SHIPPED ---------------------------------------------------------------

def table_rows(bench_json: list[Path]) -> list[str]:
    """SHIPPED's rows, as Python text, from `bench --json` files: each configuration's
    fastest round (`--rounds N`), the one other work on a shared machine disturbed least."""
    rows = []
    for path in bench_json:
        for r in json.loads(Path(path).read_text(encoding="utf-8"))["results"]:
            if r["status"] == "ok" and r.get("target_loss") is None:
                ms = float(f"{min(r.get('runs_ms') or [r['ms_per_step']]):.4g}")
                rows.append(f'        ("{r["backend"]}", "{r["preset"]}", {r["params"]:_}, {r["batch"]}, {ms!r}),')
    return rows


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m engine.backends.speeds BENCH.json [BENCH.json ...]")
    print("\n".join(table_rows([Path(p) for p in sys.argv[1:]])))
