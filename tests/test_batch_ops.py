"""A training batch's faster operations (engine.model.batch_ops) against NumPy's plain
forms and float64 references, and engine.backends.heap: a batched step on NumPy takes
no fresh memory from the system once it is running."""
from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from engine.model import batch_ops

REPO_ROOT = Path(__file__).resolve().parents[1]  # (tests/gui's conftest shadows tests/conftest.py in a whole run)


def attention_like(shape, seed=0):
    """Random rows with a causal mask's -inf above the diagonal, as attention logits."""
    z = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
    t = shape[-1]
    return z + np.triu(np.full((t, t), -np.inf, dtype=np.float32), 1)


@pytest.mark.parametrize("shape", [(32, 4, 11, 11), (3, 2, 1, 1), (2, 2, 40, 40), (352, 27)])
def test_row_max_is_numpys_max_exactly(shape):
    z = attention_like(shape) if shape[-1] == shape[-2] else np.random.default_rng(1).normal(size=shape)
    got = batch_ops.row_max(z, np)
    assert got.shape == (*shape[:-1], 1)
    np.testing.assert_array_equal(got, z.max(axis=-1, keepdims=True))


def test_row_max_keeps_a_nan_row_nan():
    z = attention_like((2, 1, 5, 5))
    z[1, 0, 3, 2] = np.nan
    got = batch_ops.row_max(z, np)[..., 0]
    assert np.isnan(got[1, 0, 3]) and np.isfinite(np.delete(got.reshape(-1), 1 * 5 + 3)).all()


@pytest.mark.parametrize("shape", [(32, 4, 11, 11), (352, 27), (4, 3)])
def test_row_sum_matches_a_float64_sum(shape):
    z = np.random.default_rng(2).random(shape).astype(np.float32)
    got = batch_ops.row_sum(z, np)
    assert got.shape == (*shape[:-1], 1) and got.dtype == np.float32
    np.testing.assert_allclose(got, z.astype(np.float64).sum(axis=-1, keepdims=True), rtol=1e-6)


def test_add_rows_sorted_adds_repeated_rows_and_leaves_absent_ones():
    rng = np.random.default_rng(3)
    rows = rng.integers(0, 20, size=300)
    rows[rows == 7] = 8  # row 7 never occurs
    values = rng.normal(size=(300, 6)).astype(np.float32)
    out = np.zeros((27, 6), dtype=np.float32)
    batch_ops.add_rows_sorted(out, rows, values, np)
    want = np.zeros((27, 6))
    for r, v in zip(rows, values.astype(np.float64)):
        want[r] += v
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert (out[7] == 0).all() and (out[20:] == 0).all()


def test_qkv_grads_merged_is_the_three_products_merged_as_the_qkv_product():
    b, h, t, hd = 3, 2, 5, 4
    rng = np.random.default_rng(4)
    datt, p = rng.normal(size=(2, b, h, t, t)).astype(np.float32)
    q, k, dy = rng.normal(size=(3, b, h, t, hd)).astype(np.float32)
    got = batch_ops.qkv_grads_merged(datt, p, q, k, dy, np)
    dq = np.einsum("bhts,bhsd->bhtd", datt, k)
    dk = np.einsum("bhts,bhtd->bhsd", datt, q)
    dv = np.einsum("bhts,bhtd->bhsd", p, dy)
    for part, want in enumerate((dq, dk, dv)):  # (B, T, C) blocks of C = H x hd, head-major
        block = got[:, :, part * h * hd : (part + 1) * h * hd].reshape(b, t, h, hd).swapaxes(1, 2)
        np.testing.assert_allclose(block, want, rtol=1e-5, atol=1e-6)


# engine.backends.heap ---------------------------------------------------------------------

FAULTS_PER_STEP = textwrap.dedent("""
    import resource, sys
    import engine.backends.numpy_backend as nb
    import engine.backends.futhark_backend as fbk
    if sys.argv[1] == "off":
        nb.keep_freed_memory = fbk.keep_freed_memory = lambda step_bytes: None
    from engine import PRESETS, Corpus, open_backend
    names = ["".join(chr(97 + (i * 7 + j * 3) % 26) for j in range(3 + i % 12)) for i in range(500)]
    preset = PRESETS["learn"]  # batch 32
    backend = open_backend(sys.argv[2], preset.model, preset.train, Corpus.from_lines(names))
    backend.train(10)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    backend.train(40)
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 40)
""")


def fresh_process_result(script: str, *args: str) -> float:
    """The number a script prints last, run in a fresh process (glibc's thresholds at
    their start)."""
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return float(done.stdout.strip().splitlines()[-1])


def faults_per_step(mode: str, backend: str = "numpy") -> float:
    """Minor page faults per batched step on `learn`, in a fresh process, with
    engine.backends.heap's priming "on" or "off"."""
    return fresh_process_result(FAULTS_PER_STEP, mode, backend)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="engine.backends.heap tunes glibc's malloc")
def test_a_batched_step_takes_no_fresh_pages_once_running():
    # about 200 faults per step (a step's activations mapped again) without the priming
    assert faults_per_step("off") > 50
    assert faults_per_step("on") < 5


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="engine.backends.heap tunes glibc's malloc")
def test_futhark_cs_batched_step_takes_no_fresh_pages_once_running():
    # Futhark keeps its buffers of 1 MiB and more; the smaller ones come from malloc
    # each step (about 40 fresh pages a step at learn without the priming)
    from engine.backends import probe_backend

    ok, reason = probe_backend("futhark-c")
    if not ok:
        pytest.skip(reason)
    assert faults_per_step("off", "futhark-c") > 10
    assert faults_per_step("on", "futhark-c") < 5


HEAP_BLOCKS = textwrap.dedent("""
    import ctypes, resource, sys
    from engine.backends.heap import keep_freed_memory
    if sys.argv[1] == "on":
        keep_freed_memory(64 << 20)  # a step's activations past glibc's 32 MiB
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def touch(size):  # malloc, write every page, free
        block = libc.malloc(size)
        ctypes.memset(block, 1, size)
        libc.free(block)

    touch(24 << 20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    touch(24 << 20)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="engine.backends.heap tunes glibc's malloc")
def test_a_step_past_32_mib_keeps_its_freed_memory_too():
    """keep_freed_memory for a step of more than glibc's largest dynamic threshold
    (32 MiB) frees a block just under it: one of exactly 32 MiB is a page over once
    malloc's header is counted, and left the thresholds where they were (every
    block of 24 MiB then mapped afresh: 6,144 page faults)."""
    assert fresh_process_result(HEAP_BLOCKS, "off") > 1000
    assert fresh_process_result(HEAP_BLOCKS, "on") < 50
