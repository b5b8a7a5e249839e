"""The Futhark backends: kernels/microgpt.fut compiled to sequential C,
multicore C, CUDA or OpenCL, driven through futhark-ffi.

The training state (parameters, Adam moments, step and the corpus, uploaded
once) lives in the Futhark context as one opaque value between calls; every
entry point returns a new state, so a failed call leaves the previous one
intact. This module only marshals: the data's shape comes from engine.data,
the parameter layout from engine.params.
"""
from __future__ import annotations

import numpy as np

from ..futhark import build as futhark_build
from ..config import ModelConfig, TrainConfig
from ..data import Corpus
from ..params import LAYER_PARAMS, ParamSpec
from ..errors import BackendError
from .base import Backend, TrainState, losses_until_divergence, sample_rows_to_ids


def kernel_matrices(model: ModelConfig, vocab_size: int) -> list[tuple[str, tuple[int, int]]]:
    """The matrices the kernel reads, in layout order, with the shapes it gives them
    (`embeddings` and `layer_at` in kernels/microgpt.fut)."""
    c, f = model.n_embd, 4 * model.n_embd
    layer = {"attn_wq": (c, c), "attn_wk": (c, c), "attn_wv": (c, c), "attn_wo": (c, c),
             "mlp_fc1": (f, c), "mlp_fc2": (c, f)}
    matrices = [("wte", (vocab_size, c)), ("wpe", (model.block_size, c)), ("lm_head", (vocab_size, c))]
    for i in range(model.n_layer):
        matrices += [(f"layer{i}.{name}", layer[name]) for name in LAYER_PARAMS]
    return matrices


def layout_offsets(specs: list[ParamSpec], model: ModelConfig, vocab_size: int) -> np.ndarray:
    """Offsets of each matrix in the flat buffer, in the order the kernel reads them;
    refuses a parameter layout that differs from the kernel's reading of it."""
    expected = kernel_matrices(model, vocab_size)
    actual = [(s.name, s.shape) for s in specs]
    if actual != expected:
        raise BackendError(f"the parameter layout does not match the Futhark kernel's: "
                           f"{actual[:4]}... vs {expected[:4]}...")
    return np.array([s.offset for s in specs], dtype=np.int64)


def state_arguments(model: ModelConfig, train: TrainConfig, corpus: Corpus, specs: list[ParamSpec],
                    params: np.ndarray) -> tuple:
    """The arguments of the kernel's `new_state` entry point, in order."""
    arrays = corpus.arrays
    return (
        model.n_embd, model.n_layer, model.n_head, model.block_size, corpus.vocab_size,
        float(train.learning_rate), float(train.beta1), float(train.beta2), float(train.eps),
        train.num_steps,
        layout_offsets(specs, model, corpus.vocab_size),
        np.ascontiguousarray(params, dtype=np.float32),
        np.ascontiguousarray(arrays.tokens, dtype=np.int32),
        np.ascontiguousarray(arrays.offsets, dtype=np.int64),
        np.ascontiguousarray(arrays.lengths, dtype=np.int32),
    )


class FutharkBackend(Backend):
    name = "futhark"
    target = "c"  # Futhark's compiler backend

    def _setup(self, params: np.ndarray) -> None:
        self._fut = open_context(self.target)
        self._state = self._call("new_state", *state_arguments(
            self.model, self.train_config, self.corpus, self.specs, params))

    # futhark-ffi reports a failed entry point or sync as ValueError with the
    # context's message; nothing was replaced yet when that happens.
    def _call(self, entry: str, *args):
        try:
            return getattr(self._fut, entry)(*args)
        except ValueError as exc:
            raise BackendError(f"Futhark ({self.target}) {entry} failed: {str(exc).strip()}") from None

    def _values(self, *values):
        try:
            return self._fut.from_futhark(*values)
        except ValueError as exc:
            raise BackendError(f"Futhark ({self.target}) failed: {str(exc).strip()}") from None

    def _train_steps(self, k: int) -> np.ndarray:
        state, losses = self._call("train", self._state, k)
        losses = self._values(losses)  # syncs: errors of the steps surface here
        self._state = state
        return losses_until_divergence(losses)

    def _sample_ids(self, num_samples: int, temperature: float, seed: int, prefix: list[int],
                    cancel=None) -> list[list[int]]:
        if prefix:  # TODO(kernel): the kernel's sample entry takes no prefix yet
            raise BackendError(f"{self.name} cannot sample from a prefix yet")
        rows = self._values(self._call("sample", self._state, num_samples, temperature, seed % 2**63))
        return sample_rows_to_ids(rows, self.corpus.bos)

    def _get_state(self) -> TrainState:
        params, m, v = (self._values(self._call(getter, self._state))
                        for getter in ("get_params", "get_m", "get_v"))
        return TrainState(params, m, v, int(self._call("get_step", self._state)))

    def _set_state(self, state: TrainState) -> None:
        self._state = self._call("set_training", self._state, state.params, state.m, state.v,
                                 int(state.step))

    def close(self) -> None:
        # Values hold a reference to their context, so dropping both frees them in order.
        self._state = None
        self._fut = None


def open_context(target: str):
    """A new futhark-ffi context over the compiled library (built on first use)."""
    from futhark_ffi import Futhark

    libdir = futhark_build.build(target)
    module = futhark_build.import_library(libdir, target)
    options = {}
    cache_file = str(libdir / "kernels.cache")
    if target in ("cuda", "opencl") and cache_file.isascii():
        options["cache_file_path"] = cache_file  # skips the GPU kernels' compile on later runs
    try:
        return Futhark(module, **options)
    except ValueError as exc:
        raise BackendError(f"could not start Futhark's {target} backend: {str(exc).strip()}") from None


class FutharkCBackend(FutharkBackend):
    name, target = "futhark-c", "c"
    host_buffers = 6  # parameters, gradient, moments and the loop's copies live in host memory


class FutharkMulticoreBackend(FutharkBackend):
    name, target = "futhark-multicore", "multicore"
    host_buffers = 6


class FutharkCudaBackend(FutharkBackend):
    name, target = "futhark-cuda", "cuda"


class FutharkOpenCLBackend(FutharkBackend):
    name, target = "futhark-opencl", "opencl"


def _registration(cls: type[FutharkBackend]):
    def probe() -> tuple[bool, str]:
        return futhark_build.probe(cls.target)

    def opener(model, train, corpus, params):
        return cls(model, train, corpus, params)

    return probe, opener


FUTHARK_BACKENDS = {cls.name: _registration(cls) for cls in
                    (FutharkCBackend, FutharkMulticoreBackend, FutharkCudaBackend, FutharkOpenCLBackend)}
