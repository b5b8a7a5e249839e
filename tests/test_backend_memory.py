"""Memory checks of the backends, through the NumPy backend: a model, a train
call or a loss history too large for the machine is refused, with what it
needs, before anything is allocated; and the estimate covers what a backend
really allocates."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from engine import PRESETS, BackendError, Corpus, ModelConfig, TrainConfig, load_checkpoint, open_backend
from engine.config import MAX_NUM_STEPS


def test_a_model_larger_than_free_memory_is_refused_before_allocating(monkeypatch, small_corpus):
    from engine.backends import base

    model = PRESETS["s128"].model
    allocated = []
    monkeypatch.setattr(base, "init_params", lambda *a, **k: allocated.append(a))
    monkeypatch.setattr(base, "available_memory_bytes", lambda: 1 << 20)
    with pytest.raises(BackendError) as info:
        open_backend("numpy", model, TrainConfig(num_steps=2), small_corpus)
    message = str(info.value)
    assert f"{model.num_params(small_corpus.vocab_size):,} parameters" in message
    assert "needs about" in message and "but 1.0 MiB is available" in message
    assert allocated == []  # refused before the parameters were made


def test_the_largest_model_is_refused_before_building_the_layout(monkeypatch, small_corpus):
    """n_layer 10^8 (6 x 10^8 parameter matrices, whose listing alone raised MemoryError)
    is past engine.config's limits now; the largest model within them, 77 GB of
    parameters, is still refused by the memory check before anything is built."""
    from engine.backends import base
    from engine.config import FIELD_LIMITS

    def no_layout(*args):
        raise AssertionError("the parameter layout was built")

    monkeypatch.setattr(base, "param_specs", no_layout)
    monkeypatch.setattr(base, "available_memory_bytes", lambda: 16 << 30)
    largest = {name: FIELD_LIMITS["model." + name][1] for name in ("n_embd", "n_layer", "block_size")}
    model = ModelConfig(n_head=4, **largest)
    with pytest.raises(BackendError) as info:
        open_backend("numpy", model, TrainConfig(num_steps=2), small_corpus)
    message = str(info.value)
    assert "1.9e10 parameters" in message and "96 layers" in message
    assert "GiB" in message and "but 16.0 GiB is available" in message


def test_every_buffer_is_counted(monkeypatch, small_corpus):
    """n_embd 8192 passed a check that counted five parameter-sized buffers, then
    failed to allocate: the estimate counts the copies made while saving, a step's
    activations and sampling, so memory for five buffers is no longer enough."""
    from engine.backends import base

    model = ModelConfig(n_embd=4096, n_layer=1, n_head=8, block_size=16)
    n = model.num_params(small_corpus.vocab_size)
    monkeypatch.setattr(base, "available_memory_bytes", lambda: 5 * n * 4 + (1 << 20))
    monkeypatch.setattr(base, "init_params", lambda *a, **k: pytest.fail("allocated"))
    with pytest.raises(BackendError) as info:
        open_backend("numpy", model, TrainConfig(num_steps=2), small_corpus)
    message = str(info.value)
    assert "7 copies of the parameters" in message and "activations" in message and "sampling" in message


def test_a_vocabulary_that_makes_most_of_the_model_is_named(monkeypatch):
    from engine.backends import base

    chars = [chr(0x4E00 + i) for i in range(10_000)]
    corpus = Corpus(["".join(chars[i : i + 10]) for i in range(0, 10_000, 10)], shuffled=True)
    monkeypatch.setattr(base, "available_memory_bytes", lambda: 1 << 26)
    with pytest.raises(BackendError) as info:
        open_backend("numpy", ModelConfig(1024, 1, 8, 16), TrainConfig(num_steps=2), corpus)
    assert "vocabulary of 10,001 characters (wte and lm_head) makes 62% of the parameters" in str(info.value)


def _traced_peak(action) -> int:
    """Bytes allocated (NumPy arrays included) at the peak of action(), above the start."""
    import tracemalloc

    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        action()
        return tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()


def test_the_loss_history_grows_with_the_steps_not_num_steps(small_corpus, small_model):
    """num_steps 10^10 used to allocate a 37 GiB loss history when the backend opened
    (10^7, the most now, would be 40 MB)."""
    opened = []
    peak = _traced_peak(lambda: opened.append(
        open_backend("numpy", small_model, TrainConfig(num_steps=MAX_NUM_STEPS), small_corpus)))
    assert peak < 16 * 2**20
    b = opened[0]
    losses = [b.train(5)]
    assert np.array_equal(b.loss_history, losses[0])
    losses += [b.train(700) for _ in range(3)]  # past the first 1,024 and one doubling
    assert b.step == 2105 and np.array_equal(b.loss_history, np.concatenate(losses))
    assert _traced_peak(lambda: b.train(10)) < 16 * 2**20


def test_a_train_call_too_large_for_memory_is_refused_before_it_runs(small_corpus, small_model,
                                                                      monkeypatch):
    from engine.backends import base

    b = open_backend("numpy", small_model, TrainConfig(num_steps=MAX_NUM_STEPS), small_corpus)
    monkeypatch.setattr(base, "available_memory_bytes", lambda: 1 << 20)
    with pytest.raises(BackendError, match=r"training 10,000,000 steps in one call .* 1\.0 MiB is available"):
        b.train(MAX_NUM_STEPS)  # 40 MB of losses to return, 80 MB of history
    assert b.step == 0
    assert len(b.train(1000)) == 1000  # small calls are not even checked


def test_restored_state_keeps_its_history_and_grows_from_it(small_corpus, small_model):
    a = open_backend("numpy", small_model, TrainConfig(num_steps=3000), small_corpus)
    first = a.train(1500)
    b = open_backend("numpy", small_model, TrainConfig(num_steps=3000), small_corpus)
    b.set_state(a.get_state(), losses=a.loss_history)
    assert np.array_equal(b.loss_history, first)
    assert np.array_equal(b.train(600), a.train(600))
    assert np.array_equal(b.loss_history, a.loss_history)
    c = open_backend("numpy", small_model, TrainConfig(num_steps=3000), small_corpus)
    c.set_state(a.get_state())  # no losses given: unknown ones are NaN
    assert len(c.loss_history) == 2100 and np.isnan(c.loss_history).all()


@pytest.mark.parametrize("case", ["long-documents", "large-vocabulary"])
def test_the_estimate_covers_what_a_backend_really_allocates(case, tmp_path):
    """Open, train, save, sample and load, each measured: the memory check's estimate
    is at least the largest peak (it counted five parameter copies, below the peaks here)."""
    if case == "long-documents":  # steps at the full block_size: activations dominate
        corpus = Corpus(["abcdefghij" * 10, "jihgfedcba" * 9], shuffled=True)
        model = ModelConfig(n_embd=32, n_layer=2, n_head=8, block_size=96)
    else:  # 3,000 characters: embeddings, logits and drawing dominate
        chars = [chr(0x4E00 + i) for i in range(3000)]
        corpus = Corpus(["".join(chars[i : i + 12]) for i in range(0, 3000, 12)], shuffled=True)
        model = ModelConfig(n_embd=32, n_layer=1, n_head=4, block_size=16)
    train = TrainConfig(num_steps=10)
    opened = []
    peaks = {"open": _traced_peak(lambda: opened.append(open_backend("numpy", model, train, corpus)))}
    b = opened[0]
    params = b.get_params()
    params["lm_head"][corpus.bos] = 0  # bos scores 0 at every position: longer names
    b.set_params(params)
    peaks["train"] = _traced_peak(lambda: b.train(3))
    peaks["save"] = _traced_peak(lambda: b.save(tmp_path / "run.npz"))
    peaks["sample"] = _traced_peak(lambda: b.sample(300, 1.0, 0))
    peaks["load"] = _traced_peak(lambda: load_checkpoint(tmp_path / "run.npz"))
    estimate = sum(size for _, size in b.memory_needs())
    assert max(peaks.values()) <= estimate, (peaks, b.memory_needs())
    assert max(peaks.values()) > 5 * b.num_params * 4, peaks  # what the old check counted


def test_memory_check_passes_when_memory_is_unknown_or_enough(monkeypatch, small_corpus):
    from engine.backends import base

    for free in (None, 1 << 34):
        monkeypatch.setattr(base, "available_memory_bytes", lambda free=free: free)
        backend = open_backend("numpy", ModelConfig(8, 1, 2, 8), TrainConfig(num_steps=2), small_corpus)
        assert len(backend.train(2)) == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/meminfo")
def test_available_memory_is_at_most_the_physical_memory():
    from engine.memory import available_memory_bytes

    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < available_memory_bytes() <= physical


# ---- the process's own limits: cgroups (containers) and RLIMIT_AS ------------------

def write_files(root, files: dict) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


GIB = 1 << 30


def test_cgroup_v2_headroom_is_the_tightest_limit_less_usage_without_page_cache(tmp_path):
    from engine.memory import cgroup_headroom_bytes

    root = tmp_path / "sys-fs-cgroup"
    write_files(root, {
        "cgroup.controllers": "cpu memory\n",
        "user.slice/memory.max": "max\n",  # no limit here
        "user.slice/app.scope/memory.max": f"{4 * GIB}\n",
        "user.slice/app.scope/memory.current": f"{3 * GIB}\n",
        "user.slice/app.scope/memory.stat": f"anon {2 * GIB}\ninactive_file {GIB // 2}\n",
    })
    proc = tmp_path / "cgroup"
    proc.write_text("0::/user.slice/app.scope\n")
    assert cgroup_headroom_bytes(proc, root) == 4 * GIB - (3 * GIB - GIB // 2)
    write_files(root, {"user.slice/memory.max": f"{2 * GIB}\n", "user.slice/memory.current": f"{GIB}\n"})
    assert cgroup_headroom_bytes(proc, root) == GIB  # a parent's limit applies too


def test_cgroup_v1_limit_and_a_container_that_sees_its_cgroup_at_the_mount(tmp_path):
    from engine.memory import cgroup_headroom_bytes

    root = tmp_path / "sys-fs-cgroup"
    write_files(root, {  # inside a container the host's path does not exist: the mount is its cgroup
        "memory/memory.limit_in_bytes": f"{6 * GIB}\n",
        "memory/memory.usage_in_bytes": f"{GIB}\n",
        "memory/memory.stat": f"cache {GIB}\ntotal_inactive_file {GIB // 4}\n",
    })
    proc = tmp_path / "cgroup"
    proc.write_text("5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    assert cgroup_headroom_bytes(proc, root) == 6 * GIB - (GIB - GIB // 4)
    write_files(root, {"memory/memory.limit_in_bytes": "9223372036854771712\n"})  # v1's "no limit"
    assert cgroup_headroom_bytes(proc, root) is None
    proc.write_text("garbage\n")
    assert cgroup_headroom_bytes(proc, root) is None


def test_the_available_memory_is_the_least_of_machine_cgroup_and_address_space(monkeypatch):
    from engine import memory

    monkeypatch.setattr(memory, "machine_available_bytes", lambda: 20 * GIB)
    monkeypatch.setattr(memory, "cgroup_headroom_bytes", lambda: 3 * GIB)
    monkeypatch.setattr(memory, "address_space_headroom_bytes", lambda: None)
    assert memory.available_memory_bytes() == 3 * GIB
    assert memory.limit_note() == " (under this process's cgroup memory limit)"
    monkeypatch.setattr(memory, "address_space_headroom_bytes", lambda: GIB)
    assert memory.available_memory_bytes() == GIB
    assert memory.limit_note() == " (under this process's address-space limit, ulimit -v)"
    monkeypatch.setattr(memory, "machine_available_bytes", lambda: GIB // 2)
    assert memory.limit_note() == ""  # the machine itself is the tightest: no process limit to name
    for name in ("machine_available_bytes", "cgroup_headroom_bytes", "address_space_headroom_bytes"):
        monkeypatch.setattr(memory, name, lambda: None)
    assert memory.available_memory_bytes() is None


RLIMIT_CHILD = """
import resource, sys
sys.path.insert(0, sys.argv[1])
from engine import BackendError, Corpus, ModelConfig, TrainConfig, open_backend
from engine.memory import available_memory_bytes
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
assert available_memory_bytes() < 6 << 30, available_memory_bytes()
try:
    open_backend("numpy", ModelConfig(n_embd=4096, n_layer=8, n_head=4, block_size=16),
                 TrainConfig(num_steps=2), Corpus.from_lines(["anna", "bob"]))
except BackendError as exc:
    print(exc)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/statm are Linux's")
def test_an_address_space_limit_is_a_backend_error_not_a_memory_error(tmp_path):
    """Under a 6 GiB RLIMIT_AS, n_embd 8192 raised a raw MemoryError: the check read only
    the machine's free memory."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", RLIMIT_CHILD, str(root)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "the numpy backend needs about" in result.stdout
    assert "GiB is available (under this process's address-space limit, ulimit -v)." in result.stdout
