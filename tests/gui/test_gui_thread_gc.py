"""gui/gui_thread_gc.py: garbage made anywhere is collected on the GUI thread."""
from __future__ import annotations

import gc
import threading


def test_collection_is_off_while_started_and_restored_after(qapp):
    from gui.gui_thread_gc import GuiThreadCollector

    assert not gc.isenabled()  # the suite's own collector (conftest) is running
    gc.enable()
    collector = GuiThreadCollector()
    collector.start()
    assert not gc.isenabled()
    collector.stop()
    assert gc.isenabled()
    gc.disable()  # as the suite's collector left it


def test_cycles_made_in_a_worker_thread_are_collected_on_the_gui_thread(qtbot):
    finalized_in = []
    kept = []

    class Node:
        def __init__(self):
            self.me = self  # a cycle: only the cyclic collector frees it

        def __del__(self):
            finalized_in.append(threading.current_thread())

    def work():
        Node()
        kept.append([[] for _ in range(50_000)])  # allocations far past every threshold, in this thread

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert finalized_in == []  # the worker's allocations collected nothing there
    qtbot.waitUntil(lambda: bool(finalized_in), timeout=5_000)
    assert finalized_in == [threading.main_thread()]


def test_the_due_generation_follows_the_thresholds(qapp):
    from gui.gui_thread_gc import GuiThreadCollector

    collector = GuiThreadCollector()
    gc.collect()
    collector.thresholds = (10**9, 10, 10)
    assert collector.due_generation() is None
    collector.thresholds = (0, 10**9, 10**9)  # a threshold of 0 never triggers (as in CPython)
    assert collector.due_generation() is None
    collector.deleteLater()


def test_a_frozen_start_leaves_what_lived_before_out_of_collections(qtbot):
    """freeze=True (the app's start): the objects alive then are no longer walked
    by a collection, garbage made afterwards still is (on the GUI thread), and
    stop makes the frozen ones collectable again."""
    from gui.gui_thread_gc import GuiThreadCollector

    finalized = []

    class Node:
        def __init__(self, name):
            self.name, self.me = name, self  # a cycle: only the cyclic collector frees it

        def __del__(self):
            finalized.append(self.name)

    old = [Node("before")]  # alive when the collector starts
    assert gc.get_freeze_count() == 0
    collector = GuiThreadCollector()
    collector.start(freeze=True)
    try:
        assert gc.get_freeze_count() > 1000  # the imports' modules, classes, functions...
        old.clear()  # garbage now, but frozen: no collection frees it
        Node("after")  # garbage made after the start
        gc.collect()  # a full collection on this thread, as the timer makes them
        assert finalized == ["after"]
    finally:
        collector.stop()
        collector.deleteLater()
    assert gc.get_freeze_count() == 0
    assert finalized == ["after", "before"]  # stop's collection, once unfrozen
