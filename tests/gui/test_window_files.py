"""The window's files driven through its widgets (pytest-qt, offscreen):
checkpoints saved and loaded, bad files refused with nothing changed, only the
newest Open dataset or Load checkpoint counting, CSV export, and the packaged
dataset on a first start."""
import numpy as np
from PySide6.QtWidgets import QProgressBar, QPushButton

import engine

from test_window import (TIMEOUT_MS, click, curve, reference_losses, set_steps, train_to_end, wait_state,
                         wait_steps, widget)


def test_checkpoint_save_then_load_resumes_curve_and_step(make_window, names_path, names_corpus, qtbot, tmp_path):
    window = make_window(names_path)
    set_steps(window, 300)
    click(qtbot, window, "trainButton")
    wait_steps(qtbot, window)
    click(qtbot, window, "stopButton")
    wait_state(qtbot, window, "done")
    saved_step = window.session.worker.step
    assert 0 < saved_step < 300
    saved_history = window.session.worker.loss_history()
    path = tmp_path / "run.npz"
    window.save_checkpoint(str(path))
    qtbot.waitUntil(path.exists, timeout=TIMEOUT_MS)
    click(qtbot, window, "resetButton")

    window.load_checkpoint(str(path))
    wait_state(qtbot, window, "ready")
    qtbot.waitUntil(lambda: window.loss_plot.series.n == saved_step, timeout=TIMEOUT_MS)
    x, y = curve(window)
    np.testing.assert_array_equal(x, np.arange(1, saved_step + 1))  # steps from 1
    np.testing.assert_array_equal(y.astype(np.float32), saved_history)
    assert window.status_labels["step"].text() == f"Step {saved_step} / 300"
    assert widget(window, QProgressBar, "progressBar").value() == saved_step
    click(qtbot, window, "trainButton")  # Resume from the checkpoint
    wait_state(qtbot, window, "done")
    x, y = curve(window)
    np.testing.assert_array_equal(x, np.arange(1, 300 + 1))  # steps from 1
    np.testing.assert_array_equal(y.astype(np.float32), reference_losses(names_corpus, 300))


def wait_message(qtbot, window, count):
    """Wait for the window's count-th message (files are read off the GUI thread)."""
    qtbot.waitUntil(lambda: len(window.messages) >= count, timeout=TIMEOUT_MS)
    return window.messages[count - 1]


def test_bad_files_give_messages_and_change_nothing(make_window, names_path, qtbot, tmp_path):
    window = make_window(names_path)
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(b"not a checkpoint")
    window.load_checkpoint(str(corrupt))
    kind, _, text = wait_message(qtbot, window, 1)
    assert kind == "error" and "corrupt" in text
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    window.open_dataset(str(empty))
    assert "no documents" in wait_message(qtbot, window, 2)[2]
    assert window.dataset_path == str(names_path) and window.state == "none"
    train_to_end(qtbot, window, 10)


def test_only_the_newest_open_dataset_and_load_checkpoint_count(make_window, names_path, qtbot, tmp_path,
                                                                 monkeypatch):
    import threading

    from gui import dataset_control, file_actions

    window = make_window(names_path)
    gates = {str(tmp_path / name): threading.Event() for name in ("slow.txt", "fast.txt", "slow.npz")}
    for name, text in [("slow.txt", "ann\nbob\n"), ("fast.txt", "cat\ndog\n")]:
        (tmp_path / name).write_text(text)
    read_corpus = dataset_control.read_corpus

    def read_when_let(path):  # each file is read once its gate opens
        assert gates[path].wait(TIMEOUT_MS / 1000)
        return read_corpus(path)

    monkeypatch.setattr(dataset_control, "read_corpus", read_when_let)
    slow, fast = (str(tmp_path / name) for name in ("slow.txt", "fast.txt"))
    window.open_dataset(slow)
    window.open_dataset(fast)  # supersedes the slow read
    gates[fast].set()
    qtbot.waitUntil(lambda: window.dataset_path == fast, timeout=TIMEOUT_MS)
    assert not window.reading_dataset
    gates[slow].set()
    qtbot.wait(200)  # the slow read's report comes, and is dropped
    assert window.dataset_path == fast and window.corpus.chars == list("acdgot") and not window.messages

    monkeypatch.setattr(file_actions, "read_checkpoint", read_when_let)
    window.load_checkpoint(str(tmp_path / "slow.npz"))
    window.reset()  # forgets the checkpoint being read
    gates[str(tmp_path / "slow.npz")].set()  # read_corpus of a missing file: a failure, dropped
    qtbot.wait(200)
    assert not window.messages and window.state == "none"


def test_export_csv_matches_the_history(make_window, names_path, qtbot, tmp_path):
    window = make_window(names_path)
    train_to_end(qtbot, window, 40)
    path = tmp_path / "loss.csv"
    with qtbot.waitSignal(window.exported, timeout=TIMEOUT_MS):
        window.export_csv(str(path))
    assert path.read_text().splitlines()[0] == "step,loss,smoothed,heldout"  # as README says
    table = np.loadtxt(path, delimiter=",", skiprows=1, usecols=(0, 1, 2))
    np.testing.assert_array_equal(table[:, 0], np.arange(1, 41))  # steps count from 1, as the window's
    np.testing.assert_allclose(table[:, 1], window.session.worker.loss_history(), atol=1e-6)
    png = tmp_path / "plot.png"
    window.export_png(str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert window.statusBar().currentMessage() == f"Plot exported to {png}"  # a PNG export confirms too


def test_a_first_start_opens_the_packaged_names_with_no_network(make_window, no_network):
    from engine.data import corpus as data

    window = make_window(None)  # no --data and no dataset in the settings
    assert window.dataset_path == str(data.DEFAULT_DATASET_PATH) and not window.messages
    assert len(window.corpus) == 32033 and window.corpus.vocab_size == 27
    assert widget(window, QPushButton, "trainButton").isEnabled()


def test_a_damaged_packaged_dataset_offers_open_dataset(make_window, qtbot, monkeypatch):
    def damaged():
        raise engine.DatasetError("the packaged dataset names.txt has been changed; reinstall microgpt-gui")

    monkeypatch.setattr(engine, "default_dataset_path", damaged)
    window = make_window(None)
    qtbot.waitUntil(lambda: bool(window.messages), timeout=TIMEOUT_MS)
    assert "reinstall" in window.messages[-1][2]
    assert "Open dataset" in window.config_panel.dataset_info.text()
    train = widget(window, QPushButton, "trainButton")
    assert not train.isEnabled() and "open a dataset" in train.toolTip()
