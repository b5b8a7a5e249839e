"""Measured training speeds per (backend, preset, batch): the table shipped
with the engine, and the user's own `microgpt-gui bench` measurements, which
bench records in the user's data folder. engine.backends.choice picks the
fastest available backend from them ("auto").

The shipped figures are SHIPPED below: one SpeedTable per bench run (its date,
machine and command), one row per measured configuration; where two runs
measured the same (backend, preset, batch), the later table wins. To update
them after a kernel change, run the command on a quiet machine with
`--json FILE`, then `python -m engine.backends.speeds FILE [FILE...]`
prints the rows to paste here; set date, machine and command to match.
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


# One table per bench run, side by side, each configuration's fastest round
# (table_rows); docs/performance.md, "The automatic choice's table", has the
# runs. The first two ran on a shared machine (load average 3.8 to 5.9 on its
# 2 cores), with the kernel from before issue 28's batched step; the last
# measured batch 32 again on the new kernel, on a quieter machine, and its
# rows replace theirs; the fourth, futhark-multicore where it now runs one
# thread (learn to s32 at batch 32); the fifth, batch 32 on the kernel of
# 2026-12-03 (4 x 2 product tiles), on a Zen 2 machine: its rows replace
# every earlier batch-32 row.
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
            ("numpy", "learn", 26_816, 32, 1.692),
            ("futhark-c", "learn", 26_816, 32, 5.456),
            ("futhark-multicore", "learn", 26_816, 32, 3.347),
            ("numpy", "tiny", 4_192, 32, 0.6026),
            ("futhark-c", "tiny", 4_192, 32, 1.589),
            ("futhark-multicore", "tiny", 4_192, 32, 1.885),
            ("numpy", "s32", 27_328, 32, 1.83),
            ("futhark-c", "s32", 27_328, 32, 6.312),
            ("futhark-multicore", "s32", 27_328, 32, 5.757),
            ("numpy", "s64", 155_008, 32, 5.667),
            ("futhark-c", "s64", 155_008, 32, 24.22),
            ("futhark-multicore", "s64", 155_008, 32, 23.53),
            ("numpy", "s128", 809_728, 32, 31.93),
            ("futhark-c", "s128", 809_728, 32, 89.88),
            ("futhark-multicore", "s128", 809_728, 32, 101.2),
            ("numpy", "s256", 4_797_952, 32, 551.7),
            ("futhark-c", "s256", 4_797_952, 32, 508.1),
            ("futhark-multicore", "s256", 4_797_952, 32, 471.0),
            ("numpy", "gpt2-small", 85_762_560, 1, 1797.0),
            ("futhark-c", "gpt2-small", 85_762_560, 1, 224.0),
            ("futhark-multicore", "gpt2-small", 85_762_560, 1, 261.7),
        ),
    ),
    SpeedTable(
        date="2026-12-02",
        machine="Intel(R) Xeon(R) Processor, 2 cores, shared (load average 4.3-4.7)",
        command="microgpt-gui bench --backends numpy,futhark-c,futhark-multicore --presets s256 --batch 32 "
                "--sample-names 0 --rounds 3",
        rows=(
            ("numpy", "s256", 4_797_952, 32, 114.6),
            ("futhark-c", "s256", 4_797_952, 32, 424.6),
            ("futhark-multicore", "s256", 4_797_952, 32, 456.7),
        ),
    ),
    SpeedTable(
        date="2026-12-02",
        machine="AMD EPYC, 2 cores, shared (load average 1.0-1.4)",
        command="microgpt-gui bench --backends numpy,torch,futhark-c,futhark-multicore "
                "--presets learn,tiny,s32,s64,s128,s256 --batch 32 --sample-names 0 --rounds 2",
        rows=(
            ("numpy", "learn", 26_816, 32, 1.988),
            ("futhark-c", "learn", 26_816, 32, 3.401),
            ("futhark-multicore", "learn", 26_816, 32, 4.871),
            ("numpy", "tiny", 4_192, 32, 0.828),
            ("futhark-c", "tiny", 4_192, 32, 0.9701),
            ("futhark-multicore", "tiny", 4_192, 32, 1.06),
            ("numpy", "s32", 27_328, 32, 1.643),
            ("futhark-c", "s32", 27_328, 32, 2.284),
            ("futhark-multicore", "s32", 27_328, 32, 2.724),
            ("numpy", "s64", 155_008, 32, 5.236),
            ("futhark-c", "s64", 155_008, 32, 9.929),
            ("futhark-multicore", "s64", 155_008, 32, 8.78),
            ("numpy", "s128", 809_728, 32, 21.24),
            ("futhark-c", "s128", 809_728, 32, 34.71),
            ("futhark-multicore", "s128", 809_728, 32, 24.4),
            ("numpy", "s256", 4_797_952, 32, 67.99),
            ("futhark-c", "s256", 4_797_952, 32, 153.5),
            ("futhark-multicore", "s256", 4_797_952, 32, 97.02),
        ),
    ),
    SpeedTable(
        date="2026-12-02",
        machine="AMD EPYC, 2 cores, shared (load average 1.0)",
        command="microgpt-gui bench --backends numpy,futhark-c,futhark-multicore --presets learn,tiny,s32 "
                "--batch 32 --sample-names 0 --rounds 2 (futhark-multicore on one thread there)",
        rows=(
            ("numpy", "learn", 26_816, 32, 1.445),
            ("futhark-c", "learn", 26_816, 32, 2.368),
            ("futhark-multicore", "learn", 26_816, 32, 2.337),
            ("numpy", "tiny", 4_192, 32, 0.5335),
            ("futhark-c", "tiny", 4_192, 32, 0.6529),
            ("futhark-multicore", "tiny", 4_192, 32, 0.6308),
            ("numpy", "s32", 27_328, 32, 1.306),
            ("futhark-c", "s32", 27_328, 32, 2.154),
            ("futhark-multicore", "s32", 27_328, 32, 2.299),
        ),
    ),
    SpeedTable(
        date="2026-12-03",
        machine="AMD EPYC (Zen 2, AVX2), 2 cores, shared (load average 1.0-1.4)",
        command="microgpt-gui bench --backends numpy,torch,futhark-c,futhark-multicore "
                "--presets learn,tiny,s32,s64,s128,s256 --batch 32 --sample-names 0 --rounds 2",
        rows=(
            ("numpy", "learn", 26_816, 32, 2.553),
            ("futhark-c", "learn", 26_816, 32, 3.689),
            ("futhark-multicore", "learn", 26_816, 32, 3.664),
            ("numpy", "tiny", 4_192, 32, 1.087),
            ("futhark-c", "tiny", 4_192, 32, 1.161),
            ("futhark-multicore", "tiny", 4_192, 32, 1.238),
            ("numpy", "s32", 27_328, 32, 2.658),
            ("futhark-c", "s32", 27_328, 32, 3.849),
            ("futhark-multicore", "s32", 27_328, 32, 3.88),
            ("numpy", "s64", 155_008, 32, 8.198),
            ("futhark-c", "s64", 155_008, 32, 13.9),
            ("futhark-multicore", "s64", 155_008, 32, 9.472),
            ("numpy", "s128", 809_728, 32, 30.56),
            ("futhark-c", "s128", 809_728, 32, 61.25),
            ("futhark-multicore", "s128", 809_728, 32, 43.53),
            ("numpy", "s256", 4_797_952, 32, 105.4),
            ("futhark-c", "s256", 4_797_952, 32, 334.7),
            ("futhark-multicore", "s256", 4_797_952, 32, 199.8),
        ),
    ),
    # The batched step as its own program per target, 2 x 2 product tiles
    # (2026-12-03, afternoon): its rows replace the morning's at these presets.
    SpeedTable(
        date="2026-12-03",
        machine="AMD EPYC (Zen 2, AVX2), 2 cores, shared (load average 1.2-1.4)",
        command="microgpt-gui bench --backends numpy,torch,futhark-c,futhark-multicore "
                "--presets learn,s64,s128,s256 --batch 32 --sample-names 0 --rounds 2",
        rows=(
            ("numpy", "learn", 26_816, 32, 2.813),
            ("futhark-c", "learn", 26_816, 32, 3.666),
            ("futhark-multicore", "learn", 26_816, 32, 3.648),
            ("numpy", "s64", 155_008, 32, 8.878),
            ("futhark-c", "s64", 155_008, 32, 13.99),
            ("futhark-multicore", "s64", 155_008, 32, 8.995),
            ("numpy", "s128", 809_728, 32, 32.41),
            ("futhark-c", "s128", 809_728, 32, 64.74),
            ("futhark-multicore", "s128", 809_728, 32, 35.11),
            ("numpy", "s256", 4_797_952, 32, 105.7),
            ("futhark-c", "s256", 4_797_952, 32, 370.4),
            ("futhark-multicore", "s256", 4_797_952, 32, 194.8),
        ),
    ),
    # The batched step's products by 4 x 2 tiles, compiled uninterleaved
    # (2026-12-03, evening): its rows replace the afternoon's.
    SpeedTable(
        date="2026-12-03",
        machine="AMD EPYC (Zen 2, AVX2), 2 cores, shared (load average 1.2-1.5)",
        command="microgpt-gui bench --backends numpy,torch,futhark-c,futhark-multicore "
                "--presets learn,s64,s128,s256 --batch 32 --sample-names 0 --rounds 2",
        rows=(
            ("numpy", "learn", 26_816, 32, 2.827),
            ("futhark-c", "learn", 26_816, 32, 3.129),
            ("futhark-multicore", "learn", 26_816, 32, 3.124),
            ("numpy", "s64", 155_008, 32, 8.483),
            ("futhark-c", "s64", 155_008, 32, 11.5),
            ("futhark-multicore", "s64", 155_008, 32, 7.131),
            ("numpy", "s128", 809_728, 32, 33.45),
            ("futhark-c", "s128", 809_728, 32, 51.4),
            ("futhark-multicore", "s128", 809_728, 32, 26.97),
            ("numpy", "s256", 4_797_952, 32, 111.8),
            ("futhark-c", "s256", 4_797_952, 32, 285.4),
            ("futhark-multicore", "s256", 4_797_952, 32, 145.3),
        ),
    ),
    # Transposes read in place, 5 x 2 product tiles (2026-12-03, late): its
    # rows replace the evening's.
    SpeedTable(
        date="2026-12-03",
        machine="AMD EPYC (Zen 2, AVX2), 2 cores, shared (load average 1.3-1.6)",
        command="microgpt-gui bench --backends numpy,torch,futhark-c,futhark-multicore "
                "--presets learn,s64,s128,s256 --batch 32 --sample-names 0 --rounds 2",
        rows=(
            ("numpy", "learn", 26_816, 32, 2.636),
            ("futhark-c", "learn", 26_816, 32, 2.901),
            ("futhark-multicore", "learn", 26_816, 32, 2.882),
            ("numpy", "s64", 155_008, 32, 8.553),
            ("futhark-c", "s64", 155_008, 32, 10.55),
            ("futhark-multicore", "s64", 155_008, 32, 9.763),
            ("numpy", "s128", 809_728, 32, 30.25),
            ("futhark-c", "s128", 809_728, 32, 46.71),
            ("futhark-multicore", "s128", 809_728, 32, 26.01),
            ("numpy", "s256", 4_797_952, 32, 103.2),
            ("futhark-c", "s256", 4_797_952, 32, 242.0),
            ("futhark-multicore", "s256", 4_797_952, 32, 126.5),
        ),
    ),
    # Tile sums written in place in the sequential program (2026-12-03,
    # 19:00): its rows replace the late table's.
    SpeedTable(
        date="2026-12-03",
        machine="AMD EPYC (Zen 2, AVX2), 2 cores, shared (load average 1.1-1.4)",
        command="microgpt-gui bench --backends numpy,torch,futhark-c,futhark-multicore "
                "--presets learn,s64,s128,s256 --batch 32 --sample-names 0 --rounds 2",
        rows=(
            ("numpy", "learn", 26_816, 32, 2.567),
            ("futhark-c", "learn", 26_816, 32, 2.354),
            ("futhark-multicore", "learn", 26_816, 32, 2.412),
            ("numpy", "s64", 155_008, 32, 7.801),
            ("futhark-c", "s64", 155_008, 32, 9.166),
            ("futhark-multicore", "s64", 155_008, 32, 6.422),
            ("numpy", "s128", 809_728, 32, 28.29),
            ("futhark-c", "s128", 809_728, 32, 40.54),
            ("futhark-multicore", "s128", 809_728, 32, 22.16),
            ("numpy", "s256", 4_797_952, 32, 105.1),
            ("futhark-c", "s256", 4_797_952, 32, 237.1),
            ("futhark-multicore", "s256", 4_797_952, 32, 120.6),
        ),
    ),
    # Products by tasks in the multicore program (2026-12-03, 21:00): the
    # first of that section's two bench runs; its rows replace the 19:00 table's.
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
