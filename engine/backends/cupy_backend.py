"""The `cupy` backend: engine.model.gpt's math on an NVIDIA GPU through CuPy.

Parameters, gradients and both Adam moments live on the GPU for the whole
run, as do the corpus tokens (uploaded once, sliced per step on the device).
A chunk of k steps is queued without waiting for the GPU; the only transfer
per chunk is its k losses, read back at the end.

The Adam update and the divergence check are one fused kernel per step
(`fused_adam_step`): it records the step's loss, and applies the update only
while every loss of the chunk so far is finite. So, without a device sync per
step, the step whose loss is NaN or inf changes nothing (nor do the steps
queued after it), which is what Backend._train_steps promises. The kernel's
arithmetic is the text in ADAM_STATEMENTS; `fused_step_host` runs the very
same statements on NumPy arrays and is the reference the tests compare with
engine.model.gpt.adam_update (on any machine) and with the kernel (on a GPU).

This module imports without CuPy; CuPy is imported when the backend opens or
the probe (engine.backends.cupy_probe: whether CuPy and a device work here) runs.
"""
from __future__ import annotations

import numpy as np

from ..model.gpt import adam_scales
from ..errors import BackendError
from .base import losses_until_divergence
from .cupy_probe import probe
from .numpy_backend import NumpyBackend

# CUDA status codes of an allocation that failed (is_out_of_memory).
CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaError_t
CUDA_DRIVER_ERROR_OUT_OF_MEMORY = 2  # CUresult CUDA_ERROR_OUT_OF_MEMORY (e.g. loading a kernel)
CUBLAS_STATUS_ALLOC_FAILED = 3

# --------------------------------------------------------------------------
# the fused Adam step: one text, compiled for the GPU and run on NumPy
# --------------------------------------------------------------------------

# microgpt's Adam for one element (engine.model.gpt.adam_update), as statements
# that are both C and Python. float32 throughout; the kernel is compiled
# without FMA contraction so it rounds like NumPy does.
ADAM_STATEMENTS = (
    "m = b1 * m + omb1 * g",
    "v = b2 * v + omb2 * (g * g)",
    "p = p - m / (sqrtf(v) * v_scale + eps_scaled)",
)
ADAM_SCALARS = ("b1", "omb1", "b2", "omb2", "v_scale", "eps_scaled")
KERNEL_NAME = "fused_adam_step"
KERNEL_OPTIONS = ("--fmad=false",)
BLOCK = 256


def adam_scalars(train, step: int) -> tuple[np.float32, ...]:
    """The per-step constants of adam_update, as float32, in ADAM_SCALARS order."""
    b1, b2 = train.beta1, train.beta2
    v_scale, eps_scaled = adam_scales(train.lr_at(step), b1, b2, train.eps, step)
    return tuple(np.float32(x) for x in (b1, 1.0 - b1, b2, 1.0 - b2, v_scale, eps_scaled))


def kernel_source() -> str:
    """CUDA source of the fused step: record loss i, update the sticky flag, masked Adam."""
    body = "\n".join(f"        {statement};" for statement in ADAM_STATEMENTS)
    scalars = ", ".join(f"const float {name}" for name in ADAM_SCALARS)
    return f"""
extern "C" __global__ void {KERNEL_NAME}(
    float* __restrict__ p_, float* __restrict__ m_, float* __restrict__ v_,
    const float* __restrict__ g_, const float* __restrict__ loss,
    float* __restrict__ losses, int* __restrict__ ok, const int i,
    {scalars}, const long long n)
{{
    // ok[i] != 0 while losses 0..i-1 of this chunk were finite; thread 0
    // writes ok[i + 1], which no thread of this launch reads.
    const float L = loss[0];
    const bool go = ok[i] != 0 && isfinite(L);
    const long long start = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (start == 0) {{
        losses[i] = L;
        ok[i + 1] = go ? 1 : 0;
    }}
    if (!go) return;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long j = start; j < n; j += stride) {{
        float p = p_[j], m = m_[j], v = v_[j];
        const float g = g_[j];
{body}
        p_[j] = p;
        m_[j] = m;
        v_[j] = v;
    }}
}}
"""


_HOST_CODE = [compile(s, f"<ADAM_STATEMENTS[{i}]>", "exec") for i, s in enumerate(ADAM_STATEMENTS)]


def fused_step_host(p, m, v, g, loss, losses, ok, i: int, scalars) -> None:
    """What fused_adam_step does, on NumPy arrays (the tests' reference for the kernel)."""
    value = np.float32(loss)
    go = bool(ok[i]) and bool(np.isfinite(value))
    losses[i] = value
    ok[i + 1] = 1 if go else 0
    if not go:
        return
    names = dict(zip(ADAM_SCALARS, scalars), p=p, m=m, v=v, g=g)
    for code in _HOST_CODE:
        exec(code, {"sqrtf": np.sqrt}, names)
    p[...], m[...], v[...] = names["p"], names["m"], names["v"]


# --------------------------------------------------------------------------
# the backend
# --------------------------------------------------------------------------

def is_out_of_memory(exc: BaseException) -> bool:
    """CuPy's OutOfMemoryError (a MemoryError), or a CUDA/cuBLAS allocation failure."""
    if isinstance(exc, MemoryError):
        return True
    status = getattr(exc, "status", None)
    kind = type(exc).__name__
    return ((kind == "CUDARuntimeError" and status == CUDA_ERROR_MEMORY_ALLOCATION)
            or (kind == "CUDADriverError" and status == CUDA_DRIVER_ERROR_OUT_OF_MEMORY)
            or (kind == "CUBLASError" and status == CUBLAS_STATUS_ALLOC_FAILED))


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


_kernels: dict[int, object] = {}


def _compiled_kernel(cupy):
    """The fused step kernel, compiled once per device."""
    device = cupy.cuda.Device().id
    if device not in _kernels:
        kernel = cupy.RawKernel(kernel_source(), KERNEL_NAME, options=KERNEL_OPTIONS)
        kernel.compile()
        _kernels[device] = kernel
    return _kernels[device]


class CupyBackend(NumpyBackend):
    """NumpyBackend's math with xp = cupy, the training state resident on the GPU."""

    name = "cupy"
    xp = None  # cupy, bound when the backend opens
    # the state lives on the GPU; the host holds the initial parameters, and
    # get_state's copies of the parameters and moments while saving
    host_buffers = 4
    host_activations = False  # activations and sampling's caches are on the GPU

    # device hooks (a subclass running this logic on NumPy overrides these two) --
    def _bind(self) -> None:
        available, reason = probe()
        if not available:
            raise BackendError(f"backend cupy is not available: {reason}")
        import cupy

        self.xp = cupy
        try:
            self._kernel = _compiled_kernel(cupy)
        except Exception as exc:
            raise BackendError(f"CuPy could not compile the fused Adam kernel: {exc}") from exc

    def _fused_step(self, loss, losses, ok, i: int, scalars) -> None:
        xp, n = self.xp, self.num_params
        if not isinstance(loss, xp.ndarray) or loss.dtype != xp.float32:  # the kernel reads a float*
            loss = xp.asarray(loss, dtype=xp.float32)
        grid = max(1, min((n + BLOCK - 1) // BLOCK, 1 << 16))
        self._kernel((grid,), (BLOCK,), (self.p, self.m, self.v, self.g, loss, losses, ok,
                                         np.int32(i), *scalars, np.int64(n)))

    # setup -------------------------------------------------------------------
    def _setup(self, params: np.ndarray) -> None:
        self._bind()
        try:
            super()._setup(params)
            self._d_tokens = self.xp.asarray(self.corpus.arrays.tokens)  # uploaded once per run
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            self._release()
            raise BackendError(self._oom_message("opening the cupy backend")) from None

    def _tokens(self, step: int):
        """DataSplit.step_tokens, as views of the tokens already on the device."""
        off, n = self.split.window(step)
        return self._d_tokens[off : off + n], self._d_tokens[off + 1 : off + 1 + n]

    def _batch(self, step: int):
        """DataSplit.batch, gathered from the tokens already on the device."""
        return self.split.batch(step, self._d_tokens, self.xp)

    def _to_host(self, arr) -> np.ndarray:
        if isinstance(arr, (np.ndarray, np.generic, float)):
            return np.array(arr, dtype=np.float32, copy=True)
        return self.xp.asnumpy(arr).astype(np.float32, copy=False)

    # training ----------------------------------------------------------------
    def _check_open(self) -> None:
        if self.p is None:
            raise BackendError("this cupy backend was closed; open a new one")

    def _get_state(self):
        self._check_open()
        return super()._get_state()

    def _set_state(self, state) -> None:
        self._check_open()
        super()._set_state(state)

    def _train_steps(self, k: int) -> np.ndarray:
        self._check_open()
        xp, tc = self.xp, self.train_config
        done = 0
        try:
            losses = xp.empty(k, dtype=xp.float32)
            ok = xp.ones(k + 1, dtype=xp.int32)  # ok[i]: losses 0..i-1 all finite
            for i in range(k):
                step = self._step + i
                loss = self._step_loss(step)
                self._fused_step(loss, losses, ok, i, adam_scalars(tc, step))
                done = i + 1
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            return self._stop_out_of_memory(losses if done else None, done)
        return losses_until_divergence(self._to_host(losses))  # the chunk's one transfer

    def _stop_out_of_memory(self, losses, done: int) -> np.ndarray:
        """Keep the steps that completed, then raise BackendError (or report a divergence first)."""
        host = self._to_host(losses[:done]) if done else np.empty(0, dtype=np.float32)
        bad = ~np.isfinite(host)
        if bad.any():  # the loss diverged before memory ran out: that is the error to report
            return losses_until_divergence(host)
        self._record_losses(host)
        self._free_pool()
        raise BackendError(self._oom_message(
            f"training step {self._step + 1}",
            f" Training stopped after step {self._step}; the parameters from then are kept."))

    def _sample_ids(self, num_samples: int, temperature: float, seed: int, prefix: list[int],
                    cancel=None, *, max_length: int) -> list[list[int]]:
        # NumPy's sampler with xp = cupy: the model runs on the GPU, the draw
        # (engine.model.sampling's definition) on the host copies of the logits
        return self._without_running_out(f"sampling {num_samples} names", " Ask for fewer samples at once.",
                                         super()._sample_ids, num_samples, temperature, seed, prefix, cancel,
                                         max_length=max_length)

    def _doc_losses(self, batch) -> np.ndarray:
        return self._without_running_out("evaluating the held-out loss", "", super()._doc_losses, batch)

    def _without_running_out(self, doing: str, advice: str, call, *args, **kwargs):
        """call(*args, **kwargs) on the open backend; GPU out-of-memory becomes a BackendError
        (the training state is untouched: sampling and evaluation only read it)."""
        self._check_open()
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            self._free_pool()
            raise BackendError(self._oom_message(doing, advice)) from None

    # memory ------------------------------------------------------------------
    def _oom_message(self, doing: str, after: str = "") -> str:
        n = self.num_params
        m = self.model
        text = (f"the GPU ran out of memory while {doing}: the model (n_embd {m.n_embd}, "
                f"{m.n_layer} layers, block size {m.block_size}) has {n:,} parameters, "
                f"{_gib(16 * n)} for parameters, gradients and Adam moments, plus activations.")
        free = self._memory_info()
        if free is not None:
            text += f" GPU memory free: {_gib(free[0])} of {_gib(free[1])}."
        return (text + after + " Choose a smaller preset or block size, close other programs "
                "that use the GPU, or train on the numpy backend.")

    def _memory_info(self) -> tuple[int, int] | None:
        try:
            free, total = self.xp.cuda.runtime.memGetInfo()
            return int(free), int(total)
        except Exception:
            return None

    def _free_pool(self) -> None:
        try:
            self.xp.get_default_memory_pool().free_all_blocks()
        except Exception:
            pass

    def _release(self) -> None:
        for name in ("p", "g", "m", "v", "scratch", "w", "gw", "_d_tokens"):
            setattr(self, name, None)
        self._free_pool()

    def close(self) -> None:
        """Free this backend's GPU memory; it cannot train or sample afterwards."""
        if getattr(self, "p", None) is not None:
            self._release()
