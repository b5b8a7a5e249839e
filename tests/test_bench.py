"""engine.bench.measure's measurement (its timing loop: engine.bench.timing), and the PyTorch
reference it compares against."""
from __future__ import annotations

import json
import math
import time
from dataclasses import replace

import numpy as np
import pytest

import engine
from engine.bench import measure as bench
from engine.bench import report as bench_report
from engine.bench import timing as bench_timing
from engine.training.protocol import RunSpec

DOCS = ["emma", "olivia", "ava", "isabella", "sophia", "charlotte", "mia", "amelia", "harper",
        "evelyn", "abigail", "emily", "elizabeth", "mila", "ella", "avery", "sofia", "camila"]


def test_measure_reports_a_consistent_row(monkeypatch):
    monkeypatch.setattr(bench_timing, "load_average", lambda: 0.25)
    corpus = engine.Corpus.from_lines(DOCS)
    row = bench_timing.measure("numpy", "tiny", corpus, bench_timing.Budget(steps=7, seconds=0, warmup=2, sample_names=4))
    assert (row.status, row.steps, row.warmup, row.chunks, row.sample_names) == ("ok", 7, 2, 7, 4)
    assert row.params == engine.ModelConfig(16, 1, 4, 16).num_params(corpus.vocab_size)
    assert row.ms_min <= row.ms_per_step <= row.ms_max
    assert row.steps_per_s == pytest.approx(1e3 / row.ms_per_step)
    assert row.seconds > 0 and row.sample_ms > 0
    assert (row.load_avg, row.busy) == (0.25, False)
    assert row.peak_rss_mb > 1 or math.isnan(row.peak_rss_mb)


class FakeClock:
    """perf_counter for bench, advanced only by FakeRunner's steps."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


class FakeRunner:
    """What the training loop needs of a runner, with steps that take step_s on a FakeClock."""

    name, model, train_config, num_params, holdout = "fake", None, None, 0, 0
    corpus = engine.Corpus.from_lines(DOCS)

    def __init__(self, clock, horizon=10**9, step_s=2**-10):  # about 1 ms, exact in binary
        self.clock, self.horizon, self.step_s, self.done, self.calls = clock, horizon, step_s, 0, []

    @property
    def step(self):
        return self.done

    @property
    def finished(self):
        return self.done >= self.horizon

    def train(self, k):
        k = min(k, self.horizon - self.done)
        self.calls.append(k)
        self.done += k
        self.clock.now += k * self.step_s
        return np.zeros(k, dtype=np.float32)

    def close(self):
        pass


def timed(runner, clock, budget):
    """bench's timing loop (TimingPlan in a TrainingLoop) over runner, on the fake clock."""
    return bench_timing.TimingPlan(budget, clock=clock.perf_counter).run(RunSpec("fake"), lambda s: runner)


def test_timing_runs_for_the_seconds_when_they_take_longer_than_the_steps():
    clock = FakeClock()
    runner = FakeRunner(clock)
    plan = timed(runner, clock, bench_timing.Budget(steps=20, seconds=1.5))
    # warm-up: at least 3 steps and WARMUP_S seconds, one step per call
    assert plan.warmup == math.ceil(bench_timing.WARMUP_S * 1024) and runner.calls[:plan.warmup] == [1] * plan.warmup
    # 1.5 s at 1/1024 s a step (the warm-up's pace): 1,536 steps, in CHUNKS calls of 154
    assert [steps for steps, _ in plan.chunks] == [154] * bench_timing.CHUNKS
    assert sum(seconds for _, seconds in plan.chunks) == 1540 / 1024
    assert runner.done == plan.warmup + 1540, "nothing trained after the budget"


def test_timing_runs_exactly_the_steps_when_they_take_longer_than_the_seconds():
    clock = FakeClock()
    plan = timed(FakeRunner(clock), clock, bench_timing.Budget(steps=35, seconds=0.01, warmup=0))
    steps = [k for k, _ in plan.chunks]
    assert sum(steps) == 35 and max(steps) == 4  # calls of ceil(35 / CHUNKS), the last one shorter
    assert sum(seconds for _, seconds in plan.chunks) >= 0.01


def test_timing_stops_at_the_runs_horizon():
    clock = FakeClock()
    plan = timed(FakeRunner(clock, horizon=50), clock, bench_timing.Budget(steps=20, seconds=10.0, warmup=0))
    assert sum(k for k, _ in plan.chunks) == 50  # not an endless loop once the run is at its last step


@pytest.mark.parametrize("load, busy", [(3.5, True), (1.5, False), (None, False)])
def test_a_load_average_above_the_core_count_marks_the_row_busy(load, busy, monkeypatch):
    monkeypatch.setattr(bench_timing, "load_average", lambda: load)
    monkeypatch.setattr(bench_timing.os, "cpu_count", lambda: 2)
    row = bench_timing.measure("numpy", "tiny", engine.Corpus.from_lines(DOCS),
                        bench_timing.Budget(steps=2, seconds=0, warmup=1, sample_names=0))
    assert (row.load_avg, row.cores, row.busy, row.sample_ms) == (load, 2, busy, None)
    assert row.sample_ms is None and bench_report.table_row(row).split()[7] == "-"  # sample ms column
    assert bench_report.table_row(row).endswith(" busy") == busy
    note = bench_report.busy_note([row, bench.BenchResult("ghost", "-", "skipped")])
    assert note.startswith("warning: the machine was busy during 1 of 1 rows") if busy else note == ""


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown backend 'warp'"):
        bench.availability(["numpy", "warp"])
    with pytest.raises(ValueError, match="unknown backend 'torch'"):
        bench.availability(["torch"], with_torch=False)  # a comparison, not a backend


def test_worker_reports_an_error_row(tmp_path, capsys):
    data = tmp_path / "names.txt"
    data.write_text("\n".join(DOCS), encoding="utf-8")
    spec = {"backend": "numpy", "preset": "no-such-preset", "data": str(data), "steps": 3, "seconds": 0,
            "warmup": 1, "sample_names": 0}
    # a preset the corpus cannot train: the child reports it as the row's error
    assert bench._worker([json.dumps(spec)]) == 0
    row = bench.BenchResult(**json.loads(capsys.readouterr().out))
    assert row.status == "error" and "unknown preset" in row.reason


def test_run_isolated_measures_in_a_child_process(tmp_path):
    data = tmp_path / "names.txt"
    data.write_text("\n".join(DOCS), encoding="utf-8")
    row = bench.run_isolated("numpy", "tiny", data, bench.Budget(steps=4, seconds=0, warmup=1, sample_names=2))
    assert (row.status, row.steps, row.warmup, row.sample_names) == ("ok", 4, 1, 2), row.reason
    assert row.ms_min <= row.ms_per_step <= row.ms_max and row.sample_ms > 0


def test_a_measurement_can_be_polled_and_cancelled(tmp_path):
    """What the scaling study does: start a long measurement, poll, cancel; the child ends."""
    data = tmp_path / "names.txt"
    data.write_text("\n".join(DOCS), encoding="utf-8")
    long = bench.Budget(steps=1, seconds=600)
    with bench.Measurement("numpy", "tiny", data, long) as measurement:
        assert measurement.poll() is None
        started = time.monotonic()
        with pytest.raises(engine.Cancelled, match="measuring numpy at tiny was cancelled"):
            measurement.wait(cancel=lambda: time.monotonic() - started > 0.5)
        assert measurement._proc.returncode is not None  # the child is gone, not left running
        assert measurement.poll().status == "cancelled"
    assert time.monotonic() - started < 60  # nowhere near the 600 s budget


def test_leaving_the_block_cancels_a_running_measurement(tmp_path):
    data = tmp_path / "names.txt"
    data.write_text("\n".join(DOCS), encoding="utf-8")
    with pytest.raises(KeyboardInterrupt):
        with bench.Measurement("numpy", "tiny", data, bench.Budget(steps=1, seconds=600)) as measurement:
            raise KeyboardInterrupt  # Ctrl+C in the parent
    assert measurement._proc.returncode is not None
    assert measurement.poll().status == "cancelled"


@pytest.mark.parametrize("warmup", [0, 15])
def test_torch_reference_matches_the_numpy_backend(warmup):
    """Two independent implementations (autograd + torch.optim.Adam vs the
    hand-written backward and Adam) give the same losses step by step, with
    microgpt's schedule and with a warm-up."""
    pytest.importorskip("torch", reason="PyTorch is optional; the comparison needs it")
    from engine.bench.torch_reference import TorchReference

    corpus = engine.Corpus.from_lines(DOCS)
    model = engine.ModelConfig(n_embd=24, n_layer=2, n_head=3, block_size=8)  # truncates long names
    train = replace(engine.TrainConfig(num_steps=40), learning_rate=0.01, init_std=0.1, seed=5,
                    warmup_steps=warmup)
    ours = engine.open_backend("numpy", model, train, corpus).train(40)
    theirs = TorchReference(model, train, corpus).train(40)
    assert np.isfinite(ours).all() and ours[-10:].mean() < ours[:10].mean()
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_torch_reference_heldout_loss_is_the_numpy_backends():
    """TorchReference's held-out loss (padded, masked autograd forward) equals the
    hand-written backend's at the same steps, with the backends' record and cancel."""
    pytest.importorskip("torch", reason="PyTorch is optional; the comparison needs it")
    from engine.bench.torch_reference import TorchReference

    corpus = engine.Corpus.from_lines(DOCS)
    model = engine.ModelConfig(n_embd=24, n_layer=2, n_head=3, block_size=8)
    train = replace(engine.TrainConfig(num_steps=40), batch_size=2, holdout=4, init_std=0.1, seed=5)
    ours, theirs = engine.open_backend("numpy", model, train, corpus), TorchReference(model, train, corpus)
    ours.train(6), theirs.train(6)
    assert theirs.heldout_loss() == pytest.approx(ours.heldout_loss(), abs=1e-5)
    with pytest.raises(engine.Cancelled):
        theirs.heldout_loss(cancel=lambda: True)
    theirs.heldout_loss()  # the same step again: one entry
    assert [p.step for p in theirs.heldout_history] == [6]


def test_rounds_report_the_median_run_and_the_largest_peak():
    runs = [bench.BenchResult("numpy", "tiny", "ok", ms_per_step=ms, steps_per_s=1e3 / ms, peak_rss_mb=mb)
            for ms, mb in ((3.0, 40.0), (1.0, 60.0), (2.0, 50.0))]
    runs[0].load_avg, runs[0].busy, runs[1].load_avg = 2.5, True, 0.5  # the slowest ran on a busy machine
    row = bench.median_run(runs + [bench.BenchResult("numpy", "tiny", "error", reason="killed")])
    assert (row.ms_per_step, row.steps_per_s, row.peak_rss_mb) == (2.0, 500.0, 60.0)
    assert (row.load_avg, row.busy) == (2.5, True)  # any disturbed run marks the row
    assert row.runs_ms == [3.0, 1.0, 2.0]


def test_each_preset_trains_its_own_batch_unless_told(monkeypatch, tmp_path):
    asked = []

    def fake_run(backend, preset, data, budget, batch=1, to_loss=None):
        asked.append((preset, batch))
        return bench.BenchResult(backend, preset, "ok", batch=batch)

    monkeypatch.setattr(bench, "run_isolated", fake_run)
    bench.run_bench(["numpy"], ["tiny", "learn"], tmp_path / "names.txt")
    assert asked == [("tiny", 1), ("learn", engine.PRESETS["learn"].train.batch_size)]
    asked.clear()
    bench.run_bench(["numpy"], ["tiny", "learn"], tmp_path / "names.txt", batches=[4])
    assert asked == [("tiny", 4), ("learn", 4)]


def test_a_measurement_imports_this_engine_from_any_folder(tmp_path):
    """The child measures the engine that started it, not an installed copy elsewhere
    (its folder is not the repository's when bench runs from another one)."""
    import subprocess
    import sys

    found = subprocess.run([sys.executable, "-c", "import engine; print(engine.__file__)"], cwd=tmp_path,
                           env=bench._worker_env(), capture_output=True, text=True, check=True)
    assert found.stdout.strip() == engine.__file__
