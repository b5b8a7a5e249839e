"""A sweep trial's reporting (engine.sweep.trial.Reporter) on the engine's
training loop, in this process: what reaches Tune's report() against the
same run trained directly on a backend (the same seed and data order give the
same losses, held-out losses and parameters). Tune's report is stood in for
by a function that keeps what it is given and copies each checkpoint folder,
as Tune persists it; tests/test_sweep_ray.py runs trials on a real Ray."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import diverging_backend
import engine
from engine.sweep.spec import run_configs
from engine.sweep.trial import CHECKPOINT_FILE, Reporter, TrialBase, TrialFailed, _open_spec
from engine.training.checkpoint import read_checkpoint

SETTINGS = {"preset": "tiny", "steps": 3000, "seed": 3}


class Reports:
    """report(metrics, checkpoint=None): kept, each checkpoint folder copied (Tune copies it into
    the sweep's folder, then the trial deletes its own)."""

    def __init__(self, folder: Path):
        self.folder, self.metrics, self.checkpoints = folder, [], []

    def report(self, metrics, checkpoint=None):
        self.metrics.append(dict(metrics))
        self.checkpoints.append(checkpoint)

    def make_checkpoint(self, path):
        copy = self.folder / f"checkpoint_{len(self.checkpoints)}"
        shutil.copytree(path, copy)
        return copy


def trial_base(corpus, **fields) -> TrialBase:
    settings = {"report_every_s": 0.02, "milestones": (1000, 2000), **fields}
    return TrialBase(run=dict(SETTINGS), docs=tuple(corpus.docs), chars=tuple(corpus.chars), **settings)


def run_reporter(base, tmp_path, settings=SETTINGS, checkpoint=None, backend=None):
    reports = Reports(tmp_path)
    reporter = Reporter(base, reports.report, reports.make_checkpoint, node="node-a")
    name, model, train = run_configs(settings)
    reporter.run(_open_spec(backend or name, model, train, base, checkpoint, reporter))
    return reporter, reports


@pytest.fixture(scope="module")
def direct(names_corpus):
    """The trial's run trained on the NumPy backend directly: its losses, and its held-out loss
    and parameters at the end."""
    _, model, train = run_configs(SETTINGS)
    backend = engine.open_backend("numpy", model, train, names_corpus)
    try:
        backend.train(train.num_steps)
        return backend.loss_history, backend.heldout_loss(), backend.get_state().params
    finally:
        backend.close()


def test_each_chunk_is_reported_with_the_newest_held_out_loss(names_corpus, direct, tmp_path):
    losses, heldout, params = direct
    reporter, reports = run_reporter(trial_base(names_corpus), tmp_path)
    metrics = reports.metrics
    assert len(metrics) >= 3
    step = 0
    for m in metrics:  # chunks in order, each from where the last ended, as block means
        assert m["first_step"] == step < m["step"] and m["names_seen"] == m["step"]
        chunk = losses[m["first_step"]:m["step"]]
        block = m["block"]
        expected = [chunk[i:i + block].mean() for i in range(0, len(chunk), block)]
        np.testing.assert_allclose(m["losses"], expected, rtol=1e-6)
        assert np.isfinite(m["heldout_loss"]) and m["node"] == "node-a" and not m["diverged"]
        step = m["step"]
    assert step == 3000 and [m["finished"] for m in metrics] == [False] * (len(metrics) - 1) + [True]
    # every evaluation reported once, by step; the last at the last step, as the backend computes it
    points = [p for m in metrics for p in m["heldout"]]
    assert [s for s, _ in points] == sorted({s for s, _ in points})
    assert points[-1][0] == 3000 and points[-1][1] == pytest.approx(heldout, rel=1e-6)
    assert metrics[-1]["heldout_loss"] == points[-1][1]
    assert metrics[-1]["train_seconds"] == pytest.approx(reporter.train_seconds) and reporter.train_seconds > 0


def test_checkpoints_at_the_rungs_and_the_end_load(names_corpus, direct, tmp_path):
    _, _, params = direct
    _, reports = run_reporter(trial_base(names_corpus), tmp_path)
    saved = [(m, c) for m, c in zip(reports.metrics, reports.checkpoints) if c is not None]
    assert len(saved) == 3  # past 1,000 names, past 2,000, and at the end
    for (m, folder), rung in zip(saved, (1000, 2000, 3000)):
        ck = read_checkpoint(Path(folder) / CHECKPOINT_FILE)
        assert rung <= ck.step and ck.step <= m["step"] + 4096  # saved after the chunk it crossed in
        assert (Path(folder) / "trial.json").is_file()
    final = read_checkpoint(Path(saved[-1][1]) / CHECKPOINT_FILE)
    assert final.step == 3000 and saved[-1][0]["finished"]
    np.testing.assert_array_equal(final.params, params)
    assert final.heldout[-1].step == 3000
    # a checkpoint loads and samples as the window's would
    backend = engine.load_checkpoint(final)
    try:
        names = backend.sample(5, 0.5, 0)
    finally:
        backend.close()
    assert len(names) == 5 and all(isinstance(n, str) for n in names)


def test_the_report_asha_compares_at_a_rung_carries_a_loss_evaluated_there(names_corpus, tmp_path):
    """ASHA compares a trial's first report at or past a rung (names seen): the loop evaluated
    the held-out loss at the rung's step, and that report carries it (or a newer one)."""
    _, model, train = run_configs(SETTINGS)
    backend = engine.open_backend("numpy", model, train, names_corpus)
    try:
        at_rung = {}
        for rung in (1000, 2000):
            backend.train(rung - backend.step)
            at_rung[rung] = backend.heldout_loss()
    finally:
        backend.close()
    reporter, reports = run_reporter(trial_base(names_corpus), tmp_path)
    assert reporter.loop.settings.heldout_at_names == (1000, 2000)
    for rung, loss in at_rung.items():
        first = next(i for i, m in enumerate(reports.metrics) if m["names_seen"] >= rung)
        points = [p for m in reports.metrics[:first + 1] for p in m["heldout"]]
        assert [rung, pytest.approx(loss, rel=1e-6)] in points
        newest = points[-1]
        assert newest[0] >= rung and reports.metrics[first]["heldout_loss"] == newest[1]
    # rungs counted in seconds: no step to end a chunk at; the schedule alone evaluates
    base = trial_base(names_corpus, time_attr="train_seconds", milestones=(0.05, 1e9))
    reporter, by_time = run_reporter(base, tmp_path / "by-time")
    assert reporter.loop.settings.heldout_at_names == () and by_time.metrics[-1]["finished"]
    assert sum(c is not None for c in by_time.checkpoints) == 2  # the rung's, and the end's


def test_a_resumed_trial_goes_on_from_its_checkpoint(names_corpus, direct, tmp_path):
    tune = pytest.importorskip("ray.tune", reason="a Tune checkpoint needs Ray: pip install -e '.[test]'")

    losses, heldout, params = direct
    _, first = run_reporter(trial_base(names_corpus), tmp_path / "first")
    folder = next(c for c in first.checkpoints if c is not None)  # the first rung's
    start = read_checkpoint(Path(folder) / CHECKPOINT_FILE).step
    reporter, again = run_reporter(trial_base(names_corpus), tmp_path / "again",
                                   checkpoint=tune.Checkpoint.from_directory(str(folder)))
    assert 0 < start < 3000 and again.metrics[0]["first_step"] == start
    for m in again.metrics:  # the same losses as the uninterrupted run from there on
        chunk = losses[m["first_step"]:m["step"]]
        expected = [chunk[i:i + m["block"]].mean() for i in range(0, len(chunk), m["block"])]
        np.testing.assert_allclose(m["losses"], expected, rtol=1e-6)
    assert again.metrics[-1]["step"] == 3000 and again.metrics[-1]["heldout_loss"] == pytest.approx(heldout)
    final = read_checkpoint(Path(again.checkpoints[-1]) / CHECKPOINT_FILE)
    np.testing.assert_array_equal(final.params, params)
    # the training time goes on from the checkpoint's
    saved_s = json.loads((Path(folder) / "trial.json").read_text())["train_seconds"]
    assert again.metrics[0]["train_seconds"] > saved_s > 0


def test_a_diverging_trial_reports_the_worst_loss_and_ends(names_corpus, tmp_path, monkeypatch):
    from engine.backends import _REGISTRY

    monkeypatch.setitem(_REGISTRY, diverging_backend.NAME, (diverging_backend.probe, diverging_backend.opener))
    reporter, reports = run_reporter(trial_base(names_corpus), tmp_path, backend="diverging")
    last = reports.metrics[-1]
    assert last["diverged"] and not last["finished"] and last["heldout_loss"] == float("inf")
    assert last["step"] == 1500  # the steps before the bad one are kept
    assert all(np.isfinite(m["heldout_loss"]) for m in reports.metrics[:-1])


def test_a_trial_that_cannot_open_fails_with_the_reason(names_corpus, tmp_path):
    with pytest.raises(TrialFailed, match="unknown backend 'nope'"):
        run_reporter(trial_base(names_corpus), tmp_path, backend="nope")
    with pytest.raises(TrialFailed, match="holds out no documents"):
        run_reporter(trial_base(names_corpus), tmp_path, settings={**SETTINGS, "holdout": 0})
