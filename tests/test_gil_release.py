"""The backends' long calls let other Python threads run meanwhile.

The window trains in a thread beside the GUI thread: a call that kept the
interpreter lock (GIL) for its whole length would freeze the window for as
long. A Futhark entry point is a call into the CFFI module (engine/futhark),
which lets go of the GIL around every C call; these tests hold that to be
so, without timing anything: the switch interval is made so long that no
thread is ever made to give the GIL up, so another thread can run while the
call is in progress only if the call itself lets go of it.
"""
from __future__ import annotations

import sys
import threading
import time

import pytest

from engine import ModelConfig, TrainConfig, open_backend
from engine.backends.futhark_backend import train_entry
from futhark_support import CPU_BACKENDS

NEVER_S = 1000.0  # a switch interval no test reaches: the GIL changes hands only when let go


@pytest.fixture
def no_forced_switches():
    before = sys.getswitchinterval()
    sys.setswitchinterval(NEVER_S)
    yield
    sys.setswitchinterval(before)


def ran_meanwhile(call) -> bool:
    """Whether this thread ran while `call()` was in progress in another thread.

    The other thread marks the call's start and end while holding the GIL, with
    nothing in between that lets it go but the call itself; this thread waits
    for the start (letting go of the GIL) and then looks at the mark between
    short sleeps (letting go of it again). With no forced switches it can see
    the mark set only if the call let go of the GIL."""
    state = {"inside": False, "done": False}
    started = threading.Event()

    def worker():
        started.set()  # from here on, this thread keeps the GIL unless it lets go of it
        state["inside"] = True
        try:
            call()
        finally:
            state["inside"] = False
            state["done"] = True

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    started.wait()
    seen = False
    while not state["done"]:
        seen = seen or state["inside"]
        time.sleep(0.001)  # lets go of the GIL
    thread.join()
    return seen


def test_a_call_that_keeps_the_gil_is_not_seen(no_forced_switches):
    """The check's control: a long computation that never lets go of the GIL
    (pure Python) is never seen in progress."""
    def spin():
        total = 0
        for i in range(3_000_000):
            total += i
        return total

    assert not ran_meanwhile(spin)


@pytest.mark.futhark
@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_a_futhark_train_call_lets_other_threads_run(name, names_corpus, futhark_cpu_builds, no_forced_switches):
    model = ModelConfig(n_embd=64, n_layer=2, n_head=4, block_size=16)
    backend = open_backend(name, model, TrainConfig(num_steps=100_000), names_corpus)
    try:
        entry = train_entry(1)  # the entry point the backend calls
        fut = backend._fut
        result = {}

        def train():
            result["weights"], result["losses"] = getattr(fut, entry)(backend._model, backend._weights, 300)

        assert ran_meanwhile(train)
        backend._weights = result["weights"]
        assert len(fut.from_futhark(result["losses"])) == 300
    finally:
        backend.close()
