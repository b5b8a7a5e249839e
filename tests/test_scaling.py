"""engine.bench.scaling: the study's plan, its CSV, and the measure function over
engine.bench.measure.run_isolated (the code behind `microgpt-gui bench`)."""
from __future__ import annotations

import csv
import time

import pytest

import engine
from engine.bench import scaling
from engine.bench.measure import BenchResult


def fake_availability(names):
    return {name: (name != "gpu", "no GPU here" if name == "gpu" else "") for name in names}


def test_plan_skips_unavailable_backends_per_preset_with_the_reason():
    study = scaling.plan(["numpy", "gpu", "futhark-c"], ["tiny", "s32"], fake_availability)
    assert [(r.backend, r.preset, r.status, r.reason) for r in study.skipped] == [
        ("gpu", "tiny", "skipped", "no GPU here"), ("gpu", "s32", "skipped", "no GPU here")]
    assert study.jobs == [("numpy", "tiny"), ("futhark-c", "tiny"), ("numpy", "s32"), ("futhark-c", "s32")]


def test_csv_has_a_row_per_result(tmp_path):
    results = [BenchResult("numpy", "tiny", "ok", params=4192, ms_per_step=0.125, steps_per_s=8000.0,
                           load_avg=0.5, cores=2),
               BenchResult("numpy", "s32", "ok", params=27328, ms_per_step=28.0, steps_per_s=35.7,
                           load_avg=5.0, cores=2, busy=True),
               BenchResult("gpu", "tiny", "skipped", reason="no GPU here")]
    scaling.write_csv(tmp_path / "s.csv", results)
    rows = list(csv.DictReader(open(tmp_path / "s.csv", encoding="utf-8")))
    assert rows == [
        {"backend": "numpy", "preset": "tiny", "params": "4192", "ms_per_step": "0.125", "steps_per_s": "8000",
         "status": "ok", "reason": "", "load_avg": "0.50", "busy": ""},
        {"backend": "numpy", "preset": "s32", "params": "27328", "ms_per_step": "28", "steps_per_s": "35.7",
         "status": "ok", "reason": "", "load_avg": "5.00", "busy": "busy"},  # as bench's table flags it
        {"backend": "gpu", "preset": "tiny", "params": "", "ms_per_step": "", "steps_per_s": "",
         "status": "skipped", "reason": "no GPU here", "load_avg": "", "busy": ""}]


def test_isolated_measure_runs_benchs_subprocess(tmp_path, small_corpus):
    data = tmp_path / "names.txt"
    data.write_text("\n".join(small_corpus.docs), encoding="utf-8")
    result = scaling.isolated_measure(data)("numpy", "tiny", 2.0, lambda: False)
    assert result.status == "ok", result.reason
    assert result.params == engine.PRESETS["tiny"].model.num_params(small_corpus.vocab_size)
    assert result.ms_per_step > 0 and result.steps > 0


def test_isolated_measure_kills_the_child_on_cancel(tmp_path, small_corpus):
    """A 60-second measurement cancelled once it runs: Cancelled within about half a second."""
    data = tmp_path / "names.txt"
    data.write_text("\n".join(small_corpus.docs), encoding="utf-8")
    started = time.monotonic()
    with pytest.raises(engine.Cancelled):
        scaling.isolated_measure(data)("numpy", "tiny", 60.0, lambda: time.monotonic() - started > 1.0)
    assert time.monotonic() - started < 1.0 + 0.5

