"""The soak's actions (scripts/soak.py): each takes the Soak and does what a
user might, on its current window; ACTIONS maps a name to (weight, action).
Some act in steps, later, through soak.later and `when`, so that Reset, Load
checkpoint and close land while a slow model opens or names are sampled."""
from __future__ import annotations

import os
import time

PRESETS = ["tiny", "tiny", "s32", "s64", "s128", "s128", "s256"]
MAX_FIFOS = 3  # each FIFO read may leave a daemon thread waiting until the end

def key(soak, keys: str) -> None:
    from PySide6.QtGui import QKeySequence
    from PySide6.QtTest import QTest

    combo = QKeySequence(keys)[0]
    target = soak.window if soak.rng.random() < 0.7 else soak.window.sample_panel.count_spin
    QTest.keyClick(target, combo.key(), combo.keyboardModifiers())


def click(soak, button) -> None:
    if button.isEnabled():
        button.click()


def set_preset(soak) -> None:
    soak.window.config_panel.preset_combo.setCurrentText(soak.rng.choice(PRESETS))


def set_field(soak) -> None:
    panel, rng = soak.window.config_panel, soak.rng
    name = rng.choice(["n_embd", "n_layer", "n_head", "block_size"])
    values = {"n_embd": [8, 10, 16, 32, 64, 96, 128], "n_layer": [1, 2, 3, 4], "n_head": [1, 2, 3, 4, 8],
              "block_size": [4, 8, 16, 32, 64]}[name]
    panel.fields[name].setValue(rng.choice(values))


def set_training(soak) -> None:
    panel, rng = soak.window.config_panel, soak.rng
    panel.steps_spin.setValue(rng.choice([20, 100, 500, 1000, 3000, 20_000]))
    if rng.random() < 0.3:
        panel.lr_spin.setValue(rng.choice([0.0005, 0.001, 0.01, 0.5]))


def set_backend(soak) -> None:
    soak.window.config_panel.select_backend(soak.rng.choice(["numpy", soak.slow.NAME, soak.slow.NAME]))


def slow_down(soak) -> None:
    rng = soak.rng
    soak.slow.SlowBackend.delays = soak.slow.Delays(
        open_s=rng.choice([0.0, 0.3, 1.0, 2.5]), train_s=rng.choice([0.0, 0.01, 0.05]),
        sample_s=rng.choice([0.0, 0.5, 1.5, 3.0]), cancellable=rng.random() < 0.7)


def sliders(soak) -> None:
    w, rng = soak.window, soak.rng
    w.loss_plot.smoothing_slider.setValue(rng.randrange(0, 1000))
    w.sample_panel.temperature_slider.setValue(rng.randrange(1, 21))
    w.sample_panel.count_spin.setValue(rng.choice([1, 10, 50, 200]))
    if rng.random() < 0.3:
        w.loss_plot.log_y.toggle()


def save(soak) -> None:
    soak.window.save_checkpoint(str(soak.folder / f"run{soak.rng.randrange(3)}.npz"))


def load(soak) -> None:
    saved = sorted(soak.folder.glob("run*.npz"))
    candidates = saved + [soak.files["corrupt"], soak.folder / "missing.npz"]
    soak.window.load_checkpoint(str(soak.rng.choice(candidates)))


def export(soak) -> None:
    if soak.rng.random() < 0.5:
        soak.window.export_csv(str(soak.folder / "loss.csv"))
    else:
        soak.window.export_png(str(soak.folder / "loss.png"))


def open_dataset(soak) -> None:
    choice = soak.rng.choice(["names", "names", "small", "empty", "missing", "fifo"])
    if choice == "fifo":
        if len(soak.fifos) >= MAX_FIFOS or not hasattr(os, "mkfifo"):
            return
        path = soak.folder / f"names{len(soak.fifos)}.fifo"
        os.mkfifo(path)
        soak.fifos.append(path)
    else:
        path = soak.files[choice]
    soak.window.open_dataset(str(path))


def close_and_reopen(soak) -> None:
    if soak.windows_made >= soak.args.max_windows:
        return
    soak.window.close()  # with a busy worker: hidden now, closed when it has finished
    soak.new_window()


def when(soak, condition, fn, patience_s: float = 15.0) -> None:
    """fn() once condition() holds (checked every 50 ms, the event loop running), or never."""
    deadline = time.monotonic() + patience_s

    def check():
        if condition():
            fn()
        elif time.monotonic() < deadline:
            soak.later(50, check)

    check()


def idle(soak) -> bool:
    return soak.window.state in ("none", "done", "failed") and soak.window.corpus is not None


def train_big_then(soak, then) -> None:
    """Start an s128/s256 run on the slow backend (ending the current one first),
    and `then` while it opens."""
    window = soak.window
    if not idle(soak):
        window.reset()

    def start():
        panel = window.config_panel
        panel.preset_combo.setCurrentText(soak.rng.choice(["s128", "s256"]))
        panel.select_backend(soak.slow.NAME)
        soak.slow.SlowBackend.delays.open_s = max(soak.slow.SlowBackend.delays.open_s, 1.0)
        if window.start_run():
            soak.later(soak.rng.choice([50, 200, 600]), lambda: then(soak))

    when(soak, lambda: window is soak.window and idle(soak), start)


def sample_then(soak, then) -> None:
    """Ask for samples (slow ones; a short slow run first if there is no model),
    and `then` while they are being made."""
    window = soak.window

    def sample():
        soak.slow.SlowBackend.delays.sample_s = max(soak.slow.SlowBackend.delays.sample_s, 1.0)
        window.sample_panel.count_spin.setValue(soak.rng.choice([10, 200]))
        window.sample_panel.request()
        soak.later(soak.rng.choice([50, 300]), lambda: then(soak))

    has_model = lambda: window is soak.window and window.state in ("ready", "running", "paused", "done")
    if not has_model():
        if not idle(soak):
            return
        window.config_panel.preset_combo.setCurrentText(soak.rng.choice(["tiny", "s128"]))
        window.config_panel.select_backend(soak.slow.NAME)
        window.config_panel.steps_spin.setValue(soak.rng.choice([20, 100_000]))
        soak.slow.SlowBackend.delays.open_s = min(soak.slow.SlowBackend.delays.open_s, 0.3)
        if not window.start_run():
            return
    when(soak, has_model, sample)


def reset(soak) -> None:
    soak.window.reset()


def explore(soak) -> None:
    """The explore tabs: show one (a model tab makes the worker send snapshots),
    type in it, sample from a prefix, open a name's attention."""
    window, rng = soak.window, soak.rng
    key(soak, f"Ctrl+{rng.randint(1, 5)}")
    text = "".join(rng.choice("aeiklmnorsy") for _ in range(rng.randint(0, 4)))
    choice = rng.choice(["prefix", "attention", "prefix sample", "none"])
    if choice == "prefix":
        window.next_char_panel.prefix_edit.setText(text)
    elif choice == "attention":
        window.attention_panel.name_edit.setText(text or "emma")
    elif choice == "prefix sample":
        click(soak, window.next_char_panel.sample_button)


def scaling_study(soak) -> None:
    """Open the study, start it, and cancel and close it while it measures."""
    from shiboken6 import isValid

    dialog = soak.window.show_scaling_study()
    if dialog is None:
        return
    # the dialog goes with its window (closed meanwhile) or with a new dataset's study
    if_alive = lambda fn: lambda: fn() if isValid(dialog) else None
    if dialog.run():
        soak.later(soak.rng.choice([100, 1500]), if_alive(dialog.cancel))
    soak.later(2000, if_alive(dialog.close))


ACTIONS = {
    "F5": (10, lambda s: key(s, "F5")),
    "Shift+F5": (4, lambda s: key(s, "Shift+F5")),
    "Ctrl+R": (3, lambda s: key(s, "Ctrl+R")),
    "Ctrl+G": (5, lambda s: key(s, "Ctrl+G")),
    "train button": (4, lambda s: click(s, s.window.train_button)),
    "stop button": (2, lambda s: click(s, s.window.stop_button)),
    "reset button": (2, lambda s: click(s, s.window.reset_button)),
    "sample button": (3, lambda s: click(s, s.window.sample_panel.sample_button)),
    "preset": (4, set_preset),
    "model field": (3, set_field),
    "training fields": (3, set_training),
    "backend": (3, set_backend),
    "slow down": (3, slow_down),
    "sliders": (3, sliders),
    "save checkpoint": (3, save),
    "load checkpoint": (3, load),
    "export": (3, export),
    "open dataset": (2, open_dataset),
    "about": (1, lambda s: s.window.show_about()),
    "close and reopen": (1, close_and_reopen),
    "reset while opening big": (3, lambda s: train_big_then(s, reset)),
    "load while opening big": (3, lambda s: train_big_then(s, load)),
    "close while opening big": (1, lambda s: train_big_then(s, close_and_reopen)),
    "reset while sampling": (3, lambda s: sample_then(s, reset)),
    "close while sampling": (1, lambda s: sample_then(s, close_and_reopen)),
    "load while sampling": (2, lambda s: sample_then(s, load)),
    "export while sampling": (2, lambda s: sample_then(s, export)),
    "explore tabs": (6, explore),
    "scaling study": (1, scaling_study),
}
