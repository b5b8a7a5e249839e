"""The run model without Qt: every trigger in every phase (refused ones included),
checked against a table written out here by hand; what Train means; saved or
not; and the autosave clock and pruning."""
import os

import numpy as np

import pytest

import engine
from engine.training import protocol as rs
from engine.training.autosave import AutosaveClock, autosave_path, autosaves, prune_autosaves
from engine.training.run_model import (Phase, Refused, RunModel, TrainChoice, DatasetIdentity, TRANSITIONS, TRIGGERS, allows,
                        next_phase)

N, O, RD, RU, PA, DN, FA, ST = (Phase.NONE, Phase.OPENING, Phase.READY, Phase.RUNNING, Phase.PAUSED,
                                Phase.DONE, Phase.FAILED, Phase.STOPPING)
PHASES = [N, O, RD, RU, PA, DN, FA, ST]
SPEC = rs.RunSpec("numpy", model=engine.PRESETS["tiny"].model, train=engine.TrainConfig(num_steps=100))
SAMPLES = {
    rs.Open: rs.Open(SPEC), rs.Opened: None, rs.Failed: rs.Failed(), rs.Finished: rs.Finished(),
    rs.Closed: rs.Closed(), rs.Pause: rs.Pause(), rs.Resume: rs.Resume(), rs.Stop: rs.Stop(),
    rs.Extend: rs.Extend(200), rs.Sample: rs.Sample(5, 0.5, 0), rs.Save: rs.Save("x.npz"),
    rs.TakeSnapshot: rs.TakeSnapshot(), rs.WantSnapshots: rs.WantSnapshots(True), rs.End: rs.End(),
}
# trigger: the phase after it in        none opening ready running paused done failed stopping
# ("-": refused)
EXPECTED = {
    rs.Open:          [O,  "-", "-", "-", "-", "-", "-", "-"],
    rs.Opened:        ["-", RD, "-", "-", "-", "-", "-", "-"],
    rs.Failed:        ["-", FA, "-", "-", "-", "-", "-", "-"],
    rs.Finished:      ["-", "-", DN, DN, "-", "-", "-", "-"],
    rs.Closed:        ["-", "-", "-", "-", "-", "-", "-", N],
    rs.Pause:         ["-", "-", "-", PA, "-", "-", "-", "-"],
    rs.Resume:        ["-", "-", RU, "-", RU, RU, "-", "-"],
    rs.Stop:          ["-", "-", DN, DN, DN, "-", "-", "-"],
    rs.Extend:        ["-", "-", RD, "-", "-", DN, "-", "-"],
    rs.Sample:        ["-", "-", RD, RU, PA, DN, "-", "-"],
    rs.Save:          ["-", "-", RD, RU, PA, DN, "-", "-"],
    rs.TakeSnapshot:  ["-", "-", RD, RU, PA, DN, "-", "-"],
    rs.WantSnapshots: [N, O, RD, RU, PA, DN, FA, ST],
    rs.End:           [N, ST, ST, ST, ST, ST, ST, ST],
}


def test_the_table_covers_every_trigger():
    assert set(EXPECTED) == set(TRIGGERS) == set(SAMPLES)
    assert set(TRANSITIONS) == set(PHASES)


@pytest.mark.parametrize("phase", PHASES, ids=str)
@pytest.mark.parametrize("trigger", sorted(EXPECTED, key=lambda t: t.__name__), ids=lambda t: t.__name__)
def test_every_trigger_in_every_phase(phase, trigger):
    expected = EXPECTED[trigger][PHASES.index(phase)]
    if expected == "-":
        assert not allows(phase, trigger)
        with pytest.raises(Refused, match=f"{trigger.__name__} is not possible while the run is {phase.value}"):
            next_phase(phase, trigger)
    else:
        assert allows(phase, trigger)
        assert next_phase(phase, trigger) is expected


@pytest.mark.parametrize("phase", PHASES, ids=str)
@pytest.mark.parametrize("trigger", sorted(EXPECTED, key=lambda t: t.__name__), ids=lambda t: t.__name__)
def test_the_model_applies_the_table_and_refuses_without_changing(phase, trigger):
    model, seen = RunModel(phase=phase), []
    model.subscribe(lambda m, what: seen.append(what))
    expected = EXPECTED[trigger][PHASES.index(phase)]
    instance = SAMPLES[trigger] or trigger
    if expected == "-":
        with pytest.raises(Refused):
            model.apply(instance)
        assert model.phase is phase and seen == []
    else:
        assert model.apply(instance) is expected
        assert ("phase" in seen) == (expected is not phase)


def opened_model(step=0, num_steps=100, from_checkpoint=False, phase=DN):
    model = RunModel()
    model.apply(rs.Open(SPEC))
    info = rs.RunInfo("numpy", SPEC.model, engine.TrainConfig(num_steps=num_steps), 1000, 27, 10, step)
    model.opened(rs.Opened(info, from_checkpoint), None, "run.npz" if from_checkpoint else None)
    model.apply(rs.Opened(info, from_checkpoint))
    model.report(phase)
    return model


def test_unsaved_means_trained_since_the_last_save_or_load():
    model = opened_model()
    assert not model.unsaved  # a new run at step 0 has nothing to lose
    model.trained_to(40)
    assert model.unsaved
    model.saved("a.npz", 40)
    assert not model.unsaved and model.saved_path == "a.npz"
    model.trained_to(41)
    assert model.unsaved
    loaded = opened_model(step=30, from_checkpoint=True)
    assert not loaded.unsaved and loaded.saved_path == "run.npz"
    loaded.apply(rs.End())
    assert not loaded.unsaved  # an ended run has no model left to save
    running = opened_model(phase=RU)
    assert running.step == 0 and running.unsaved  # training: steps are being made before they are reported
    resumed = opened_model(step=30, from_checkpoint=True, phase=RU)
    assert resumed.unsaved


def test_an_ended_run_ignores_its_last_reports_then_forgets_everything():
    model = opened_model(step=10, phase=RU)
    model.apply(rs.End())
    model.report(DN)  # queued before the end
    assert model.phase is ST
    model.apply(rs.Closed())
    assert model.phase is N and model.train is None and model.step == 0 and model.dataset is None


def test_train_means_pause_resume_continue_or_new():
    train = engine.TrainConfig(num_steps=100)
    tiny = SPEC.model
    assert opened_model(step=0, phase=RU).train_choice("numpy", tiny, train) is TrainChoice.PAUSE
    assert opened_model(step=5, phase=PA).train_choice("numpy", tiny, train) is TrainChoice.RESUME
    stopped = opened_model(step=40)
    assert stopped.train_choice("numpy", tiny, train) is TrainChoice.RESUME
    assert stopped.train_choice("numpy", tiny, engine.TrainConfig(num_steps=300)) is TrainChoice.CONTINUE
    assert stopped.train_choice("numpy", tiny, engine.TrainConfig(num_steps=30)) is TrainChoice.NEW  # below the step
    finished = opened_model(step=100)
    assert finished.train_choice("numpy", tiny, train) is TrainChoice.NEW
    assert finished.train_choice("numpy", tiny, engine.TrainConfig(num_steps=200)) is TrainChoice.CONTINUE
    assert finished.train_choice("numpy", tiny, engine.TrainConfig(num_steps=200, learning_rate=0.02)) \
        is TrainChoice.NEW
    assert finished.train_choice("cupy", tiny, engine.TrainConfig(num_steps=200)) is TrainChoice.NEW
    assert finished.train_choice("numpy", engine.PRESETS["s32"].model, train) is TrainChoice.NEW
    assert not finished.allows(rs.Resume()) and stopped.allows(rs.Resume())
    assert not stopped.allows(rs.Extend(39)) and stopped.allows(rs.Extend(40))
    assert RunModel(phase=O).train_choice("numpy", tiny, train) is TrainChoice.WAIT
    assert RunModel().train_choice("numpy", tiny, train) is TrainChoice.NEW


def test_extending_changes_only_the_number_of_steps():
    model = opened_model(step=100)
    model.extended(250)
    assert model.train == engine.TrainConfig(num_steps=250) and not model.finished


def test_dataset_identity_is_the_content():
    a = engine.Corpus(["ann", "bob", "cy"])
    same = engine.Corpus.from_training_order(a.docs, a.chars)
    other = engine.Corpus(["ann", "bob", "cz"])
    ia, isame, iother = (DatasetIdentity.of(c, n) for c, n in ((a, "a.txt"), (same, "ck"), (other, "a.txt")))
    assert ia.same_content(isame) and not ia.same_content(iother) and not ia.same_content(None)
    assert (ia.num_docs, ia.vocab_size) == (3, len(a.chars) + 1)


def test_the_autosave_clock_counts_training_time():
    clock = AutosaveClock(minutes=2)
    assert not clock.due(119.0) and clock.due(120.0)
    clock.restart(120.0)
    assert not clock.due(200.0) and clock.due(240.0)
    assert not AutosaveClock(0).due(1e9)


def test_pruning_keeps_the_newest_autosaves(tmp_path):
    paths = [autosave_path(tmp_path, "run 1: tiny", step, now=1_700_000_000 + step) for step in range(5)]
    for age, path in enumerate(paths):
        path.write_bytes(b"x")
        os.utime(path, (1_700_000_000 + age, 1_700_000_000 + age))
    (tmp_path / "mine.npz").write_bytes(b"keep")  # not an autosave: never touched
    assert paths[0].name.startswith("autosave-run_1_tiny-") and paths[0].name.endswith("-step0.npz")
    removed = prune_autosaves(tmp_path, keep=2)
    assert sorted(removed) == sorted(paths[:3])
    assert autosaves(tmp_path) == [paths[4], paths[3]]
    assert (tmp_path / "mine.npz").exists()


def test_extending_a_backend_is_resuming_its_checkpoint_with_more_steps(tmp_path):
    from engine.training.run_model import extend_backend

    corpus = engine.Corpus(["anna", "bob", "carla", "dave", "emma", "fred"] * 5)
    model = engine.ModelConfig(n_embd=8, n_layer=1, n_head=2, block_size=8)
    backend = engine.open_backend("numpy", model, engine.TrainConfig(num_steps=20), corpus)
    backend.train(20)
    engine.save_checkpoint(tmp_path / "run.npz", backend)
    extended = extend_backend(backend, 45)
    assert backend.step == 20 and backend.train_config.num_steps == 20  # the old one is left as it was
    assert extended.train_config.num_steps == 45 and extended.step == 20
    np.testing.assert_array_equal(extended.loss_history, backend.loss_history)
    reference = engine.load_checkpoint(tmp_path / "run.npz", num_steps=45)
    np.testing.assert_array_equal(extended.train(25), reference.train(25))
