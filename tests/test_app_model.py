"""The application model (engine.app), without Qt: the dataset's state, the
settings, the backend selection with auto's choice and its background build,
and what Train does, on real datasets and real configs."""
from __future__ import annotations

import functools
import time
from dataclasses import replace

import numpy as np
import pytest

import engine
from engine.app import AppModel, Change
from engine.app.model import NO_DATASET, READING
from engine.backends import prebuild
from engine.backends import speeds as sp
from engine.backends.choice import AUTO, choose_backend
from engine.config import get_preset
from engine.data.corpus import CACHE_DIR_ENV
from engine.futhark import cc
from engine.training import protocol as rs
from engine.training.run_model import DatasetIdentity, Phase, TrainChoice
from futhark_support import hide_futhark

TINY, S256 = get_preset("tiny"), get_preset("s256")
CPU = [engine.BackendInfo(name, True, "") for name in ("numpy", "futhark-c", "futhark-multicore")]
needs_cc = pytest.mark.skipif(cc.find_c_compiler() is None, reason=cc.NO_C_COMPILER)


def speeds(vocab=27):
    """futhark-c the fastest at tiny, numpy at s256 batch 32 (as the shipped table has it)."""
    p_tiny, p_s256 = TINY.model.num_params(vocab), S256.model.num_params(vocab)
    rows = [("numpy", "tiny", p_tiny, 1, 0.30), ("futhark-c", "tiny", p_tiny, 1, 0.08),
            ("futhark-multicore", "tiny", p_tiny, 1, 0.11), ("numpy", "s256", p_s256, 32, 45.0),
            ("futhark-c", "s256", p_s256, 32, 260.0), ("futhark-multicore", "s256", p_s256, 32, 130.0)]
    return [sp.Speed(b, preset, p, batch, ms, "2026-12-01", sp.SHIPPED_SOURCE) for b, preset, p, batch, ms in rows]


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """Nothing built; no Futhark compiler (the shipped C is what builds)."""
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("MICROGPT_FUTHARK_THREADS", raising=False)
    hide_futhark(monkeypatch, tmp_path)
    return tmp_path / "cache"


def make_model(**kwargs):
    model = AppModel(CPU, choose=functools.partial(choose_backend, speeds=speeds()), **kwargs)
    changes = []
    model.subscribe(lambda m, change, subject: changes.append(change))
    return model, changes


def names():
    path = engine.default_dataset_path()
    corpus = engine.load_corpus(path)
    return str(path), corpus, DatasetIdentity.of(corpus, "names.txt")


def test_the_dataset_is_read_then_used_and_train_says_why_not_until_then():
    model, changes = make_model()
    assert model.train_problem() == NO_DATASET
    path, corpus, identity = names()
    model.begin_reading(path)
    assert model.dataset.reading == path and model.train_problem() == READING
    model.use_dataset(path, corpus, identity)
    assert (model.dataset.corpus, model.dataset.identity, model.dataset.reading) == (corpus, identity, None)
    assert model.dataset.name == "names.txt" and model.vocab_size == 27 == len(corpus.chars) + 1
    assert model.train_problem() == ""
    assert changes[:2] == [Change.DATASET, Change.DATASET]


def test_a_failed_read_keeps_the_dataset_in_use_and_says_why(tmp_path):
    model, _ = make_model()
    path, corpus, identity = names()
    model.use_dataset(path, corpus, identity)
    bad = tmp_path / "empty.txt"
    bad.write_text("\n")
    model.begin_reading(str(bad))
    with pytest.raises(engine.DatasetError) as caught:
        engine.load_corpus(bad)
    model.reading_failed(str(bad), str(caught.value))
    assert model.dataset.corpus is corpus and model.dataset.problem == str(caught.value)
    assert model.train_problem() == ""


def test_presets_and_invalid_fields_write_the_settings_and_train_names_the_engines_reason():
    model, changes = make_model()
    path, corpus, identity = names()
    model.use_dataset(path, corpus, identity)
    model.select_preset("s256")
    assert (model.settings.preset, model.settings.model, model.settings.train) == ("s256", S256.model, S256.train)
    with pytest.raises(ValueError) as caught:
        engine.ModelConfig(n_embd=30, n_layer=1, n_head=4, block_size=16)
    model.set_configs(None, S256.train, problem=str(caught.value))
    assert model.train_problem() == str(caught.value)
    assert model.choice() is None and model.backend_label() == AUTO
    with pytest.raises(ValueError):
        model.select_preset("no-such-preset")


def test_auto_is_selected_first_and_its_label_follows_preset_and_batch():
    model, changes = make_model()
    assert model.backend == AUTO
    assert model.backend_label() == "auto: futhark-c"  # tiny, batch 1
    model.select_preset("s256")
    changes.clear()
    model.set_configs(S256.model, replace(S256.train, batch_size=32))
    assert Change.BACKEND in changes
    assert model.backend_label() == "auto: numpy"
    assert model.choice().reason.startswith("45 ms/step at s256, batch 32 against futhark-multicore's 130")
    assert model.select_backend("futhark-c") and model.backend_label() == "futhark-c"
    assert not model.select_backend("cupy") and model.backend == "futhark-c"


def test_train_resumes_a_run_auto_opened_on_another_backend_than_its_choice():
    model, _ = make_model()
    path, corpus, identity = names()
    model.use_dataset(path, corpus, identity)
    run = model.run
    spec = rs.RunSpec("numpy", corpus, TINY.model, TINY.train)
    model.run_by_auto = True
    run.apply(rs.Open(spec))
    info = rs.RunInfo("numpy", TINY.model, TINY.train, TINY.model.num_params(27), 27, len(corpus), 0)
    run.opened(rs.Opened(info, False), identity)
    run.report(Phase.READY)
    model.run_opened(TINY.model, TINY.train, "numpy")
    assert model.backend == AUTO  # auto stays selected though the run trains on numpy
    assert model.backend_for_run() == "numpy" and model.train_choice() == TrainChoice.RESUME
    model.select_backend("futhark-c")
    assert model.train_choice() == TrainChoice.NEW


def test_an_explicit_backend_opens_as_is_and_the_run_selects_its_backend():
    model, _ = make_model()
    path, corpus, identity = names()
    model.use_dataset(path, corpus, identity)
    assert model.select_backend("numpy")
    spec, lines = model.new_run()
    assert (spec.backend, spec.corpus, spec.model, spec.train, lines) == ("numpy", corpus, TINY.model, TINY.train, [])
    assert model.build is None
    model.run_opened(TINY.model, TINY.train, "futhark-c")  # a checkpoint's, say
    assert model.backend == "futhark-c"


@needs_cc
def test_auto_trains_on_numpy_while_its_choice_builds_and_chooses_it_again_when_the_build_ends(empty_cache):
    """A real background build (cancelled here: a cancel is an ending like any other)."""
    model, changes = make_model()
    posted = []
    model.post = posted.append  # the watcher thread's call waits for the model's own thread
    path, corpus, identity = names()
    model.use_dataset(path, corpus, identity)
    choice = model.choice()
    assert (choice.backend, choice.built, choice.now) == ("futhark-c", False, "numpy")
    spec, lines = model.new_run()
    try:
        assert spec.backend == "numpy" and model.run_by_auto
        assert lines[0] == choice.text()
        assert lines[1].startswith("futhark-c is not built yet (its first use compiles C, about ")
        assert lines[1].endswith("; the next run uses futhark-c")
        assert model.build is not None and model.build.backend == "futhark-c"
        assert model.build_status().startswith("building futhark-c in the background (first use, about")
        first = model.build
        _, again = model.new_run()  # a second run while it builds: the same build, said again
        assert model.build is first and again[1] == lines[1]
    finally:
        model.build.cancel()
    deadline = time.monotonic() + 30
    while not posted and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(posted) == 1 and model.build_message == ""
    changes.clear()
    posted[0]()
    assert changes == [Change.BACKEND]
    assert model.build_message == "the build of futhark-c was cancelled"
    assert model.build_status() == "" and model.choice().now == "numpy"  # still not built: numpy again
    assert prebuild.last_failure("c") == ""


def open_run(model, corpus, identity, train=TINY.train, from_checkpoint=False, path=None, step=0):
    """An opening as the window's run controller reports it: the Open command, then the worker's Opened."""
    run = model.run
    if run.phase != Phase.NONE:
        run.apply(rs.End())
        run.apply(rs.Closed())
    checkpoint = object() if from_checkpoint else None
    run.apply(rs.Open(rs.RunSpec("numpy", corpus, TINY.model, train, checkpoint=checkpoint)))
    info = rs.RunInfo("numpy", TINY.model, train, TINY.model.num_params(27), 27, len(corpus), step, holdout=100)
    model.opening(identity, path)
    model.report(rs.Opened(info, from_checkpoint))  # the run model opens it, then its record


def test_the_runs_records_grow_from_the_workers_events_and_a_reloaded_checkpoint_continues_its_run():
    from engine.app.runs import RunChange

    model, changes = make_model()
    runs = []
    model.subscribe(lambda m, change, subject: change == Change.RUNS and runs.append(subject))
    path, corpus, identity = names()
    backend = engine.open_backend("numpy", TINY.model, replace(TINY.train, holdout=100), corpus)
    losses = backend.train(30)
    open_run(model, corpus, identity)
    record = model.runs.current
    assert runs[0] == (RunChange.ADDED, record) and record.name == "run 1" and record.dataset == "names.txt"
    assert record.train.holdout == 100 and record.dataset_hash == identity.content_hash
    model.report(rs.PhaseChanged(Phase.RUNNING))
    model.report(rs.Losses(list(losses[:20]), 0, 0.02))
    model.report(rs.Saved("/tmp/run1.npz", 20, False))
    model.report(rs.Losses(list(losses[20:]), 20, 0.01))
    assert record.steps == 30 and record.losses.tolist() == [float(x) for x in np.float32(losses)]
    assert record.status == "running"
    model.report(rs.PhaseChanged(Phase.DONE))
    assert record.status == "stopped" and model.run.step == 30  # 30 of the preset's 1,000 steps
    # the checkpoint saved at step 20, loaded: the same run's record, rewound to step 20
    open_run(model, corpus, identity, from_checkpoint=True, path="/tmp/run1.npz", step=20)
    assert model.runs.current is record and model.runs.records == [record] and record.status == "loaded"
    model.report(rs.Losses(list(losses[:20]), 0, float("nan")))  # the checkpoint's history, untimed
    assert record.steps == 20 and not np.isnan(record.step_seconds).any()  # its step times kept
    model.runs.remove([record])
    assert model.runs.records == [] and runs[-1] == (RunChange.REMOVED, [record])
    model.report(rs.Losses(list(losses[20:25]), 20, 0.005))  # off the list, the run on show still grows
    assert model.runs.current is record and record.steps == 25
    open_run(model, corpus, identity)  # the run before ends: let go of, compacted, ended
    assert runs[-3:-1] == [(RunChange.ENDING, record), (RunChange.ENDED, record)] and record.status == "loaded"
    assert model.runs.current.name == "run 2"  # names stay unique after a removal


def test_results_pass_through_the_model_to_whoever_shows_them():
    model, changes = make_model()
    results = []
    model.subscribe(lambda m, change, subject: change == Change.RESULT and results.append(subject))
    samples = rs.Samples(["emma"], 10, prefix="em")
    model.report(samples)
    model.report(rs.Status("hello"))
    assert results == [samples]
