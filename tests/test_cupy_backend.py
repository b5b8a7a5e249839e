"""The cupy backend.

Without a GPU (CI, most machines) these tests check what is ours and runs
anywhere: the availability probe's reasons (CuPy missing, no driver, old
driver, no device, broken libraries), that opening the backend fails with a
clear BackendError, that the fused Adam step's statements equal
engine.model.gpt.adam_update, and that CupyBackend's chunk logic (device-resident
tokens, the masked fused step, one read-back per chunk, divergence and
out-of-memory handling) trains like the NumPy backend when it runs on NumPy
arrays (HostLogicBackend below: NumPy itself, not a fake CuPy). It is bit for
bit today; the tests allow 1e-6 so that a reordered adam_update does not break them.

The tests that need CuPy and a CUDA device are in test_cupy_gpu.py.
"""
from __future__ import annotations

import sys
import types
from dataclasses import replace

import numpy as np
import pytest

import engine.backends.cupy_backend as cb
import engine.backends.cupy_probe as cupy_probe
import engine.backends.numpy_backend as nb
from engine import (PRESETS, BackendError, Corpus, ModelConfig, TrainConfig, TrainingDiverged,
                    list_backends, open_backend)
from engine.backends.numpy_backend import NumpyBackend
from engine.model.gpt import adam_update

from cupy_support import HostLogicBackend, assert_same_state, poisoned_params
from reference_model import microgpt_step_tokens


# -- the fused Adam step's arithmetic (no GPU needed) -----------------------

@pytest.mark.parametrize("step", [0, 7, 199])
def test_fused_step_statements_equal_adam_update(step):
    rng = np.random.default_rng(step)
    n = 5000
    p, g = rng.normal(size=(2, n)).astype(np.float32)
    m = rng.normal(scale=0.1, size=n).astype(np.float32)
    v = rng.random(n).astype(np.float32) * 0.01
    tc = TrainConfig(num_steps=200, learning_rate=0.01, beta1=0.85, beta2=0.99, eps=1e-8)
    before = [a.copy() for a in (p, m, v)]
    rp, rm, rv = (a.copy() for a in (p, m, v))
    adam_update(rp, g, rm, rv, np.empty(1 << 12, np.float32), tc.lr_at(step),
                tc.beta1, tc.beta2, tc.eps, step, np, block=1 << 12)
    losses, ok = np.zeros(1, np.float32), np.ones(2, np.int32)
    cb.fused_step_host(p, m, v, g, np.float32(3.0), losses, ok, 0, cb.adam_scalars(tc, step))
    for got, want, old in zip((p, m, v), (rp, rm, rv), before):
        assert np.mean(got != old) > 0.99  # the update did change (almost) every element
        np.testing.assert_array_max_ulp(got, want, maxulp=2)
    assert losses[0] == 3.0 and ok.tolist() == [1, 1]


def test_fused_step_skips_the_bad_step_and_all_after_it():
    rng = np.random.default_rng(0)
    p, m, v, g = (rng.random(64).astype(np.float32) for _ in range(4))
    initial = [a.copy() for a in (p, m, v)]
    tc = TrainConfig(num_steps=10)
    losses, ok = np.zeros(4, np.float32), np.ones(5, np.int32)
    cb.fused_step_host(p, m, v, g, np.float32(2.5), losses, ok, 0, cb.adam_scalars(tc, 0))
    after_first = [a.copy() for a in (p, m, v)]
    assert all((a != b).all() for a, b in zip(after_first, initial))  # step 0 was applied
    for i, loss in ((1, np.nan), (2, 1.0), (3, np.inf)):
        cb.fused_step_host(p, m, v, g, np.float32(loss), losses, ok, i, cb.adam_scalars(tc, i))
    for got, kept in zip((p, m, v), after_first):
        np.testing.assert_array_equal(got, kept)
    assert ok.tolist() == [1, 1, 0, 0, 0]
    np.testing.assert_array_equal(losses, np.array([2.5, np.nan, 1.0, np.inf], np.float32))


def test_kernel_source_holds_the_statements_and_compiles_where_nvrtc_is_present():
    src = cb.kernel_source()
    for statement in cb.ADAM_STATEMENTS:
        assert statement + ";" in src
    assert f"void {cb.KERNEL_NAME}(" in src
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception as exc:  # no CuPy, or no NVRTC library: nothing to compile with
        pytest.skip(f"NVRTC is not usable here ({type(exc).__name__}); compiled by the gpu tests")
    prog = nvrtc.createProgram(src, "fused_adam_step.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [*cb.KERNEL_OPTIONS, "-arch=compute_80"])
        except nvrtc.NVRTCError:
            pytest.fail("the fused kernel does not compile:\n" + nvrtc.getProgramLog(prog))
        ptx = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    assert cb.KERNEL_NAME in ptx
    assert "fma" not in ptx  # --fmad=false: rounds like NumPy's separate multiply and add


# -- CupyBackend's chunk logic, run on NumPy arrays --------------------------

def test_device_token_slices_equal_microgpts_step_tokens(names_corpus):
    model = ModelConfig(16, 1, 4, 8)  # short block: long names get truncated
    backend = HostLogicBackend(model, TrainConfig(num_steps=10, holdout=0), names_corpus)  # microgpt's order
    for step in (0, 1, 2, 100, len(names_corpus) - 1, len(names_corpus), 3 * len(names_corpus) + 5):
        got, want = backend._tokens(step), microgpt_step_tokens(names_corpus, step, model.block_size)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("warmup", [0, 30], ids=["microgpt-schedule", "warmup"])
def test_chunked_logic_trains_like_the_numpy_backend(names_corpus, warmup):
    preset = PRESETS["tiny"].with_steps(60)
    preset = replace(preset, train=replace(preset.train, warmup_steps=warmup))
    ref = NumpyBackend(preset.model, preset.train, names_corpus)
    dev = HostLogicBackend(preset.model, preset.train, names_corpus)
    want = np.concatenate([ref.train(10) for _ in range(5)])
    got = np.concatenate([dev.train(k) for k in (1, 7, 13, 4, 25)])
    assert got.shape == (50,) and np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert 3.0 < want[0] < 3.6  # about log(27): the run really trained from a fresh init
    assert_same_state(dev, ref)
    np.testing.assert_allclose(dev.loss_history, ref.loss_history, rtol=1e-6, atol=1e-6)
    assert dev.sample(5, seed=3) == ref.sample(5, seed=3)


def test_divergence_mid_chunk_keeps_the_parameters_from_before_it():
    corpus = Corpus(["ab", "abc", "abcdefgh", "a", "b"], shuffled=True)
    model, train = ModelConfig(8, 1, 2, 16), TrainConfig(num_steps=20)
    params = poisoned_params(model, corpus, train, position=6)  # doc 2 (9 positions) reaches it
    ref, dev = (cls(model, train, corpus, params.copy()) for cls in (NumpyBackend, HostLogicBackend))
    errors = []
    for backend in (ref, dev):
        with pytest.raises(TrainingDiverged) as info:
            backend.train(5)
        errors.append(info.value)
    assert [e.step for e in errors] == [2, 2] and np.isnan(errors[1].loss)
    assert dev.step == 2 and len(dev.loss_history) == 2 and np.isfinite(dev.loss_history).all()
    assert_same_state(dev, ref)
    untouched = HostLogicBackend(model, train, corpus, params.copy())
    untouched.train(2)  # exactly the two good steps
    assert_same_state(dev, untouched, rtol=0, atol=0)


def test_out_of_memory_mid_chunk_keeps_the_finished_steps(monkeypatch, names_corpus):
    preset = PRESETS["tiny"].with_steps(30)
    ref = NumpyBackend(preset.model, preset.train, names_corpus)
    dev = HostLogicBackend(preset.model, preset.train, names_corpus)
    calls = {"n": 0}
    real = nb.loss_and_grad  # the step CupyBackend inherits (NumpyBackend._step_loss) calls it

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise MemoryError("simulated: out of memory allocating 1.2 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(nb, "loss_and_grad", failing)
    with pytest.raises(BackendError, match="ran out of memory") as info:
        dev.train(6)
    message = str(info.value)
    assert "training step 4" in message and "stopped after step 3" in message
    assert f"{dev.num_params:,} parameters" in message and "smaller preset" in message
    ref.train(3)
    assert dev.step == 3
    np.testing.assert_allclose(dev.loss_history, ref.loss_history, rtol=1e-6)
    assert_same_state(dev, ref)
    monkeypatch.setattr(nb, "loss_and_grad", real)
    np.testing.assert_allclose(dev.train(4), ref.train(4), rtol=1e-6, atol=1e-6)


def test_out_of_memory_while_opening_becomes_backend_error(monkeypatch, small_corpus):
    def no_memory(self, params):
        raise MemoryError("simulated")

    monkeypatch.setattr(nb.NumpyBackend, "_setup", no_memory)
    model = PRESETS["s128"].model
    corpus = small_corpus
    with pytest.raises(BackendError, match="ran out of memory while opening") as info:
        HostLogicBackend(model, TrainConfig(num_steps=5), corpus)
    assert f"{model.num_params(corpus.vocab_size):,} parameters" in str(info.value)


def test_closed_backend_says_so(small_corpus):
    backend = HostLogicBackend(ModelConfig(8, 1, 2, 8), TrainConfig(num_steps=5),
                               small_corpus)
    backend.train(1)
    backend.close()
    with pytest.raises(BackendError, match="closed"):
        backend.train(1)
    with pytest.raises(BackendError, match="closed"):
        backend.sample(1)
    with pytest.raises(BackendError, match="closed"):
        backend.get_params()


# -- the availability probe (our logic, with the import replaced) ------------

class FakeCudaError(RuntimeError):
    NAMES = {35: "cudaErrorInsufficientDriver", 100: "cudaErrorNoDevice",
             803: "cudaErrorSystemDriverMismatch", 999: "cudaErrorUnknown"}

    def __init__(self, status):
        self.status = status
        super().__init__(f"{self.NAMES.get(status, 'cudaError')}: status {status}")


def fake_cupy(count=1, count_error=None, driver=12090, runtime_version=12090, kernel_error=None):
    """A stand-in with the attributes the probe touches; arithmetic by NumPy."""
    def get_device_count():
        if count_error is not None:
            raise FakeCudaError(count_error)
        return count

    def arange(n, dtype):
        if kernel_error is not None:
            raise kernel_error
        return np.arange(n, dtype=dtype)

    runtime = types.SimpleNamespace(
        CUDARuntimeError=FakeCudaError, getDeviceCount=get_device_count,
        driverGetVersion=lambda: driver, runtimeGetVersion=lambda: runtime_version,
        getDeviceProperties=lambda i: {"name": b"NVIDIA Test GPU"})
    cuda = types.SimpleNamespace(runtime=runtime, Device=lambda: types.SimpleNamespace(id=0))
    module = types.SimpleNamespace(cuda=cuda, arange=arange, float32=np.float32, __version__="14.0")
    return lambda: module


def test_probe_says_how_to_install_when_cupy_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` fail
    assert cupy_probe.probe_cupy() == (False, "CuPy is not installed: pip install 'microgpt-gui[cuda]'")


def test_probe_names_a_broken_cupy_install():
    def broken():
        raise ModuleNotFoundError("No module named 'cuda'", name="cuda")

    ok, reason = cupy_probe.probe_cupy(broken)
    assert not ok and "does not import" in reason and "No module named 'cuda'" in reason
    assert cupy_probe.INSTALL_HINT in reason


def test_probe_tells_no_driver_from_an_old_driver():
    ok, reason = cupy_probe.probe_cupy(fake_cupy(count_error=35, driver=0))
    assert not ok and reason.startswith("no NVIDIA driver found")
    ok, reason = cupy_probe.probe_cupy(fake_cupy(count_error=35, driver=11080, runtime_version=12090))
    assert not ok and reason.startswith("the NVIDIA driver is too old for this CuPy")
    assert "supports CUDA 11.8" in reason and "needs CUDA 12.9" in reason


def test_probe_reports_no_device(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cupy_probe.probe_cupy(fake_cupy(count=0)) == (False, "no CUDA device found")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    ok, reason = cupy_probe.probe_cupy(fake_cupy(count_error=100))
    assert not ok and reason.startswith("no CUDA device found")
    assert "CUDA_VISIBLE_DEVICES is set to ''" in reason


def test_probe_reports_other_cuda_failures_and_broken_libraries():
    ok, reason = cupy_probe.probe_cupy(fake_cupy(count_error=803))
    assert not ok and "reboot" in reason
    ok, reason = cupy_probe.probe_cupy(fake_cupy(count_error=999))
    assert not ok and reason.startswith("CUDA did not start") and "cudaErrorUnknown" in reason
    ok, reason = cupy_probe.probe_cupy(fake_cupy(kernel_error=OSError("libnvrtc.so.12: cannot open")))
    assert not ok and "could not run a test kernel" in reason and "libnvrtc.so.12" in reason
    assert "cupy-cuda12x[ctk]" in reason


def test_probe_accepts_a_device_that_computes():
    assert cupy_probe.probe_cupy(fake_cupy()) == (True, "CuPy 14.0 on NVIDIA Test GPU")


def test_registry_lists_cupy_and_open_fails_clearly_without_it(monkeypatch, small_corpus):
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setattr(cupy_probe, "_probe_result", None)
    info = {b.name: b for b in list_backends()}
    assert info["cupy"].available is False
    assert info["cupy"].reason == "CuPy is not installed: pip install 'microgpt-gui[cuda]'"
    assert info["numpy"].available
    with pytest.raises(BackendError, match=r"backend cupy is not available: CuPy is not installed"):
        open_backend("cupy", ModelConfig(), TrainConfig(num_steps=2), small_corpus)
    with pytest.raises(BackendError, match="pip install 'microgpt-gui\\[cuda\\]'"):
        cb.CupyBackend(ModelConfig(), TrainConfig(num_steps=2), small_corpus)


def test_list_backends_survives_a_probe_that_raises(monkeypatch):
    def explode():
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(cupy_probe, "probe", explode)
    info = {b.name: b for b in list_backends()}
    assert info["cupy"].available is False and "driver exploded" in info["cupy"].reason
