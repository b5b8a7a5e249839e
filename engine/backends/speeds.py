"""Measured training speeds per (backend, preset, batch): the table shipped
with the engine, and the user's own `microgpt-gui bench` measurements, which
bench records in the user's data folder. engine.backends.choice picks the
fastest available backend from them ("auto").

The shipped figures are SHIPPED below: one SpeedTable per bench run (its date,
machine, kind of CPU and command) holding the rows of it still current, one per
measured configuration and kind of CPU (where two tables held the same
(backend, preset, batch) on one kind, the later would win). Which backend is
fastest depends on the CPU's vector unit (with AVX-512, NumPy's and PyTorch's
BLAS multiply 16 floats at a time, the Futhark C as clang compiles it 8), so a
figure carries its kind of CPU (cpu_kind) and the choice prefers this kind's.
To update them after a kernel change, run the command on a quiet machine with
`--json FILE`, then `python -m engine.backends.speeds FILE [FILE...]` prints
the rows to paste here as a new table, and its kind of CPU (date, machine and
command to match); delete the rows it replaces (the same configuration on the
same kind of CPU), and a table left empty.
docs/backends.md ("The automatic choice") says how the choice reads them.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from dataclasses import dataclass, replace
from functools import lru_cache
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
    cpu: str = ""      # cpu_kind() of that machine: "x86-64 AVX-512"; "" where unknown

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
    cpu: str = ""  # cpu_kind() of the machine

    def speeds(self) -> list[Speed]:
        return [Speed(backend, preset, params, batch, ms, self.date, SHIPPED_SOURCE, machine=self.machine,
                      cpu=self.cpu)
                for backend, preset, params, batch, ms in self.rows]


# The rows still current, by the bench run that measured them, each
# configuration's fastest round (table_rows), per kind of CPU. When a run
# measures a configuration again on the same kind of CPU, its row replaces the
# earlier one here, and a run left with no rows goes; docs/performance.md keeps
# every run's figures ("The automatic choice's table" and the sections it
# links). x86-64 AVX-512: one name per step (gpt2-small included) and batch 32,
# on a 2-core Intel Xeon, on the kernel of 2026-12-03, 21:00 (these replace the
# first table's rows of 2026-12-02, from a Xeon under a load of 3.8 to 5.9); the
# rows where futhark-multicore runs two threads measured again after the
# workers' wait (2026-12-05), batch 32's all again after batches in parts, from
# tiny to s64 again after those steps' leak was mended (2026-12-05, night), and
# all again after the attention's sums ran by the position attended to (2026-12-06).
# x86-64 AVX2: batch 32, on a 2-core AMD EPYC (Zen 2): tiny and s32 on the
# kernel of 2026-12-03 (4 x 2 product tiles), learn to s256 on that of
# 2026-12-03, 21:00. PyTorch's rows are not shipped: it is a comparison in
# bench, not a backend to choose.
SHIPPED: tuple[SpeedTable, ...] = (
    SpeedTable(
        date="2026-12-05",
        machine="Intel(R) Xeon(R) Processor, 2 cores, shared (load average 0.8-1.3)",
        command="microgpt-gui bench --backends numpy,torch,futhark-c,futhark-multicore "
                "--presets learn,tiny,s32,s64,s128,s256,gpt2-small --batch 1 --sample-names 0 --rounds 2 "
                "(its rows from learn to s64)",
        cpu="x86-64 AVX-512",
        rows=(
            ("numpy", "learn", 26_816, 1, 0.4009),
            ("futhark-c", "learn", 26_816, 1, 0.3505),
            ("futhark-multicore", "learn", 26_816, 1, 0.3542),
            ("numpy", "tiny", 4_192, 1, 0.1298),
            ("futhark-c", "tiny", 4_192, 1, 0.0547),
            ("futhark-multicore", "tiny", 4_192, 1, 0.0571),
            ("numpy", "s32", 27_328, 1, 0.3238),
            ("futhark-c", "s32", 27_328, 1, 0.2243),
            ("futhark-multicore", "s32", 27_328, 1, 0.2245),
            ("numpy", "s64", 155_008, 1, 0.9806),
            ("futhark-c", "s64", 155_008, 1, 0.8521),
            ("futhark-multicore", "s64", 155_008, 1, 0.8514),
        ),
    ),
    # The workers' wait (2026-12-05): futhark-multicore's workers spin before they
    # sleep (engine/futhark/spin_wait.h), and use two threads from 300,000
    # parameters times documents per step.
    SpeedTable(
        date="2026-12-05",
        machine="Intel(R) Xeon(R) Processor, 2 cores, shared (load average 1.5-1.9)",
        command="microgpt-gui bench --backends numpy,torch,futhark-c,futhark-multicore "
                "--presets s128,s256,gpt2-small --batch 1 --sample-names 0 --rounds 2",
        cpu="x86-64 AVX-512",
        rows=(
            ("numpy", "s128", 809_728, 1, 3.008),
            ("futhark-c", "s128", 809_728, 1, 1.829),
            ("futhark-multicore", "s128", 809_728, 1, 1.718),
            ("numpy", "s256", 4_797_952, 1, 20.57),
            ("futhark-c", "s256", 4_797_952, 1, 9.121),
            ("futhark-multicore", "s256", 4_797_952, 1, 5.218),
            ("numpy", "gpt2-small", 85_762_560, 1, 306.0),
            ("futhark-c", "gpt2-small", 85_762_560, 1, 210.3),
            ("futhark-multicore", "gpt2-small", 85_762_560, 1, 108.6),
        ),
    ),
    # Attention by the position attended to (2026-12-06): the attention's sums with the
    # position attended to outermost, the widest products as rows of axpys, and batches
    # in parts up to 1,000,000 parameters (s128 too). PyTorch's rows are not shipped.
    SpeedTable(
        date="2026-12-06",
        machine="Intel(R) Xeon(R) Processor, 2 cores, shared (load average 1.4-1.6)",
        command="microgpt-gui bench --backends numpy,torch,futhark-c,futhark-multicore "
                "--presets learn,tiny,s32,s64,s128,s256 --batch 32 --sample-names 0 --rounds 2",
        cpu="x86-64 AVX-512",
        rows=(
            ("numpy", "learn", 26_816, 32, 1.577),
            ("futhark-c", "learn", 26_816, 32, 1.946),
            ("futhark-multicore", "learn", 26_816, 32, 0.9566),
            ("numpy", "tiny", 4_192, 32, 0.566),
            ("futhark-c", "tiny", 4_192, 32, 0.5746),
            ("futhark-multicore", "tiny", 4_192, 32, 0.2909),
            ("numpy", "s32", 27_328, 32, 1.635),
            ("futhark-c", "s32", 27_328, 32, 1.895),
            ("futhark-multicore", "s32", 27_328, 32, 0.8747),
            ("numpy", "s64", 155_008, 32, 4.442),
            ("futhark-c", "s64", 155_008, 32, 7.589),
            ("futhark-multicore", "s64", 155_008, 32, 3.484),
            ("numpy", "s128", 809_728, 32, 19.64),
            ("futhark-c", "s128", 809_728, 32, 34.03),
            ("futhark-multicore", "s128", 809_728, 32, 16.85),
            ("numpy", "s256", 4_797_952, 32, 75.53),
            ("futhark-c", "s256", 4_797_952, 32, 194.6),
            ("futhark-multicore", "s256", 4_797_952, 32, 111.6),
        ),
    ),
    SpeedTable(
        date="2026-12-03",
        machine="AMD EPYC (Zen 2, AVX2), 2 cores, shared (load average 1.0-1.4)",
        command="microgpt-gui bench --backends numpy,torch,futhark-c,futhark-multicore "
                "--presets learn,tiny,s32,s64,s128,s256 --batch 32 --sample-names 0 --rounds 2",
        cpu="x86-64 AVX2",
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
        cpu="x86-64 AVX2",
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
    """Every shipped figure, the later table's where two measured the same configuration
    on the same kind of CPU."""
    newest: dict[tuple[str, str, int, str], Speed] = {}
    for table in SHIPPED:
        for speed in table.speeds():
            newest[(speed.backend, speed.preset, speed.batch, speed.cpu)] = speed
    return list(newest.values())


# what decides the ranking: the CPU's kind --------------------------------------

AVX512, AVX2 = "AVX-512", "AVX2"


def cpu_kind(description: str | None = None, arch: str | None = None) -> str:
    """The kind of CPU whose figures apply here: its architecture and, on x86-64, its
    widest vector unit ("x86-64 AVX-512", "x86-64 AVX2", "x86-64", "arm64").
    description: the CPU's feature flags as engine.futhark.cc.cpu_description gives
    them (default: this machine's); arch: platform.machine() (default: this one's)."""
    arch = (platform.machine() if arch is None else arch).lower()
    if arch in ("x86_64", "amd64", "x64"):
        if description is None:
            from ..futhark.cc import cpu_description  # reads /proc/cpuinfo or sysctl; nothing heavy

            description = cpu_description()
        flags = set(description.lower().replace(";", " ").replace(":", " ").split())
        widest = AVX512 if "avx512f" in flags else AVX2 if "avx2" in flags else ""
        return f"x86-64 {widest}".strip()
    return {"aarch64": "arm64"}.get(arch, arch or "unknown")


# the user's measurements ------------------------------------------------------

def records_path() -> Path:
    return user_data_dir() / RECORDS_FILE


def this_machine() -> str:
    """What identifies this machine's figures: the CPU model and the core count (a home
    folder shared between machines keeps each machine's measurements apart)."""
    from ..bench.report import cpu_model  # reads /proc/cpuinfo; nothing heavy

    return f"{cpu_model()}, {os.cpu_count()} cores"


@lru_cache(maxsize=1)
def this_cpu() -> str:
    """cpu_kind() of this machine (read once)."""
    return cpu_kind()


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
                      None if record.get("load") is None else float(record["load"]), str(record["machine"]),
                      str(record.get("cpu", "")))
    except (KeyError, TypeError, ValueError):
        return None
    return speed if speed.ms_per_step > 0 and speed.batch >= 1 and speed.params >= 1 else None


def measured_speeds(path: Path | None = None, machine: str | None = None, cpu: str | None = None) -> list[Speed]:
    """This machine's bench measurements, the newest for each (backend, preset, batch),
    each of this machine's kind of CPU (cpu; default this_cpu())."""
    machine = this_machine() if machine is None else machine
    cpu = this_cpu() if cpu is None else cpu
    newest: dict[tuple[str, str, int], Speed] = {}
    for record in _read_records(path or records_path()):
        speed = _speed(record)
        if speed is None or speed.machine != machine:
            continue
        key = (speed.backend, speed.preset, speed.batch)
        if key not in newest or speed.date >= newest[key].date:
            newest[key] = speed
    # records from before they noted the kind are of this machine, so of its kind
    return [s if s.cpu else replace(s, cpu=cpu) for s in newest.values()]


def all_speeds(path: Path | None = None, machine: str | None = None, cpu: str | None = None) -> list[Speed]:
    """The shipped table, with this machine's own measurement in place of the shipped row
    of this kind of CPU wherever bench measured the same (backend, preset, batch)."""
    mine = measured_speeds(path, machine, cpu)
    measured = {(s.backend, s.preset, s.batch, s.cpu) for s in mine}
    return [s for s in shipped_speeds() if (s.backend, s.preset, s.batch, s.cpu) not in measured] + mine


def record_bench(results, command: list[str], path: Path | None = None, machine: str | None = None,
                 now: datetime.datetime | None = None, cpu: str | None = None) -> int:
    """Add bench's timed rows (engine.bench.timing.BenchResult, status "ok") to the
    user's measurements, replacing older ones of the same (backend, preset, batch) on
    this machine; returns how many were recorded. Under a file lock, written whole
    and renamed into place: two bench runs at once never leave a damaged file."""
    machine = this_machine() if machine is None else machine
    cpu = this_cpu() if cpu is None else cpu
    when = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    new = [{"backend": r.backend, "preset": r.preset, "params": r.params, "batch": r.batch,
            "ms_per_step": round(r.ms_per_step, 6), "date": when, "load": r.load_avg, "machine": machine,
            "cpu": cpu, "command": " ".join(command)}
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


def table_cpus(bench_json: list[Path]) -> list[str]:
    """The kinds of CPU the `bench --json` files were measured on (a SpeedTable's cpu)."""
    kinds = []
    for path in bench_json:
        kind = json.loads(Path(path).read_text(encoding="utf-8")).get("machine", {}).get("cpu_kind", "")
        if kind not in kinds:
            kinds.append(kind)
    return kinds


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m engine.backends.speeds BENCH.json [BENCH.json ...]")
    files = [Path(p) for p in sys.argv[1:]]
    kinds = table_cpus(files)
    print(f"    # cpu={kinds[0]!r}" if len(kinds) == 1 and kinds[0] else
          f"    # kinds of CPU: {', '.join(k or 'not recorded' for k in kinds)} (one table per kind)")
    print("\n".join(table_rows(files)))
