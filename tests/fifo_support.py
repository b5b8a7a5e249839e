"""Refusing a named pipe: opening one with no writer to read waits forever, so a
loader must refuse it without opening it (engine.data.files checks before opening)."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest


def fifo_refusal(fifo: Path, load, error: type[Exception]) -> Exception:
    """Make a FIFO at `fifo` with no writer and return the `error` that load(fifo)
    raises; fail if load blocks (more than 20 s) or returns."""
    os.mkfifo(fifo)
    outcome = []

    def attempt():
        try:
            load(fifo)
        except error as exc:
            outcome.append(exc)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(timeout=20)
    if thread.is_alive():  # unblock the reader before failing
        with open(fifo, "wb"):
            pass
        pytest.fail(f"reading the FIFO {fifo.name} blocked")
    assert outcome, f"{fifo.name}: no {error.__name__} raised"
    return outcome[0]
