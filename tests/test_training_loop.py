"""engine.training.loop.TrainingLoop driven without Qt: the loop in a thread of its
own (as the window runs it) or in the caller's (as demo and bench do), on the
real NumPy backend at tiny, and on GatedBackend, a NumPy backend whose train,
held-out evaluation and sampling wait at gates the test opens, for the cases
that depend on what arrives while a call is in progress.

Every number is checked against the engine trained directly (a backend's own
train(k) and heldout_loss at the same step): the loop must not change what
is computed, only when."""
from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest

import engine
from engine import Corpus, TrainConfig, get_preset, open_backend, read_checkpoint
from engine.backends.numpy_backend import NumpyBackend
from engine.training import protocol as rs
from engine.training.loop import SAVING, LoopSettings, TrainingLoop, open_runner
from engine.training.run_model import Phase, extend_backend

TIMEOUT = 30.0  # seconds: a deadline against a hung test, never a timing assertion
TINY = get_preset("tiny").model
NAMES = ["emma", "olivia", "ava", "isabella", "sophia", "charlotte", "mia", "amelia", "harper", "evelyn",
         "abigail", "emily", "elizabeth", "mila", "ella", "avery", "sofia", "camila", "aria", "scarlett"]
TRAIN = TrainConfig(num_steps=60, learning_rate=0.01, holdout=4, seed=3)


def corpus() -> Corpus:
    return Corpus(NAMES, shuffled=True)


def spec(train: TrainConfig = TRAIN, backend: str = "numpy", **kw) -> rs.RunSpec:
    return rs.RunSpec(backend, corpus(), TINY, train, **kw)


class Events:
    """emit: every event, in order, with a wait for a condition on them."""

    def __init__(self, on_event=None):
        self.items: list[rs.Event] = []
        self._changed = threading.Condition()
        self._on_event = on_event

    def __call__(self, event: rs.Event) -> None:
        with self._changed:
            self.items.append(event)
            self._changed.notify_all()
        if self._on_event is not None:
            self._on_event(event)

    def wait_for(self, predicate, what: str) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: predicate(self), TIMEOUT), f"no {what} in {self.items}"

    def of(self, kind) -> list:
        return [e for e in list(self.items) if isinstance(e, kind)]

    def phases(self) -> list[Phase]:
        return [e.phase for e in self.of(rs.PhaseChanged)]

    def losses(self) -> np.ndarray:
        """The losses trained in this run (a checkpoint's history, sent before the
        first phase change, left out), checked to be contiguous."""
        items = list(self.items)
        opened = next((i for i, e in enumerate(items) if isinstance(e, rs.PhaseChanged)), len(items))
        chunks = [e for e in items[opened:] if isinstance(e, rs.Losses)]
        for before, after in zip(chunks, chunks[1:]):
            assert after.first_step == before.first_step + len(before.losses), "chunks not contiguous"
        return np.concatenate([e.losses for e in chunks]) if chunks else np.empty(0, np.float32)


def started(loop: TrainingLoop) -> threading.Thread:
    thread = threading.Thread(target=loop.run, name="training-loop", daemon=True)
    thread.start()
    return thread


def joined(thread: threading.Thread) -> None:
    thread.join(TIMEOUT)
    assert not thread.is_alive(), "run() did not return"


def trained(steps: int, train: TrainConfig = TRAIN):
    """The reference: the engine's backend trained directly."""
    backend = open_backend("numpy", TINY, train, corpus())
    backend.train(steps)
    return backend


def heldout_at(steps: int, train: TrainConfig = TRAIN) -> float:
    backend = trained(steps, train)
    return backend.heldout_loss()


class Gate:
    """A point a backend call waits at until the test opens it; `reached` says it got there."""

    def __init__(self, closed: bool = False):
        self.reached, self._open = threading.Event(), threading.Event()
        if not closed:
            self._open.set()

    def close(self) -> None:
        """From now on a call waits here (and says so by reached)."""
        self.reached.clear()
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def wait(self) -> None:
        if not self._open.is_set():
            self.reached.set()
        assert self._open.wait(TIMEOUT), "a gate was never opened"


class GatedBackend(NumpyBackend):
    """NumPy's backend with gates before each train(k) call, each held-out batch and
    sampling (which polls cancel while it waits, like a long sampling run)."""

    name = "gated"

    def __init__(self, model, train, corpus, params=None, gates=None):
        self.gates = gates or {}
        self.calls = {"train": 0, "doc_losses": 0}
        super().__init__(model, train, corpus, params)

    def _gate(self, what: str):
        return self.gates.get(what)

    def _train_steps(self, k):
        self.calls["train"] += 1
        if gate := self._gate("train"):
            gate.wait()
        return super()._train_steps(k)

    def _doc_losses(self, batch):
        self.calls["doc_losses"] += 1
        if gate := self._gate("doc_losses"):
            gate.wait()
        return super()._doc_losses(batch)

    def _sample_ids(self, num_samples, temperature, seed, prefix, cancel=None, *, max_length):
        if gate := self._gate("sample"):
            gate.reached.set()
            while not gate._open.wait(0.005):
                if cancel is not None and cancel():
                    raise engine.Cancelled("sampling was cancelled")
        return super()._sample_ids(num_samples, temperature, seed, prefix, cancel, max_length=max_length)


def gated(gates: dict, holder: list | None = None):
    """A LoopSettings.opener that opens a GatedBackend (kept in holder)."""
    def opener(s: rs.RunSpec):
        backend = GatedBackend(s.model, s.train, s.corpus, gates=gates)
        if holder is not None:
            holder.append(backend)
        return backend
    return opener


# a whole run ------------------------------------------------------------------------------

def test_a_run_to_its_end_reports_what_the_engine_computes():
    events = Events()
    TrainingLoop(spec(), events, LoopSettings(end_when_finished=True)).run()
    kinds = [type(e) for e in events.items]
    assert kinds[0] is rs.Status and kinds[1] is rs.Opened and kinds[-1] is rs.Closed
    assert events.phases() == [Phase.READY, Phase.RUNNING, Phase.DONE]
    [opened] = events.of(rs.Opened)
    assert (opened.info.num_docs, opened.info.holdout, opened.info.step, opened.from_checkpoint) == (20, 4, 0, False)
    reference = trained(60)
    np.testing.assert_array_equal(events.losses(), reference.loss_history)
    points = [p for e in events.of(rs.Heldout) for p in e.points]
    assert points[-1].step == 60, "a finished run is evaluated at its last step"
    for point in points:
        assert point.loss == heldout_at(point.step)
    assert all(e.seconds > 0 for e in events.of(rs.Losses))


def test_chunks_grow_towards_the_target_and_respect_the_maximum():
    events = Events()
    loop = TrainingLoop(spec(replace(TRAIN, num_steps=3000)), events,
                        LoopSettings(end_when_finished=True, target_chunk_s=10.0, max_steps_per_chunk=64))
    loop.run()
    sizes = [len(e.losses) for e in events.of(rs.Losses)]
    assert sizes[:7] == [1, 2, 4, 8, 16, 32, 64] and max(sizes) == 64 and sum(sizes) == 3000
    assert loop.step == 3000 and loop.train_seconds > 0


def test_a_chunk_plan_sets_each_call_and_stops_the_run_with_a_final_evaluation():
    events = Events()
    plan = iter([3, 5, 7, 0])
    loop = TrainingLoop(spec(), events, LoopSettings(end_when_finished=True, chunk_steps=lambda loop: next(plan)))
    loop.run()
    assert [(e.first_step, len(e.losses)) for e in events.of(rs.Losses)] == [(0, 3), (3, 5), (8, 7)]
    assert events.phases()[-1] == Phase.DONE and loop.step == 15
    assert [p.step for e in events.of(rs.Heldout) for p in e.points][-1] == 15


def test_heldout_at_names_ends_a_chunk_there_and_evaluates_whatever_the_schedule():
    """A sweep's ASHA rungs (names seen): a chunk ends at each rung's step (names / B, rounded
    up) and the held-out loss is evaluated there, though the schedule's share allows none."""
    train = replace(TRAIN, batch_size=4)
    settings = LoopSettings(end_when_finished=True, target_chunk_s=10.0, max_steps_per_chunk=64,
                            heldout_share=1e-9, heldout_at_names=(30, 101))
    events = Events()
    TrainingLoop(spec(train), events, settings).run()
    chunks = [(e.first_step, len(e.losses)) for e in events.of(rs.Losses)]
    # doubling from one step, cut short at steps 8 and 26; the pace goes on doubling
    assert chunks == [(0, 1), (1, 2), (3, 4), (7, 1), (8, 16), (24, 2), (26, 34)]
    points = [p for e in events.of(rs.Heldout) for p in e.points]
    assert [p.step for p in points] == [8, 26, 60]
    for point in points:
        assert point.loss == heldout_at(point.step, train)
    alone = Events()
    TrainingLoop(spec(train), alone, replace(settings, heldout_at_names=())).run()
    assert [p.step for e in alone.of(rs.Heldout) for p in e.points] == [60]
    np.testing.assert_array_equal(alone.losses(), events.losses())


def test_heldout_off_evaluates_nothing():
    events = Events()
    TrainingLoop(spec(), events, LoopSettings(end_when_finished=True, heldout=False)).run()
    assert events.of(rs.Heldout) == [] and len(events.losses()) == 60


def test_a_first_evaluation_waits_for_its_guessed_cost_unless_told_not_to():
    slow_first = Events()
    TrainingLoop(spec(), slow_first, LoopSettings(end_when_finished=True, chunk_steps=lambda loop: 1)).run()
    at_once = Events()
    TrainingLoop(spec(), at_once, LoopSettings(end_when_finished=True, chunk_steps=lambda loop: 1,
                                                delay_first_evaluation=False)).run()
    assert [p.step for e in at_once.of(rs.Heldout) for p in e.points][0] == 1
    assert [p.step for e in slow_first.of(rs.Heldout) for p in e.points][0] > 1


# commands from another thread --------------------------------------------------------------

def test_pause_resume_and_stop_from_another_thread():
    events = Events()
    loop = TrainingLoop(spec(replace(TRAIN, num_steps=100_000)), events,
                        LoopSettings(chunk_steps=lambda loop: 10))
    thread = started(loop)
    events.wait_for(lambda ev: len(ev.of(rs.Losses)) >= 2, "two chunks")
    loop.send(rs.Pause())
    events.wait_for(lambda ev: Phase.PAUSED in ev.phases(), "pause")
    paused_at = loop.step
    assert loop.step == paused_at and loop.phase == Phase.PAUSED
    loop.send(rs.Resume())
    events.wait_for(lambda ev: ev.phases()[-1] == Phase.RUNNING and ev.of(rs.Losses)[-1].first_step >= paused_at,
                    "training after the resume")
    loop.send(rs.Stop())
    events.wait_for(lambda ev: ev.phases()[-1] == Phase.DONE, "stop")
    loop.send(rs.End())
    joined(thread)
    assert events.phases() == [Phase.READY, Phase.RUNNING, Phase.PAUSED, Phase.RUNNING, Phase.DONE]
    np.testing.assert_array_equal(events.losses(), trained(loop.step, replace(TRAIN, num_steps=100_000)).loss_history)
    assert isinstance(events.items[-1], rs.Closed) and loop.backend is None


def test_resume_trains_one_step_first_then_grows_the_chunk():
    events = Events()
    loop = TrainingLoop(spec(replace(TRAIN, num_steps=100_000)), events, LoopSettings(target_chunk_s=10.0))
    thread = started(loop)
    events.wait_for(lambda ev: len(ev.of(rs.Losses)) >= 5, "five chunks")
    loop.send(rs.Pause())
    events.wait_for(lambda ev: Phase.PAUSED in ev.phases(), "pause")
    count = len(events.of(rs.Losses))
    loop.send(rs.Resume())
    events.wait_for(lambda ev: len(ev.of(rs.Losses)) >= count + 3, "three chunks after the resume")
    loop.send(rs.End())
    joined(thread)
    assert [len(e.losses) for e in events.of(rs.Losses)[count:count + 3]] == [1, 2, 4]


def test_a_sample_during_training_uses_the_parameters_of_its_step():
    events = Events()
    loop = TrainingLoop(spec(replace(TRAIN, num_steps=100_000)), events, LoopSettings(chunk_steps=lambda loop: 7))
    thread = started(loop)
    events.wait_for(lambda ev: len(ev.of(rs.Losses)) >= 2, "two chunks")
    loop.send(rs.Sample(5, 0.8, seed=4, prefix="a"))
    events.wait_for(lambda ev: ev.of(rs.Samples), "samples")
    assert loop.phase == Phase.RUNNING, "sampling does not stop training"
    loop.send(rs.End())
    joined(thread)
    [samples] = events.of(rs.Samples)
    assert samples.step % 7 == 0 and samples.prefix == "a"
    reference = trained(samples.step, replace(TRAIN, num_steps=100_000))
    assert samples.names == reference.sample(5, 0.8, 4, prefix="a")


def test_stop_cancels_a_sample_in_progress_and_end_ends_it():
    gates = {"sample": Gate(closed=True)}
    events = Events()
    loop = TrainingLoop(spec(autostart=False), events, LoopSettings(opener=gated(gates)))
    thread = started(loop)
    events.wait_for(lambda ev: Phase.READY in ev.phases(), "ready")
    loop.send(rs.Sample(3, 0.5, 0))
    assert gates["sample"].reached.wait(TIMEOUT)
    loop.send(rs.Stop())
    events.wait_for(lambda ev: ev.phases()[-1] == Phase.DONE, "stop")
    assert [e.text for e in events.of(rs.Status)][-1] == "Sampling cancelled" and events.of(rs.Samples) == []
    gates["sample"].reached.clear()
    loop.send(rs.Sample(3, 0.5, 0))
    assert gates["sample"].reached.wait(TIMEOUT)
    loop.send(rs.End())
    joined(thread)  # the gate never opened: End cancelled the second sample too
    assert events.of(rs.Samples) == []


def test_commands_are_served_in_order_after_the_call_in_progress(tmp_path):
    gates = {"train": Gate()}
    events = Events()
    loop = TrainingLoop(spec(replace(TRAIN, num_steps=100_000)), events,
                        LoopSettings(opener=gated(gates), chunk_steps=lambda loop: 5))
    thread = started(loop)
    events.wait_for(lambda ev: ev.of(rs.Losses), "a chunk")
    gates["train"].close()
    assert gates["train"].reached.wait(TIMEOUT)  # inside a train(k) call now
    loop.send(rs.Sample(2, 0.5, 1))
    loop.send(rs.Save(str(tmp_path / "a.npz")))
    loop.send(rs.Pause())
    assert events.of(rs.Samples) == [] and events.of(rs.Saved) == []
    gates["train"].open()
    events.wait_for(lambda ev: Phase.PAUSED in ev.phases(), "pause")
    loop.send(rs.End())
    joined(thread)
    tail = [e for e in events.items if isinstance(e, (rs.Losses, rs.Samples, rs.Saved, rs.PhaseChanged))][-4:]
    assert [type(e) for e in tail] == [rs.Losses, rs.Samples, rs.Saved, rs.PhaseChanged]
    assert tail[1].step == tail[2].step == tail[0].first_step + 5 == read_checkpoint(tmp_path / "a.npz").step


def test_any_command_cancels_an_evaluation_which_comes_again_later():
    gates = {"doc_losses": Gate(closed=True)}
    events = Events()
    backends = []
    train = replace(TRAIN, num_steps=40)
    loop = TrainingLoop(spec(train), events, LoopSettings(opener=gated(gates, backends), chunk_steps=lambda loop: 10,
                                                          delay_first_evaluation=False))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine.backends.base, "EVAL_MAX_DOCS", 1)  # four held-out batches: a cancel point each
        thread = started(loop)
        assert gates["doc_losses"].reached.wait(TIMEOUT)  # evaluating after the first chunk
        loop.send(rs.Pause())
        gates["doc_losses"].open()
        events.wait_for(lambda ev: Phase.PAUSED in ev.phases(), "pause")
        assert events.of(rs.Heldout) == [] and backends[0].calls["doc_losses"] == 1, "cancelled after one batch"
        loop.send(rs.Resume())
        events.wait_for(lambda ev: ev.phases()[-1] == Phase.DONE, "the end")
        loop.send(rs.End())
        joined(thread)
        points = [p for e in events.of(rs.Heldout) for p in e.points]
        assert points and points[-1].step == 40 and points[-1].loss == heldout_at(40, train)


# saves ------------------------------------------------------------------------------------

def test_a_save_queued_during_an_evaluation_is_written_when_end_follows(tmp_path):
    """Issue 27: a Save sent while a stopped run's held-out loss was being computed,
    then End: the worker took the Save off the queue, saw End and dropped it."""
    gates = {"doc_losses": Gate()}
    events = Events()
    path = tmp_path / "asked.npz"
    loop = TrainingLoop(spec(replace(TRAIN, num_steps=100_000)), events,
                        LoopSettings(opener=gated(gates), chunk_steps=lambda loop: 3, heldout_share=1e-9))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine.backends.base, "EVAL_MAX_DOCS", 1)  # a cancel point between documents
        thread = started(loop)
        events.wait_for(lambda ev: len(ev.of(rs.Losses)) >= 2, "two chunks")
        gates["doc_losses"].close()
        loop.send(rs.Stop())  # a stopped run is evaluated at its step while the loop waits
        assert gates["doc_losses"].reached.wait(TIMEOUT)
        loop.send(rs.Save(str(path)))
        loop.send(rs.End(serve_saves=True))
        gates["doc_losses"].open()
        joined(thread)
    [saved] = events.of(rs.Saved)
    assert saved.path == str(path) and read_checkpoint(path).step == saved.step == loop.step
    assert isinstance(events.items[-1], rs.Closed)


def test_queued_saves_are_written_at_end_and_other_requests_dropped(tmp_path):
    gates = {"train": Gate()}
    events = Events()
    loop = TrainingLoop(spec(replace(TRAIN, num_steps=100_000)), events,
                        LoopSettings(opener=gated(gates), chunk_steps=lambda loop: 3))
    thread = started(loop)
    events.wait_for(lambda ev: ev.of(rs.Losses), "a chunk")
    gates["train"].close()
    assert gates["train"].reached.wait(TIMEOUT)
    for name in ("one", "two"):
        loop.send(rs.Save(str(tmp_path / f"{name}.npz")))
        loop.send(rs.Sample(2, 0.5, 0))
    loop.send(rs.End(serve_saves=True))
    gates["train"].open()
    joined(thread)
    assert [e.path for e in events.of(rs.Saved)] == [str(tmp_path / "one.npz"), str(tmp_path / "two.npz")]
    assert events.of(rs.Samples) == []


def test_end_without_serving_saves_writes_none(tmp_path):
    gates = {"train": Gate()}
    events = Events()
    loop = TrainingLoop(spec(replace(TRAIN, num_steps=100_000)), events,
                        LoopSettings(opener=gated(gates), chunk_steps=lambda loop: 3))
    thread = started(loop)
    events.wait_for(lambda ev: ev.of(rs.Losses), "a chunk")
    gates["train"].close()
    assert gates["train"].reached.wait(TIMEOUT)
    loop.send(rs.Save(str(tmp_path / "no.npz")))
    loop.send(rs.End(serve_saves=False))
    gates["train"].open()
    joined(thread)
    assert events.of(rs.Saved) == [] and not (tmp_path / "no.npz").exists()


def test_end_when_finished_serves_what_the_caller_asks_at_the_end(tmp_path):
    """A headless caller asks for samples and a save once training is done (from
    inside emit); run() returns after serving them."""
    holder = {}

    def on_event(event):
        if isinstance(event, rs.PhaseChanged) and event.phase == Phase.DONE:
            holder["loop"].send(rs.Sample(4, 0.5, 2))
            holder["loop"].send(rs.Save(str(tmp_path / "end.npz")))

    events = Events(on_event)
    loop = holder["loop"] = TrainingLoop(spec(), events, LoopSettings(end_when_finished=True))
    loop.run()
    assert events.of(rs.Samples)[0].names == trained(60).sample(4, 0.5, 2)
    assert [e.step for e in events.of(rs.Saved)] == [60] and read_checkpoint(tmp_path / "end.npz").step == 60


def test_the_autosave_hook_saves_when_it_names_a_path(tmp_path):
    asked = []

    def autosave(step, train_seconds):
        asked.append((step, train_seconds))
        return str(tmp_path / f"auto-{step}.npz") if step == 20 else None

    events = Events()
    loop = TrainingLoop(spec(), events, LoopSettings(end_when_finished=True, chunk_steps=lambda loop: 10,
                                                      autosave=autosave))
    loop.run()
    assert [step for step, _ in asked] == [10, 20, 30, 40, 50, 60]
    assert all(b > a for (_, a), (_, b) in zip(asked, asked[1:])), "the clock counts training time"
    [saved] = events.of(rs.Saved)
    assert (saved.step, saved.autosave) == (20, True) and read_checkpoint(saved.path).step == 20


def test_saves_pending_counts_a_save_until_it_is_written_or_refused(tmp_path):
    """The window waits (closing, quitting) while a checkpoint asked for is pending."""
    gates = {"train": Gate()}
    events = Events()
    loop = TrainingLoop(spec(replace(TRAIN, num_steps=100_000), autostart=False), events,
                        LoopSettings(opener=gated(gates), chunk_steps=lambda loop: 3))
    assert not loop.saves_pending
    thread = started(loop)
    events.wait_for(lambda ev: Phase.READY in ev.phases(), "ready")
    loop.send(rs.Resume())
    events.wait_for(lambda ev: ev.of(rs.Losses), "a chunk")
    gates["train"].close()
    assert gates["train"].reached.wait(TIMEOUT)
    loop.send(rs.Save(str(tmp_path / "queued.npz")))
    assert loop.saves_pending, "queued behind the chunk in progress"
    gates["train"].open()
    events.wait_for(lambda ev: ev.of(rs.Saved), "the save")
    assert not loop.saves_pending and read_checkpoint(tmp_path / "queued.npz").step == events.of(rs.Saved)[0].step
    gates["train"].close()
    assert gates["train"].reached.wait(TIMEOUT)
    loop.send(rs.Save(str(tmp_path / "dropped.npz")))
    loop.send(rs.End(serve_saves=False))
    assert loop.saves_pending
    gates["train"].open()
    joined(thread)
    assert not loop.saves_pending and not (tmp_path / "dropped.npz").exists(), "ended: nothing more is written"


def test_a_save_the_phase_refuses_is_settled_not_written(tmp_path):
    events = Events()
    loop = TrainingLoop(spec(backend="no-such-backend"), events)
    loop.send(rs.Save(str(tmp_path / "never.npz")))
    assert loop.saves_pending
    loop.run()  # opening fails: no model to save
    assert not loop.saves_pending and not (tmp_path / "never.npz").exists()


def test_saving_is_named_by_call_while_the_checkpoint_is_written(tmp_path):
    seen = []

    class Watched(NumpyBackend):
        def get_state(self):
            seen.append(holder["loop"].call)
            return super().get_state()

    holder = {}
    events = Events(lambda e: isinstance(e, rs.PhaseChanged) and e.phase == Phase.DONE and
                    holder["loop"].send(rs.Save(str(tmp_path / "end.npz"))))
    loop = holder["loop"] = TrainingLoop(spec(), events, LoopSettings(
        end_when_finished=True, opener=lambda s: Watched(s.model, s.train, s.corpus)))
    loop.run()
    assert SAVING in seen and read_checkpoint(tmp_path / "end.npz").step == 60


def announcing(backend_name: str):
    """An opener that announces a Futhark build from its own thread and one from
    another thread (a different run's, which the loop must not report)."""
    from engine.futhark.build import BuildEvent, _announce

    def event(phase, seconds=0.0):
        return BuildEvent(phase, backend_name, "shipped", "cc 1", "0.25", "about 20-40 s", seconds)

    def opener(s: rs.RunSpec):
        other = threading.Thread(target=_announce, args=(event("start"),))
        other.start()
        other.join()
        _announce(event("start"))
        calls.append(holder["loop"].call)
        _announce(event("done", 23.0))
        calls.append(holder["loop"].call)
        return open_runner(s)

    calls, holder = [], {}
    return opener, calls, holder


@pytest.mark.parametrize("report", [True, False])
def test_a_build_while_opening_is_named_and_reported_when_asked(report):
    opener, calls, holder = announcing("futhark-c")
    events = Events()
    settings = LoopSettings(end_when_finished=True, opener=opener, report_builds=report)
    loop = holder["loop"] = TrainingLoop(spec(), events, settings)
    loop.run()
    texts = [e.text for e in events.of(rs.Status)]
    if report:
        assert calls == ["building futhark-c (first use, about 20-40 s)", "opening the numpy backend"]
        assert texts[1:3] == ["building futhark-c from the shipped C with cc 1 (first use, about 20-40 s)...",
                              "built futhark-c in 23 s"], "this thread's build only, in order"
    else:
        assert calls == ["opening the numpy backend"] * 2 and len(texts) == 1
    from engine.futhark import build
    assert not build._listeners, "the listener goes with the opening"


# checkpoints and continuing ---------------------------------------------------------------------

def test_a_checkpoint_resumes_where_it_was_saved(tmp_path):
    holder = {}
    save_after_first_chunk = Events(lambda e: isinstance(e, rs.Losses) and e.first_step == 0 and
                                    holder["loop"].send(rs.Save(str(tmp_path / "mid.npz"))))
    first = holder["loop"] = TrainingLoop(spec(), save_after_first_chunk,
                                          LoopSettings(end_when_finished=True, chunk_steps=lambda loop: 25))
    first.run()
    checkpoint = read_checkpoint(tmp_path / "mid.npz")
    assert checkpoint.step == 25
    events = Events()
    TrainingLoop(rs.RunSpec("numpy", checkpoint=checkpoint), events, LoopSettings(end_when_finished=True)).run()
    [opened] = events.of(rs.Opened)
    assert opened.from_checkpoint and opened.info.step == 25
    history = events.of(rs.Losses)[0]
    assert history.first_step == 0 and np.isnan(history.seconds)
    np.testing.assert_array_equal(history.losses, trained(25).loss_history)
    assert events.of(rs.Heldout)[0].replacing
    np.testing.assert_array_equal(events.losses(), trained(60).loss_history[25:])


def test_extend_continues_a_finished_run_over_the_longer_schedule():
    holder = {}
    done = threading.Event()
    events = Events(lambda e: isinstance(e, rs.PhaseChanged) and e.phase == Phase.DONE and done.set())
    loop = holder["loop"] = TrainingLoop(spec(replace(TRAIN, num_steps=30)), events, LoopSettings())
    thread = started(loop)
    assert done.wait(TIMEOUT)
    loop.send(rs.Resume())  # refused: the run is finished
    loop.send(rs.Extend(50))
    loop.send(rs.Resume())
    events.wait_for(lambda ev: ev.phases().count(Phase.DONE) == 2, "the extended run's end")
    loop.send(rs.End())
    joined(thread)
    assert events.of(rs.Extended) == [rs.Extended(50)] and loop.step == 50
    reference = extend_backend(trained(30, replace(TRAIN, num_steps=30)), 50)
    np.testing.assert_array_equal(events.losses()[30:], reference.train(20))


# failures --------------------------------------------------------------------------------

def poisoned(s: rs.RunSpec):
    """The run with position 9's embedding infinite: the first document that long
    (charlotte, step 5; the held-out names are shorter) makes the loss NaN."""
    backend = open_runner(s)
    params = backend.get_params()
    params["wpe"][9] = np.inf
    backend.set_params(params)
    return backend


def test_divergence_stops_the_run_with_its_step_and_no_evaluation():
    events = Events()
    loop = TrainingLoop(spec(), events, LoopSettings(end_when_finished=True, delay_first_evaluation=False,
                                                      chunk_steps=lambda loop: 2, opener=poisoned))
    loop.run()
    [diverged] = events.of(rs.Diverged)
    [error] = events.of(rs.Error)
    assert isinstance(error.exception, engine.TrainingDiverged) and error.message == str(error.exception)
    assert loop.step == diverged.step == 5 and events.phases()[-1] == Phase.DONE
    # the losses up to the step that diverged (its parameters are kept), and no evaluation after it
    reference = poisoned(spec())
    np.testing.assert_array_equal(events.losses(), reference.train(5))
    steps = [p.step for e in events.of(rs.Heldout) for p in e.points]
    assert steps[0] == 2 and max(steps) < 5, "the first after the first chunk; none at the diverged step"
    assert isinstance(events.items[-1], rs.Closed) and not isinstance(events.items[-2], rs.Heldout)


def test_out_of_memory_in_a_chunk_is_an_error_event_and_the_run_stops():
    class Exhausted(NumpyBackend):
        def _train_steps(self, k):
            if self._step >= 10:
                raise MemoryError()
            return super()._train_steps(k)

    events = Events()
    loop = TrainingLoop(spec(), events, LoopSettings(end_when_finished=True, chunk_steps=lambda loop: 5,
                                                      opener=lambda s: Exhausted(s.model, s.train, s.corpus)))
    loop.run()
    [error] = events.of(rs.Error)
    assert error.message == "out of memory: choose a smaller model (preset) and train again"
    assert isinstance(error.exception, MemoryError) and loop.step == 10 and events.phases()[-1] == Phase.DONE


def test_a_failed_open_reports_and_returns_without_end():
    events = Events()
    loop = TrainingLoop(spec(backend="no-such-backend"), events)
    loop.run()
    assert events.phases() == [Phase.FAILED] and isinstance(events.items[-1], rs.Closed)
    [error] = events.of(rs.Error)
    assert "no-such-backend" in error.message and isinstance(error.exception, ValueError)


def test_end_while_opening_reports_no_run():
    opening, release = threading.Event(), threading.Event()

    def slow_open(s):
        opening.set()
        assert release.wait(TIMEOUT)
        return open_runner(s)

    events = Events()
    loop = TrainingLoop(spec(), events, LoopSettings(opener=slow_open))
    thread = started(loop)
    assert opening.wait(TIMEOUT) and loop.call == "opening the numpy backend"
    loop.send(rs.End())
    release.set()
    joined(thread)
    assert [type(e) for e in events.items] == [rs.Status, rs.Closed]


# snapshots --------------------------------------------------------------------------------

def test_snapshots_when_wanted_and_one_on_request():
    events = Events()
    loop = TrainingLoop(spec(replace(TRAIN, num_steps=100_000)), events,
                        LoopSettings(chunk_steps=lambda loop: 5, snapshot_interval_s=0.0))
    loop.send(rs.WantSnapshots(True))
    thread = started(loop)
    events.wait_for(lambda ev: len(ev.of(rs.SnapshotReady)) >= 2, "snapshots")
    loop.send(rs.WantSnapshots(False))
    loop.send(rs.Pause())
    events.wait_for(lambda ev: Phase.PAUSED in ev.phases(), "pause")
    count = len(events.of(rs.SnapshotReady))
    loop.send(rs.TakeSnapshot())
    events.wait_for(lambda ev: len(ev.of(rs.SnapshotReady)) == count + 1, "the snapshot asked for")
    loop.send(rs.End())
    joined(thread)
    snapshot = events.of(rs.SnapshotReady)[-1].snapshot
    assert snapshot.step == loop.step
    np.testing.assert_array_equal(snapshot.flat, trained(loop.step, replace(TRAIN, num_steps=100_000)).get_state().params)
