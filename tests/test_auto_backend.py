"""The automatic backend choice ("auto"): the fastest available backend from
measured speeds (engine.backends.choice, engine.backends.speeds), a Futhark
library built in the background while a run trains on a built backend
(engine.backends.prebuild), `demo --backend auto` end to end, and bench
recording what it measures."""
from __future__ import annotations

import datetime
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from cli_support import run_in_process as run, run_main, write_lines
from engine.backends import BackendInfo
from engine.backends import prebuild
from engine.backends import speeds as sp
from engine.backends.choice import choose_backend
from engine.bench.timing import BenchResult
from engine.cli.commands import window_args
from engine.config import get_preset
from engine.data.corpus import Corpus
from engine.data.corpus import CACHE_DIR_ENV, DATA_DIR_ENV
from engine.futhark import build as fbuild
from engine.futhark import cc
from futhark_support import hide_futhark

TINY, S128, S256 = get_preset("tiny"), get_preset("s128"), get_preset("s256")
P_TINY, P_S128, P_S256 = (p.model.num_params(27) for p in (TINY, S128, S256))
CPU = ["numpy", "futhark-c", "futhark-multicore"]
needs_cc = pytest.mark.skipif(cc.find_c_compiler() is None, reason=cc.NO_C_COMPILER)


def speed(backend, preset, params, ms, batch=1, source=sp.SHIPPED_SOURCE, date="2026-12-01", cpu=""):
    return sp.Speed(backend, preset, params, batch, ms, date, source, cpu=cpu)


def table(*rows):
    """Speeds at tiny and s256 at batch 1 and 32, each point with its own order."""
    return [speed(*row) for row in rows]


TABLE = table(
    ("numpy", "tiny", P_TINY, 0.30), ("futhark-c", "tiny", P_TINY, 0.08), ("futhark-multicore", "tiny", P_TINY, 0.11),
    ("numpy", "s256", P_S256, 16.0), ("futhark-c", "s256", P_S256, 9.0), ("futhark-multicore", "s256", P_S256, 6.0),
    ("numpy", "s256", P_S256, 45.0, 32), ("futhark-c", "s256", P_S256, 260.0, 32),
    ("futhark-multicore", "s256", P_S256, 130.0, 32),
)


def choose(preset, available=CPU, speeds=TABLE, batch=None, cpu=None):
    train = preset.train if batch is None else replace(preset.train, batch_size=batch)
    return choose_backend(preset.model, train, available, speeds=speeds, cpu=cpu)


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """A build cache with nothing built, and no Futhark compiler (the shipped C is built)."""
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("MICROGPT_FUTHARK_THREADS", raising=False)  # futhark-multicore at tiny: c's library
    hide_futhark(monkeypatch, tmp_path)
    return tmp_path / "cache"


# the choice ------------------------------------------------------------------

def test_the_fastest_at_the_models_own_point_wins_with_its_figures_as_the_reason():
    choice = choose(S256)
    assert choice.backend == "futhark-multicore"
    assert choice.ranking == ("futhark-multicore", "futhark-c", "numpy")
    assert choice.reason == ("6 ms/step at s256 against futhark-c's 9 and numpy's 16; "
                             "measured 2026-12-01, shipped table")
    assert choice.text() == f"auto: futhark-multicore ({choice.reason})"
    assert choose(TINY).backend == "futhark-c"
    assert choose(S256, batch=32).backend == "numpy"


def test_an_unavailable_backend_is_skipped():
    rows = [BackendInfo("numpy", True, ""), BackendInfo("futhark-c", True, ""),
            BackendInfo("futhark-multicore", False, "no C compiler")]
    choice = choose(S256, available=rows)
    assert (choice.backend, choice.ranking) == ("futhark-c", ("futhark-c", "numpy"))
    assert "futhark-multicore" not in choice.reason
    assert choose(S256, available=["numpy"]).backend == "numpy"


def test_a_size_the_table_lacks_takes_the_nearest_measured_point():
    # s128 (0.81M parameters) is 1.8 from s256 on the log scale and 5.3 from tiny
    choice = choose(S128)
    assert choice.backend == "futhark-multicore"
    assert choice.reason.startswith("6 ms/step at s256 against futhark-c's 9 and numpy's 16: the measured "
                                    f"point nearest this model, {P_S128:,} parameters at batch 1;")
    # batch 16 is nearer 32 (ln 2) than 1 (ln 16): s256's batch-32 figures decide
    batched = choose(S256, batch=16)
    assert batched.backend == "numpy" and "at s256, batch 32 against" in batched.reason
    assert choose(S256, batch=4).backend == "futhark-multicore"  # ln 4 < ln 8


def test_a_point_comparing_two_available_backends_beats_a_nearer_one_with_one():
    speeds = TABLE + [speed("numpy", "s128", P_S128, 1.0)]  # s128 itself, numpy alone
    assert choose(S128, speeds=speeds).backend == "futhark-multicore"  # s256's comparison decides
    alone = choose(S128, available=["numpy", "cupy"], speeds=speeds)
    assert alone.backend == "numpy"
    assert "the only backend here measured there" in alone.reason
    assert "not measured there: cupy" in alone.reason


AVX2, AVX512 = "x86-64 AVX2", "x86-64 AVX-512"


def test_the_kind_of_cpu_is_its_architecture_and_widest_vector_unit():
    linux = "flags: fpu sse2 avx fma avx2 bmi2; model name: Intel(R) Xeon(R) Processor"
    assert sp.cpu_kind(linux, "x86_64") == AVX2
    assert sp.cpu_kind(linux.replace("bmi2", "avx512f avx512bw"), "x86_64") == AVX512
    assert sp.cpu_kind("flags: fpu sse2 sse4_2", "x86_64") == "x86-64"
    # macOS's sysctl features are upper case
    assert sp.cpu_kind("Intel(R) Core(TM) i9\nFPU SSE2 AVX1.0\nAVX2 AVX512F AVX512BW", "x86_64") == AVX512
    assert sp.cpu_kind("", "aarch64") == sp.cpu_kind("", "arm64") == "arm64"
    # this machine's, from its own flags
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), None)
    if flags is not None:
        assert sp.this_cpu() == (AVX512 if "avx512f" in flags else AVX2 if "avx2" in flags else "x86-64")


# s256 at batch 32 on two kinds of CPU, ranked the other way round
KINDS = [speed("numpy", "s256", P_S256, 90.0, 32, cpu=AVX2), speed("futhark-multicore", "s256", P_S256, 107.0, 32, cpu=AVX2),
         speed("numpy", "s256", P_S256, 73.0, 32, cpu=AVX512, date="2026-12-05"),
         speed("futhark-multicore", "s256", P_S256, 60.0, 32, cpu=AVX512, date="2026-12-05")]


def test_the_figures_of_this_kind_of_cpu_decide():
    assert choose(S256, speeds=KINDS, batch=32, cpu=AVX2).backend == "numpy"
    here = choose(S256, speeds=KINDS, batch=32, cpu=AVX512)
    assert here.backend == "futhark-multicore"
    assert here.reason.startswith("60 ms/step at s256, batch 32 against numpy's 73; measured 2026-12-05, shipped table;")
    # a kind the table lacks: both as far, the newer figures decide, and the reason says whose they are
    other = choose(S256, speeds=KINDS, batch=32, cpu="arm64")
    assert other.backend == "futhark-multicore"
    assert "; measured 2026-12-05, shipped table, on x86-64 AVX-512 (this CPU: arm64);" in other.reason


def test_another_kinds_figures_at_the_models_batch_beat_this_kinds_at_another_batch_but_not_another_preset():
    # batch 1 on an AVX2 machine: the AVX-512 machine's batch-1 figures, not AVX2's at batch 32
    b1 = [speed("numpy", "s256", P_S256, 31.0, cpu=AVX512), speed("futhark-c", "s256", P_S256, 12.0, cpu=AVX512)]
    choice = choose(S256, speeds=KINDS + b1, cpu=AVX2)
    assert choice.backend == "futhark-c"
    assert "on x86-64 AVX-512 (this CPU: x86-64 AVX2)" in choice.reason
    # s128 at batch 32 on AVX-512: this kind's s256 (ln 5.9 away) rather than AVX2's s128 itself (ln 8)
    s128 = [speed("numpy", "s128", P_S128, 26.0, 32, cpu=AVX2), speed("futhark-c", "s128", P_S128, 20.0, 32, cpu=AVX2)]
    assert choose(S128, speeds=KINDS + s128, batch=32, cpu=AVX512).backend == "futhark-multicore"
    assert choose(S128, speeds=KINDS + s128, batch=32, cpu=AVX2).backend == "futhark-c"


def test_no_figures_at_all_choose_numpy_and_say_so():
    choice = choose(S256, available=["cupy", "numpy"], speeds=[])
    assert choice.backend == "numpy" and choice.built and choice.now == "numpy"
    assert choice.reason.startswith("no measured speeds for cupy, numpy; numpy by default")


# the user's own measurements ---------------------------------------------------

def bench_row(backend, preset, ms, batch=1, **extra):
    params = get_preset(preset).model.num_params(27)
    return BenchResult(backend, preset, "ok", params=params, ms_per_step=ms, batch=batch, load_avg=1.2, **extra)


def at(day: int) -> datetime.datetime:
    return datetime.datetime(2026, 12, day, 12, tzinfo=datetime.timezone.utc)


def test_each_shipped_configuration_has_one_row_and_every_table_a_row():
    """A run that measures a configuration again replaces its row, so no shipped row is dead."""
    keys = [(b, preset, batch, table.cpu) for table in sp.SHIPPED for b, preset, _, batch, _ in table.rows]
    assert len(keys) == len(set(keys))
    assert all(table.rows for table in sp.SHIPPED)
    # each table says which kind of CPU it was measured on, as cpu_kind names them
    assert {table.cpu for table in sp.SHIPPED} <= {"x86-64 AVX-512", "x86-64 AVX2", "x86-64", "arm64"}
    assert len(sp.shipped_speeds()) == len(keys)


def test_the_users_measurement_on_this_machine_overrides_the_shipped_one(tmp_path, monkeypatch):
    rows = tuple((s.backend, s.preset, s.params, s.batch, s.ms_per_step) for s in TABLE)
    monkeypatch.setattr(sp, "SHIPPED", (sp.SpeedTable("2026-11-30", "m", "bench", (("numpy", "s256", P_S256, 1, 1.0),),
                                                      cpu=AVX2),
                                        sp.SpeedTable("2026-12-01", "m", "bench", rows, cpu=AVX2),
                                        sp.SpeedTable("2026-12-01", "m2", "bench", rows, cpu=AVX512)))
    records = tmp_path / "speeds.json"
    assert sp.record_bench([bench_row("numpy", "s256", 7.0), bench_row("futhark-c", "tiny", 0.2)], ["bench"],
                           records, machine="here", now=at(2), cpu=AVX2) == 2
    sp.record_bench([bench_row("numpy", "s256", 5.0)], ["bench"], records, machine="here", now=at(3), cpu=AVX2)
    sp.record_bench([bench_row("numpy", "s256", 4.0)], ["bench"], records, machine="over there", now=at(4))
    speeds = sp.all_speeds(records, machine="here", cpu=AVX2)
    # this kind's shipped numpy row is replaced, the other kind's kept
    assert sorted(s.ms_per_step for s in speeds if (s.backend, s.preset, s.batch) == ("numpy", "s256", 1)) == [5.0, 16.0]
    choice = choose(S256, speeds=speeds, cpu=AVX2)  # numpy's 5.0 of Dec 3 here, not 16 (shipped) nor 4.0 (elsewhere)
    assert choice.backend == "numpy"
    assert choice.reason == ("5 ms/step at s256 against futhark-multicore's 6 and futhark-c's 9; "
                             "measured 2026-12-03, bench here; 2026-12-01, shipped table")
    assert choose(TINY, speeds=speeds, cpu=AVX2).ranking == ("futhark-multicore", "futhark-c", "numpy")
    # the file holds the newest per (backend, preset, batch, machine)
    kept = json.loads(records.read_text())["records"]
    assert sorted((r["backend"], r["preset"], r["machine"], r["ms_per_step"]) for r in kept) == [
        ("futhark-c", "tiny", "here", 0.2), ("numpy", "s256", "here", 5.0), ("numpy", "s256", "over there", 4.0)]
    assert [r["cpu"] for r in kept if r["machine"] == "here"] == [AVX2, AVX2]


def test_a_record_from_before_kinds_of_cpu_were_noted_is_of_this_machines_kind(tmp_path):
    records = tmp_path / "speeds.json"
    sp.record_bench([bench_row("numpy", "tiny", 0.5)], ["bench"], records, machine="here", now=at(2), cpu=AVX512)
    doc = json.loads(records.read_text())
    del doc["records"][0]["cpu"]
    records.write_text(json.dumps(doc))
    assert [s.cpu for s in sp.measured_speeds(records, machine="here", cpu=AVX2)] == [AVX2]


def test_a_damaged_records_file_counts_as_none_and_the_next_bench_rewrites_it(tmp_path):
    records = tmp_path / "speeds.json"
    records.write_text('{"records": [{"backend": "numpy"')
    assert sp.measured_speeds(records, machine="here") == []
    sp.record_bench([bench_row("numpy", "tiny", 0.5), replace(bench_row("numpy", "s64", 1.0), status="error")],
                    ["bench"], records, machine="here", now=at(2))
    assert [(s.backend, s.preset, s.ms_per_step, s.source) for s in sp.measured_speeds(records, "here")] == [
        ("numpy", "tiny", 0.5, sp.BENCH_SOURCE)]


def test_bench_records_its_rows_for_the_automatic_choice(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    data = write_lines(tmp_path / "names.txt", ["emma", "olivia", "ava", "isabella", "sophia", "zoe"])
    code, out, err = run(["bench", "--backends", "numpy", "--presets", "tiny,s32", "--steps", "2", "--seconds", "0",
                          "--warmup", "1", "--sample-names", "0", "--data", str(data)], capsys)
    assert code == 0, err
    path = tmp_path / "data" / sp.RECORDS_FILE
    assert f"recorded 2 measurements in {path} (--backend auto chooses by them)" in out
    printed = {line.split()[1]: float(line.split()[3]) for line in out.splitlines() if line.startswith("numpy ")}
    mine = {s.preset: s for s in sp.measured_speeds()}
    assert sorted(mine) == sorted(printed) == ["s32", "tiny"]
    assert all(abs(mine[preset].ms_per_step - printed[preset]) <= 0.0005 + 1e-9 for preset in printed)
    assert mine["tiny"].params == get_preset("tiny").model.num_params(Corpus.from_file(data).vocab_size)
    assert mine["tiny"].machine == sp.this_machine() and mine["tiny"].cpu == sp.this_cpu()
    # the kind of CPU the figures are of, in bench's first words
    assert any(line.startswith("machine: ") and f" ({sp.this_cpu()}), {os.cpu_count()} cores; " in line
               for line in out.splitlines())


# built or not, and the background build -----------------------------------------

def test_futhark_multicore_opens_futhark_cs_library_where_it_runs_one_thread(monkeypatch):
    monkeypatch.delenv("MICROGPT_FUTHARK_THREADS", raising=False)
    assert prebuild.library_targets("numpy", TINY.model, TINY.train, 27) == ()
    assert prebuild.library_targets("futhark-c", S256.model, S256.train, 27) == ("c",)
    assert prebuild.library_targets("futhark-multicore", TINY.model, TINY.train, 27) == ("c",)
    monkeypatch.setenv("MICROGPT_FUTHARK_THREADS", "2")
    assert prebuild.library_targets("futhark-multicore", TINY.model, TINY.train, 27) == ("multicore",)
    monkeypatch.setenv("MICROGPT_FUTHARK_THREADS", "1")
    assert prebuild.library_targets("futhark-multicore", S256.model, S256.train, 27) == ("c",)
    monkeypatch.setenv("MICROGPT_FUTHARK_THREADS", "two")  # opening it says why
    assert prebuild.library_targets("futhark-multicore", S256.model, S256.train, 27) == ()


def test_a_batch_opens_its_targets_program_for_batches_and_the_one_for_evaluation(monkeypatch):
    """B > 1 trains in each target's _batch program (kernels/c_batch.fut, ...), one
    thread futhark-c's, and runs held-out losses and sampling in the same target's
    program for one document a step: both are built before it opens."""
    batched = replace(S256.train, batch_size=32)
    monkeypatch.setenv("MICROGPT_FUTHARK_THREADS", "2")
    assert prebuild.library_targets("futhark-c", S256.model, batched, 27) == ("c_batch", "c")
    assert prebuild.library_targets("futhark-multicore", S256.model, batched, 27) == ("multicore_batch", "multicore")
    assert prebuild.library_targets("futhark-cuda", S256.model, batched, 27) == ("cuda_batch", "cuda")
    monkeypatch.setenv("MICROGPT_FUTHARK_THREADS", "1")
    assert prebuild.library_targets("futhark-multicore", S256.model, batched, 27) == ("c_batch", "c")


def test_a_backend_is_built_when_all_its_libraries_are(monkeypatch):
    batched = replace(S256.train, batch_size=32)
    built = set()
    monkeypatch.setattr(fbuild, "is_complete", lambda libdir: libdir.name.split("-")[1] in built)
    assert prebuild.unbuilt_targets("futhark-c", S256.model, batched, 27) == ("c_batch", "c")
    built.add("c")
    assert prebuild.unbuilt_targets("futhark-c", S256.model, batched, 27) == ("c_batch",)
    assert not prebuild.is_built("futhark-c", S256.model, batched, 27)
    assert prebuild.is_built("futhark-c", S256.model, S256.train, 27)  # B = 1 opens c alone
    built.add("c_batch")
    assert prebuild.is_built("futhark-c", S256.model, batched, 27)
    assert prebuild.is_built("numpy", S256.model, batched, 27)
    one = prebuild.build_estimate("c")
    assert prebuild.build_estimate("c_batch", "c") == f"2 libraries, {one} each"


@needs_cc
def test_a_backend_not_built_yet_trains_the_fastest_built_one_meanwhile(empty_cache):
    choice = choose(TINY)
    assert (choice.backend, choice.built, choice.now) == ("futhark-c", False, "numpy")
    assert choice.estimate == fbuild.BUILD_ESTIMATES["shipped"]
    assert choice.meanwhile() == (f"futhark-c is not built yet (its first use compiles C, {choice.estimate}): "
                                  "training on numpy meanwhile while it builds in the background")
    numpy_first = choose(TINY, speeds=TABLE + [speed("numpy", "tiny", P_TINY, 0.01, source=sp.BENCH_SOURCE)])
    assert (numpy_first.backend, numpy_first.built, numpy_first.meanwhile()) == ("numpy", True, "")


@needs_cc
def test_a_background_build_cancelled_leaves_nothing_half_built(empty_cache):
    outcomes = []
    build = prebuild.start_build("futhark-c", TINY.model, TINY.train, 27, on_done=outcomes.append)
    assert build is not None and build.poll() is None
    assert build.status_text().startswith("building futhark-c in the background (first use, about")
    time.sleep(1.0)  # into the build: the child holds the lock and its temporary folder
    build.cancel()
    assert build.poll().phase == prebuild.BuildPhase.CANCELLED
    deadline = time.monotonic() + 10
    while not outcomes and time.monotonic() < deadline:  # the watcher thread's call
        time.sleep(0.05)
    assert [o.phase for o in outcomes] == [prebuild.BuildPhase.CANCELLED]
    leftovers = [p.name for p in (empty_cache / "futhark").iterdir() if not p.name.startswith(".microgpt-c-")
                 or not p.name.endswith(".lock")]
    assert leftovers == ["logs"]
    assert prebuild.last_failure("c") == ""  # a cancel is no failure: the next start builds again
    assert choose(TINY).now == "numpy"


def test_a_failed_background_build_is_remembered_and_its_backend_left_out(with_clang, clean_env):
    from futhark_support import CLANG_VERSION, stand_in_cc

    stand_in_cc(clean_env / "empty-bin", "clang", CLANG_VERSION, "echo 'error: no room' >&2\nexit 1\n")
    build = prebuild.start_build("futhark-c", TINY.model, TINY.train, 27)
    outcome = build.wait(120)
    assert outcome.phase == prebuild.BuildPhase.FAILED
    assert "could not build the Futhark c library" in outcome.message and "error: no room" in outcome.message
    assert prebuild.last_failure("c") == outcome.message
    choice = choose(TINY, available=["numpy", "futhark-c"])
    assert choice.backend == "numpy" and choice.built
    assert choice.reason.endswith(f"; futhark-c left out: its last build failed: {outcome.message}")
    assert prebuild.start_build("numpy", TINY.model, TINY.train, 27) is None


def test_a_batchs_background_build_builds_both_libraries_and_stops_at_a_failure(with_clang, clean_env):
    """B > 1 needs the _batch program and the one for one document a step: the child
    builds them in turn and stops at the first that fails, which is remembered; the
    other is left for the next try."""
    from futhark_support import CLANG_VERSION, stand_in_cc

    stand_in_cc(clean_env / "empty-bin", "clang", CLANG_VERSION, "echo 'error: no room' >&2\nexit 1\n")
    batched = replace(TINY.train, batch_size=8)
    build = prebuild.start_build("futhark-c", TINY.model, batched, 27)
    assert build.targets == ("c_batch", "c")
    assert build.status_text().startswith("building futhark-c in the background (first use, 2 libraries, about")
    outcome = build.wait(120)
    assert (outcome.phase, outcome.targets) == (prebuild.BuildPhase.FAILED, ("c_batch", "c"))
    assert "could not build the Futhark c_batch library" in outcome.message and "error: no room" in outcome.message
    assert prebuild.last_failure("c_batch") == outcome.message
    assert prebuild.last_failure("c") == ""  # not tried
    assert prebuild.unbuilt_targets("futhark-c", TINY.model, batched, 27) == ("c_batch", "c")
    choice = choose(TINY, available=["numpy", "futhark-c"], batch=8)
    assert choice.backend == "numpy"
    assert choice.reason.endswith(f"; futhark-c left out: its last build failed: {outcome.message}")


def test_a_background_build_of_several_libraries_is_done_when_each_is(futhark_cpu_builds):
    """Libraries already built (the suite's cache): the child finds each and says so."""
    build = prebuild.BackgroundBuild("futhark-c", ("c_batch", "c"))
    outcome = build.wait(120)
    assert (outcome.phase, outcome.targets) == (prebuild.BuildPhase.DONE, ("c_batch", "c"))
    assert outcome.message.startswith("built futhark-c in ")
    for target in ("c_batch", "c"):
        recorded = json.loads(prebuild.outcome_path(prebuild.library_dir(target)).read_text(encoding="utf-8"))
        assert recorded["ok"] and recorded["target"] == target


# the command line ----------------------------------------------------------------

def test_auto_is_a_backend_name_for_the_window_and_demo(capsys):
    args, status = window_args(["--backend", "auto"], environ={"DISPLAY": ":0"})
    assert status == 0 and args.backend == "auto"
    code, _, err = run(["demo", "--backend", "nope"], capsys)
    assert code == 2 and err.rstrip().endswith(", or auto (the fastest here)")


def wait_for_build(cache: Path, timeout: float = 400) -> Path:
    """The folder of the first complete library in cache (the background build's)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [p.parent for p in (cache / "futhark").glob("microgpt-*/build.json")]
        if done:
            return done[0]
        time.sleep(1)
    raise AssertionError(f"no library was built in {cache} within {timeout} s")


@pytest.mark.futhark
@pytest.mark.slow
@needs_cc
def test_demo_auto_trains_on_numpy_while_futhark_builds_then_uses_it(tmp_path):
    """A first run with an empty build cache trains on numpy and says why; the library
    builds in the background; the next run trains on it. This machine's own bench
    figures (a records file) say futhark-c is the fastest at tiny."""
    cache, data_dir = tmp_path / "cache", tmp_path / "data"
    sp.record_bench([bench_row("numpy", "tiny", 0.3), bench_row("futhark-c", "tiny", 0.05),
                     bench_row("futhark-multicore", "tiny", 0.2)], ["bench"], data_dir / sp.RECORDS_FILE)
    env = {CACHE_DIR_ENV: str(cache), DATA_DIR_ENV: str(data_dir)}
    args = ["demo", "--backend", "auto", "--steps", "20", "--samples", "1"]
    first = run_main(args, tmp_path, **env)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[2].startswith("auto: futhark-c (0.05 ms/step at tiny against futhark-multicore's 0.2 and "
                               "numpy's 0.3; measured ")
    assert lines[3].startswith("futhark-c is not built yet (its first use compiles C, about ")
    assert "training on numpy meanwhile while it builds in the background (log: " in lines[3]
    assert lines[3].endswith("; the next run uses futhark-c")
    assert "4,192 params, backend numpy," in lines[4]
    libdir = wait_for_build(cache)
    assert libdir.name.startswith("microgpt-c-")
    second = run_main(args, tmp_path, **env)
    assert second.returncode == 0, second.stderr
    lines = second.stdout.splitlines()
    assert lines[2].startswith("auto: futhark-c (0.05 ms/step at tiny")
    assert "4,192 params, backend futhark-c," in lines[3]
    assert "not built" not in second.stdout and "building" not in second.stdout


def test_the_shipped_tables_rows_are_printed_from_bench_json_at_each_fastest_round(tmp_path):
    from engine.bench.report import write_json

    rows = [bench_row("numpy", "s256", 31.2, batch=32, runs_ms=[31.2, 30.98567, 32.5]),
            bench_row("futhark-c", "tiny", 0.0580812),
            replace(bench_row("futhark-c", "s64", 1.0), status="error"),
            bench_row("numpy", "learn", 4.3, target_loss=2.05)]  # bench --to-loss: not a step time
    write_json(tmp_path / "bench.json", rows, ["microgpt-gui", "bench"], {"cpu_kind": AVX512})
    write_json(tmp_path / "old.json", rows, ["microgpt-gui", "bench"], {})  # from before kinds were noted
    assert sp.table_cpus([tmp_path / "bench.json"]) == [AVX512]
    assert sp.table_cpus([tmp_path / "bench.json", tmp_path / "old.json"]) == [AVX512, ""]
    printed = sp.table_rows([tmp_path / "bench.json"])
    assert [eval(line.strip().rstrip(",")) for line in printed] == [
        ("numpy", "s256", P_S256, 32, 30.99), ("futhark-c", "tiny", P_TINY, 1, 0.05808)]
