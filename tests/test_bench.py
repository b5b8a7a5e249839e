"""engine.bench's measurement, and the PyTorch reference it compares against."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

import engine
from engine import bench

DOCS = ["emma", "olivia", "ava", "isabella", "sophia", "charlotte", "mia", "amelia", "harper",
        "evelyn", "abigail", "emily", "elizabeth", "mila", "ella", "avery", "sofia", "camila"]


def test_measure_reports_a_consistent_row():
    corpus = engine.Corpus.from_lines(DOCS)
    row = bench.measure("numpy", "tiny", corpus, steps=7, warmup=2)
    assert (row.status, row.steps, row.warmup) == ("ok", 7, 2)
    assert row.params == engine.ModelConfig(16, 1, 4, 16).num_params(corpus.vocab_size)
    assert row.steps_per_s == pytest.approx(1e3 / row.ms_per_step)
    assert row.peak_rss_mb > 1 or math.isnan(row.peak_rss_mb)


def test_chunks_split_the_steps_evenly():
    assert bench._chunks(23, 10) == [3, 3, 3, 2, 2, 2, 2, 2, 2, 2]
    assert bench._chunks(4, 4) == [1, 1, 1, 1]


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown backend 'warp'"):
        bench.availability(["numpy", "warp"])


def test_worker_reports_an_error_row(tmp_path, capsys):
    data = tmp_path / "names.txt"
    data.write_text("\n".join(DOCS), encoding="utf-8")
    # a preset the corpus cannot train: the child reports it as the row's error
    assert bench._worker(["numpy", "no-such-preset", str(data), "3", "1"]) == 0
    row = bench.BenchResult(**json.loads(capsys.readouterr().out))
    assert row.status == "error" and "unknown preset" in row.reason


def test_torch_reference_matches_the_numpy_backend():
    """Two independent implementations (autograd + torch.optim.Adam vs the
    hand-written backward and Adam) give the same losses step by step."""
    pytest.importorskip("torch", reason="PyTorch is optional; the comparison needs it")
    from engine.torch_reference import TorchReference

    corpus = engine.Corpus.from_lines(DOCS)
    model = engine.ModelConfig(n_embd=24, n_layer=2, n_head=3, block_size=8)  # truncates long names
    train = replace(engine.TrainConfig(num_steps=40), learning_rate=0.01, init_std=0.1, seed=5)
    ours = engine.open_backend("numpy", model, train, corpus).train(40)
    theirs = TorchReference(model, train, corpus).train(40)
    assert np.isfinite(ours).all() and ours[-10:].mean() < ours[:10].mean()
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_rounds_report_the_median_run_and_the_largest_peak():
    runs = [bench.BenchResult("numpy", "tiny", "ok", ms_per_step=ms, steps_per_s=1e3 / ms, peak_rss_mb=mb)
            for ms, mb in ((3.0, 40.0), (1.0, 60.0), (2.0, 50.0))]
    row = bench.median_run(runs + [bench.BenchResult("numpy", "tiny", "error", reason="killed")])
    assert (row.ms_per_step, row.steps_per_s, row.peak_rss_mb) == (2.0, 500.0, 60.0)
    assert row.runs_ms == [3.0, 1.0, 2.0]
