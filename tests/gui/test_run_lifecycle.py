"""A run is never lost, and a run can always go on (issue 19), through the real
window: the save question before each action that would discard a trained
model, Stop then Resume, Continue to more steps, the run's own dataset, the
Runs tab's removal and bounds, autosave, and an opening's elapsed seconds."""
import time

import numpy as np
import pytest
from PySide6.QtWidgets import QMessageBox

import engine
import slow_backend
from engine.training.autosave import autosaves
from engine.training.records import MAX_POINTS, RunRecord
from gui.run_list import COLUMNS, MAX_CHECKED
from test_window import TIMEOUT_MS, click, curve, reference_losses, set_steps, train_to_end, wait_state


@pytest.fixture
def asking_window(make_window, names_path, qtbot, tmp_path):
    """A window that asks before discarding, with a trained, unsaved 60-step run;
    Save picks tmp_path/answer.npz."""
    window = make_window(names_path)
    window.ask_before_discarding = True
    window.files.ask_save_path = lambda: str(tmp_path / "answer.npz")
    train_to_end(qtbot, window, 60)
    assert window.run.unsaved
    return window


def question(window):
    return window.findChild(QMessageBox, "saveQuestion")


def answer(qtbot, window, button):
    box = question(window)
    assert box is not None and box.isVisible(), "no save question"
    box.button(button).click()
    qtbot.waitUntil(lambda: question(window) is None or not question(window).isVisible(), timeout=TIMEOUT_MS)


def params(window):
    """The current run's parameters (read while its worker is idle, between commands)."""
    return window.session.worker.backend.get_state().params.copy()


def second_dataset(tmp_path):
    path = tmp_path / "other.txt"
    path.write_text("\n".join(["zed", "zoe", "zara", "zuri", "zane"] * 20))
    return path


def discarding_actions(tmp_path, checkpoint):
    """name -> what starts it (each would end the trained run)."""
    return {
        "train a new run": lambda w: w.start_run(),
        "reset": lambda w: w.reset(),
        "open dataset": lambda w: w.open_dataset(str(second_dataset(tmp_path))),
        "load checkpoint": lambda w: w.load_checkpoint(str(checkpoint)),
        "quit": lambda w: w.close(),
    }


ACTIONS = ["train a new run", "reset", "open dataset", "load checkpoint", "quit"]


def saved_elsewhere(names_corpus, tmp_path):
    """A checkpoint of another run (30 steps), for Load checkpoint."""
    backend = engine.open_backend("numpy", engine.PRESETS["tiny"].model, engine.TrainConfig(num_steps=30),
                                  names_corpus)
    backend.train(30)
    path = tmp_path / "elsewhere.npz"
    engine.save_checkpoint(path, backend)
    return path


@pytest.mark.parametrize("action", ACTIONS)
def test_cancel_changes_nothing(asking_window, qtbot, tmp_path, names_corpus, action):
    window = asking_window
    session, step, before = window.session, window.session.worker.step, params(window)
    discarding_actions(tmp_path, saved_elsewhere(names_corpus, tmp_path))[action](window)
    qtbot.waitUntil(lambda: question(window) is not None, timeout=TIMEOUT_MS)  # reads finish first
    answer(qtbot, window, QMessageBox.Cancel)
    qtbot.wait(200)
    assert window.isVisible() and window.session is session and window.state == "done"
    assert window.session.worker.step == step and window.run.unsaved
    np.testing.assert_array_equal(params(window), before)
    assert window.dataset_path.endswith("names.txt")


@pytest.mark.parametrize("action", ACTIONS)
def test_discard_goes_on(asking_window, qtbot, tmp_path, names_corpus, action):
    window = asking_window
    old = window.session
    discarding_actions(tmp_path, saved_elsewhere(names_corpus, tmp_path))[action](window)
    qtbot.waitUntil(lambda: question(window) is not None, timeout=TIMEOUT_MS)
    if action == "quit":
        with qtbot.waitSignal(window.closed, timeout=TIMEOUT_MS):
            answer(qtbot, window, QMessageBox.Discard)
        return
    answer(qtbot, window, QMessageBox.Discard)
    qtbot.waitUntil(lambda: window.session is not old, timeout=TIMEOUT_MS)
    expected = {"train a new run": "done", "reset": "none", "open dataset": "none", "load checkpoint": "done"}
    wait_state(qtbot, window, expected[action])
    if action == "open dataset":
        assert window.dataset_path.endswith("other.txt")
    if action == "load checkpoint":
        assert window.session.worker.step == 30


def test_save_writes_a_checkpoint_that_resumes_exactly_then_goes_on(asking_window, qtbot, tmp_path, names_corpus):
    window = asking_window
    history = window.session.worker.loss_history()
    window.reset()
    answer(qtbot, window, QMessageBox.Save)
    wait_state(qtbot, window, "none")  # after the checkpoint was written
    checkpoint = engine.read_checkpoint(tmp_path / "answer.npz")
    assert checkpoint.step == 60
    np.testing.assert_array_equal(checkpoint.losses, history)
    resumed = engine.load_checkpoint(checkpoint, num_steps=120)
    np.testing.assert_array_equal(np.concatenate([history, resumed.train(60)]),
                                  reference_backend_losses(names_corpus, 120))


def test_an_action_while_the_answer_s_save_is_written_follows_it(asking_window, qtbot, tmp_path):
    window = asking_window
    window.reset()
    answer(qtbot, window, QMessageBox.Save)
    with qtbot.waitSignal(window.closed, timeout=TIMEOUT_MS):
        window.close()  # before the checkpoint is written: the close follows it, instead of the Reset
    assert engine.read_checkpoint(tmp_path / "answer.npz").step == 60


def reference_backend_losses(corpus, total, first=60):
    """60 steps of a run that was 60 long, then continued to `total` (the decay over the new total)."""
    backend = engine.open_backend("numpy", engine.PRESETS["tiny"].model,
                                  engine.TrainConfig(num_steps=first, **tiny_train()), corpus)
    head = backend.train(first)
    state, losses = backend.get_state(), backend.loss_history
    ck = engine.training.checkpoint.Checkpoint(backend.model, backend.train_config, corpus, state.params, state.m, state.v,
                                      state.step, losses, "numpy")
    return np.concatenate([head, engine.load_checkpoint(ck, num_steps=total).train(total - first)])


def tiny_train():
    t = engine.PRESETS["tiny"].train
    return dict(learning_rate=t.learning_rate, init_std=t.init_std, seed=t.seed)


def test_no_question_after_a_save_a_fresh_load_or_with_the_setting_off(asking_window, qtbot, tmp_path):
    window = asking_window
    path = tmp_path / "saved.npz"
    window.save_checkpoint(str(path))
    qtbot.waitUntil(lambda: not window.run.unsaved, timeout=TIMEOUT_MS)
    window.load_checkpoint(str(path))  # nothing trained since the save: no question
    wait_state(qtbot, window, "done")
    qtbot.waitUntil(lambda: window.run.saved_path == str(path), timeout=TIMEOUT_MS)
    assert question(window) is None and not window.run.unsaved
    window.reset()  # nothing trained since the load
    wait_state(qtbot, window, "none")
    train_to_end(qtbot, window, 20)
    window.ask_before_discarding = False
    window.reset()
    wait_state(qtbot, window, "none")
    assert question(window) is None


def test_the_question_never_blocks_the_worker(make_window, names_path, qtbot):
    window = make_window(names_path)
    window.ask_before_discarding = True
    set_steps(window, 1_000_000)
    click(qtbot, window, "trainButton")
    qtbot.waitUntil(lambda: window.loss_plot.series.n > 0, timeout=TIMEOUT_MS)
    window.reset()
    assert question(window).isVisible() and question(window).windowModality()
    steps = window.loss_plot.series.n
    qtbot.waitUntil(lambda: window.loss_plot.series.n > steps + 100, timeout=TIMEOUT_MS)  # training went on
    answer(qtbot, window, QMessageBox.Discard)
    wait_state(qtbot, window, "none")


def test_closing_during_a_long_call_asks_then_hides_at_once(make_window, names_path, qtbot):
    slow_backend.register(slow_backend.Delays(sample_s=4.0, cancellable=False))
    try:
        window = make_window(names_path)
        window.ask_before_discarding = True
        assert window.config_panel.select_backend(slow_backend.NAME)
        set_steps(window, 1_000_000)
        window.start_run()
        qtbot.waitUntil(lambda: window.loss_plot.series.n > 0, timeout=TIMEOUT_MS)
        window.request_samples(200, 0.5, 0)
        qtbot.waitUntil(lambda: slow_backend.SlowBackend.calls["sample_started"] == 1, timeout=TIMEOUT_MS)
        window.close()
        assert window.isVisible()  # asked first
        started = time.monotonic()
        with qtbot.waitSignal(window.closed, timeout=TIMEOUT_MS):
            question(window).button(QMessageBox.Discard).click()
            assert not window.isVisible() and time.monotonic() - started < 1.0  # hidden at once
        qtbot.waitUntil(lambda: question(window) is None, timeout=TIMEOUT_MS)  # nothing asked after it is gone
    finally:
        slow_backend.unregister()


def test_closing_before_the_first_step_is_reported_asks(make_window, names_path, qtbot):
    """A running run is unsaved from its start: the window has not seen a step yet
    (the first call takes 3 s here), the worker is making them (issue 27)."""
    slow_backend.register(slow_backend.Delays(train_s=3.0))
    try:
        window = make_window(names_path)
        window.ask_before_discarding = True
        assert window.config_panel.select_backend(slow_backend.NAME)
        set_steps(window, 1_000_000)
        window.start_run()
        wait_state(qtbot, window, "running")
        qtbot.waitUntil(lambda: slow_backend.SlowBackend.calls["train"] == 1, timeout=TIMEOUT_MS)
        window.close()
        assert window.loss_plot.series.n == 0 and window.isVisible()
        assert question(window) is not None and "is training" in question(window).text()
        with qtbot.waitSignal(window.closed, timeout=TIMEOUT_MS):
            answer(qtbot, window, QMessageBox.Discard)
    finally:
        slow_backend.unregister()


def save_during_the_held_out_pass_then(window, qtbot, path, action):
    """Stop a slow-backend run, ask for a save of it while the worker evaluates the
    held-out loss (a pass of 3 s batches), then Quit or Reset and Discard (the run,
    not the save) within that batch: the End comes before the worker takes the Save."""
    window.ask_before_discarding = True
    assert window.config_panel.select_backend(slow_backend.NAME)
    set_steps(window, 1_000_000)
    window.start_run()
    qtbot.waitUntil(lambda: window.loss_plot.series.n > 0, timeout=TIMEOUT_MS)
    slow_backend.SlowBackend.delays = slow_backend.Delays(heldout_s=3.0)
    window.stop()
    wait_state(qtbot, window, "done")
    worker = window.session.worker
    qtbot.waitUntil(lambda: worker.call == "evaluating the held-out loss", timeout=TIMEOUT_MS)
    window.save_checkpoint(str(path))  # queued: the pass gives way at its next batch
    window.close() if action == "quit" else window.reset()
    answer(qtbot, window, QMessageBox.Discard)
    qtbot.waitUntil(lambda: not window.sessions.busy_ending, timeout=TIMEOUT_MS)
    return worker.step


@pytest.mark.parametrize("action", ["quit", "reset"])
def test_a_save_asked_for_during_the_held_out_pass_is_written_whatever_ends_the_run(
        make_window, names_path, qtbot, tmp_path, action):
    """Issue 27: the worker took the Save off its queue, saw the end and dropped it."""
    slow_backend.register(slow_backend.Delays())
    try:
        window = make_window(names_path)
        path = tmp_path / "asked.npz"
        step = save_during_the_held_out_pass_then(window, qtbot, path, action)
        assert engine.read_checkpoint(path).step == step > 0
        if action == "reset":
            qtbot.waitUntil(lambda: window.statusBar().message() == f"Checkpoint saved to {path}",
                            timeout=TIMEOUT_MS)
    finally:
        slow_backend.unregister()


@pytest.mark.parametrize("action", ["quit", "reset"])
def test_a_save_that_fails_after_the_run_ended_says_so(make_window, names_path, qtbot, tmp_path, capfd, action):
    slow_backend.register(slow_backend.Delays())
    try:
        window = make_window(names_path)
        (tmp_path / "a file").write_text("not a folder")
        path = tmp_path / "a file" / "asked.npz"
        save_during_the_held_out_pass_then(window, qtbot, path, action)
        qtbot.waitUntil(lambda: bool(window.messages) and window.messages[-1][0] == "error", timeout=TIMEOUT_MS)
        assert str(path) in window.messages[-1][2] and not path.exists()
        if action == "quit":  # the window is gone: said on stderr
            assert f"could not save the checkpoint {path}" in capfd.readouterr().err
    finally:
        slow_backend.unregister()


# going on -------------------------------------------------------------------------------------
def test_stop_then_resume_gives_the_uninterrupted_losses(make_window, names_path, names_corpus, qtbot):
    window = make_window(names_path)
    set_steps(window, 3000)
    click(qtbot, window, "trainButton")
    qtbot.waitUntil(lambda: window.loss_plot.series.n > 0, timeout=TIMEOUT_MS)
    click(qtbot, window, "stopButton")
    wait_state(qtbot, window, "done")
    stopped_at = window.session.worker.step
    assert stopped_at < 3000 and window.train_button.text() == "Resume"
    click(qtbot, window, "trainButton")
    wait_state(qtbot, window, "running")
    wait_state(qtbot, window, "done")
    assert window.session.worker.step == 3000 and len(window.run_list.runs) == 1
    np.testing.assert_array_equal(curve(window)[1].astype(np.float32), reference_losses(names_corpus, 3000))


def test_continue_to_2n_steps_is_a_checkpoint_resumed_with_2n(make_window, names_path, names_corpus, qtbot):
    window = make_window(names_path)
    train_to_end(qtbot, window, 60)
    assert window.train_button.text() == "Train"  # finished: Train starts a new run...
    set_steps(window, 120)
    assert window.train_button.text() == "Continue to 120 steps"  # ...unless Steps is raised
    click(qtbot, window, "trainButton")
    qtbot.waitUntil(lambda: window.loss_plot.series.n == 120 and window.state == "done", timeout=TIMEOUT_MS)
    x, y = curve(window)
    np.testing.assert_array_equal(x, np.arange(1, 121))  # steps count from 1
    np.testing.assert_array_equal(y.astype(np.float32), reference_backend_losses(names_corpus, 120))
    assert len(window.run_list.runs) == 1 and window.run_list.runs[0].steps == 120
    assert window.run_list.runs[0].status == "finished" and window.status_labels["step"].text() == "Step 120 / 120"
    set_steps(window, 60)
    window.config_panel.lr_spin.setValue(0.02)  # another configuration: a new run
    assert window.train_button.text() == "Train"


# the run's dataset and the Runs tab ------------------------------------------------------------------
def test_the_dataset_box_and_the_runs_table_show_the_run_s_own_dataset(
        make_window, names_path, names_corpus, qtbot, tmp_path):
    window = make_window(names_path)
    train_to_end(qtbot, window, 20)
    window.open_dataset(str(second_dataset(tmp_path)))
    qtbot.waitUntil(lambda: window.dataset_path.endswith("other.txt"), timeout=TIMEOUT_MS)
    wait_state(qtbot, window, "none")  # the names.txt run has ended
    train_to_end(qtbot, window, 20)
    window.load_checkpoint(str(saved_elsewhere(names_corpus, tmp_path)))
    wait_state(qtbot, window, "done")
    qtbot.waitUntil(lambda: len(window.run_list.runs) == 3, timeout=TIMEOUT_MS)
    info = window.config_panel.dataset_info.text()
    assert f"{len(names_corpus):,} documents" in info and "elsewhere.npz" in info and "other.txt" in info
    panel = window.run_list
    dataset_col = COLUMNS.index("Dataset")
    assert [panel.table.item(r, dataset_col).text() for r in range(3)] == [
        "names.txt", "other.txt", "the dataset in elsewhere.npz"]
    assert [panel.comparable(r) for r in panel.runs] == [True, False, True]  # the loaded run is names.txt's
    window.tabs.setCurrentWidget(panel)  # (a hidden Runs tab is restyled when shown)
    assert panel.table.item(1, 0).font().italic() and "not comparable" in panel.info.text()


def test_a_reloaded_checkpoint_continues_its_run_s_row(make_window, names_path, names_corpus, qtbot, tmp_path):
    """Save at 60 steps, continue to 120, load the checkpoint: one row, rewound to step
    60 with its step times; loaded again, still one row; another run's checkpoint is
    a run of its own (issue 27: a loaded checkpoint appeared as a second copy)."""
    window = make_window(names_path)
    train_to_end(qtbot, window, 60)
    path = tmp_path / "sixty.npz"
    window.save_checkpoint(str(path))
    qtbot.waitUntil(lambda: not window.run.unsaved, timeout=TIMEOUT_MS)
    set_steps(window, 120)
    click(qtbot, window, "trainButton")  # Continue to 120 steps
    qtbot.waitUntil(lambda: window.loss_plot.series.n == 120 and window.state == "done", timeout=TIMEOUT_MS)
    panel = window.run_list
    record = panel.runs[0]
    assert record.steps == 120
    for _ in range(2):
        before = window.session
        window.load_checkpoint(str(path))
        # the loaded run's own: the run before it was done, saved to path too, and "loaded"
        # comes with the opening, before the checkpoint's losses rewind the row
        qtbot.waitUntil(lambda: window.session is not before and window.run.saved_path == str(path)
                        and window.state == "done" and panel.runs[-1].status == "loaded", timeout=TIMEOUT_MS)
        assert panel.runs == [record] and panel.table.rowCount() == 1
        assert record.steps == 60 and record.train.num_steps == 60 and not np.isnan(record.ms_per_step)
        np.testing.assert_array_equal(record.losses, window.session.worker.loss_history())
    before = window.session
    elsewhere = saved_elsewhere(names_corpus, tmp_path)
    window.load_checkpoint(str(elsewhere))
    # opened, its history reported (the phase follows the losses): the row is listed at the opening
    qtbot.waitUntil(lambda: window.session is not before and len(panel.runs) == 2 and window.run.saved_path == str(elsewhere)
                    and window.state == "done", timeout=TIMEOUT_MS)
    assert [r.name for r in panel.runs] == ["run 1", "run 2"] and panel.runs[1].steps == 30
    window.tabs.setCurrentWidget(panel)  # the table is filled while on screen
    steps, status = COLUMNS.index("Steps"), COLUMNS.index("Status")
    assert [(panel.table.item(r, steps).text(), panel.table.item(r, status).text()) for r in range(2)] == [
        ("60", "loaded"), ("30", "loaded")]


def test_runs_can_be_removed_and_an_ended_run_is_compacted(qtbot):
    from gui.run_list import RunListPanel

    panel = RunListPanel()
    qtbot.addWidget(panel)
    p = engine.PRESETS["tiny"]
    records = []
    for i in range(MAX_CHECKED + 2):
        r = RunRecord(f"run {i + 1}", "numpy", p.model, p.train, dataset="names.txt", dataset_hash="a")
        r.extend(np.linspace(3, 2, 100), 0, 0.1)
        panel.add_run(r)
        records.append(r)
    assert len(panel.checked_runs()) == MAX_CHECKED and panel.checked_runs()[0] is records[2]
    assert len(panel.curves) == MAX_CHECKED
    panel.table.selectRow(0)
    panel.table.selectRow(4)
    panel.remove_runs([records[0], records[4]])
    assert panel.runs == [r for i, r in enumerate(records) if i not in (0, 4)]
    assert panel.table.rowCount() == len(records) - 2 and id(records[4]) not in panel.curves
    long = RunRecord("long", "numpy", p.model, p.train)
    losses = np.random.default_rng(0).random(50_000).astype(np.float32)
    long.extend(losses, 0, 50.0)
    panel.add_run(long)
    panel.run_ended(long)
    assert len(long.losses) <= MAX_POINTS and long.steps == 50_000
    block = long.block
    assert long.losses[1] == pytest.approx(losses[block:2 * block].mean(), rel=1e-5)
    assert long.ms_per_step == pytest.approx(1.0)
    x, _ = panel.curves[id(long)].getOriginalDataset()
    assert len(x) == len(long.losses) and list(x[:2]) == [1, block + 1]  # each block's first step, from 1


# autosave and opening ----------------------------------------------------------------------------------
def test_autosave_writes_checkpoints_and_keeps_the_newest(make_window, names_path, qtbot, tmp_path):
    window = make_window(names_path)
    saver = window.runs.autosaver
    saver.folder, saver.keep = tmp_path, 2
    saver.set_minutes(0.5 / 60)  # every half second of training
    set_steps(window, 1_000_000)
    click(qtbot, window, "trainButton")
    qtbot.waitUntil(lambda: len(autosaves(tmp_path)) >= 2, timeout=TIMEOUT_MS)
    for _ in range(2):
        saver.poll()
        qtbot.wait(600)
        saver.poll()
    qtbot.wait(500)
    assert 1 <= len(autosaves(tmp_path)) <= 2
    assert engine.read_checkpoint(autosaves(tmp_path)[0]).step > 0
    assert window.run.unsaved  # an autosave is a safety net, not the user's save


def test_an_opening_shows_its_elapsed_seconds(make_window, names_path, qtbot):
    slow_backend.register(slow_backend.Delays(open_s=2.5))
    try:
        window = make_window(names_path)
        assert window.config_panel.select_backend(slow_backend.NAME)
        set_steps(window, 20)
        window.start_run()
        bar = window.progress_bar
        qtbot.waitUntil(lambda: bar.format().endswith("1 s"), timeout=TIMEOUT_MS)
        # text() is what Qt draws: nothing on a busy bar (issue 27's first build)
        assert bar.isTextVisible() and bar.text() == bar.format()
        assert bar.text().startswith("opening the slow-numpy backend… ")
        wait_state(qtbot, window, "done")
    finally:
        slow_backend.unregister()


def test_a_first_use_build_says_what_it_does_and_counts_its_seconds_to_the_end(make_window, names_path, qtbot):
    """As the command line does: the build's announcement, in the progress bar with the
    seconds so far and in the status bar, for the whole build (12 s here, past the
    10 s a status message used to last)."""
    slow_backend.register(slow_backend.Delays(build_s=12.0))
    try:
        window = make_window(names_path)
        assert window.config_panel.select_backend(slow_backend.NAME)
        set_steps(window, 20)
        window.start_run()
        bar, status = window.progress_bar, window.statusBar()
        building = f"building {slow_backend.NAME} (first use, about 12 s)… "
        qtbot.waitUntil(lambda: bar.text().startswith(building), timeout=TIMEOUT_MS)
        qtbot.waitUntil(lambda: bar.text() == building + "11 s", timeout=TIMEOUT_MS)
        assert window.state == "opening"
        assert status.message() == (
            f"building {slow_backend.NAME} from the shipped C with cc 1.0 (first use, about 12 s)...")
        wait_state(qtbot, window, "done")
    finally:
        slow_backend.unregister()
