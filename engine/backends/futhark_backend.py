"""The Futhark backends: kernels/c.fut compiled to sequential C,
kernels/multicore.fut to multicore C, kernels/gpu.fut to CUDA or OpenCL,
driven through futhark-ffi; batches (B > 1) run each target's _batch
program (c_batch.fut, ...). Each program exports exactly entry_points(B, target).
The batches' programs have no held-out losses or sampling: at B > 1 those
run in a second context over the target's program for one document a step,
on a copy of the training parameters (copied once after each change of
them), so that each target compiles them once (kernels/README.md).

Two opaque values live in the Futhark context between calls: the model
(dimensions, Adam's settings and the corpus, uploaded once) and the
weights (parameters, Adam moments and step). `train` consumes the weights
and updates their buffers in place: copying them, so that a failed call
would leave them intact, cost about 70 ms a call at gpt2-small (README
"Performance"). A failed train call therefore loses the weights; the
backend says so, refuses what needs them, and set_state (a checkpoint, or
a reset) gives it new ones. This module only marshals: the data's shape
comes from engine.data.corpus, the parameter layout from engine.params.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np

from ..futhark import build as futhark_build
from ..config import ModelConfig, TrainConfig
from ..data.corpus import Corpus
from ..params import LAYER_PARAMS, ParamSpec
from ..errors import BackendError, Cancelled
from .base import Backend, TrainState, losses_until_divergence, sample_rows_to_ids
from .heap import keep_freed_memory
from .numpy_backend import usable_cores

# Sampling runs this many samples per kernel call at most, fewer where their
# key/value caches (at the kernel's first capacity, 32 positions) would pass
# SAMPLE_CACHE_BYTES: samples share each read of the weights, so larger
# batches are faster, and the caches grow only for names past 32 tokens.
MAX_SAMPLE_BATCH = 256
SAMPLE_CACHE_BYTES = 256 << 20
CACHE_POSITIONS = 32


def sample_batch(model: ModelConfig, num_samples: int) -> int:
    """How many samples one call of the kernel's `sample` generates."""
    per_sample = 2 * model.n_layer * min(model.block_size, CACHE_POSITIONS) * model.n_embd * 4
    return max(1, min(num_samples, MAX_SAMPLE_BATCH, SAMPLE_CACHE_BYTES // per_sample))


# The entry points this module calls: every program of kernels/ exports the
# shared ones and its batch size's training step, the programs for one
# document a step the evaluation's too (entry_points; a test holds the
# generated manifests to it), and _call refuses any other name.
SHARED_ENTRY_POINTS = ("new_model", "new_weights", "initial_weights", "get_params", "get_m", "get_v", "get_step")
EVALUATION_ENTRY_POINTS = ("doc_losses", "sample")  # held-out losses and sampling
# all programs' together; train_batch_parts: multicore_batch.fut's alone
ENTRY_POINTS = SHARED_ENTRY_POINTS + EVALUATION_ENTRY_POINTS + ("train", "train_batch", "train_batch_parts")


def kernel_matrices(model: ModelConfig, vocab_size: int) -> list[tuple[str, tuple[int, int]]]:
    """The matrices the kernel reads, in layout order, with the shapes it gives them
    (`embeddings` and `layer_at` in kernels/lib/model.fut)."""
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


def train_entry(batch_size: int, in_parts: bool = False) -> str:
    """The kernel's training entry point for this batch size: B = 1 has its own
    (microgpt's step, unpadded), which a branch on B inside one entry slowed,
    in a program of its own (futhark_build.step_build). (futhark-multicore's
    `train` runs its update pass as two parallel maps, kernels/multicore.fut;
    how each program runs its products is fixed when it is compiled.)
    in_parts: a batch in a group of documents per thread (batches_in_parts),
    futhark-multicore's on several threads."""
    if batch_size == 1:
        return "train"
    return "train_batch_parts" if in_parts else "train_batch"


def entry_points(batch_size: int, target: str = "c") -> tuple[str, ...]:
    """Exactly the entry points of target's program that trains batch_size documents
    a step (B = 1's program also runs the evaluation at every batch size; the
    multicore program for batches also trains them in parts)."""
    evaluation = EVALUATION_ENTRY_POINTS if batch_size == 1 else ()
    parts = (train_entry(batch_size, True),) if batch_size > 1 and target == "multicore" else ()
    return SHARED_ENTRY_POINTS + evaluation + (train_entry(batch_size),) + parts


def model_arguments(model: ModelConfig, train: TrainConfig, corpus: Corpus, specs: list[ParamSpec],
                    threads: int = 1, n_train: int | None = None) -> tuple:
    """The arguments of the kernel's `new_model` entry point, in order. `threads`:
    the multicore runtime's thread count, the tasks kernels/multicore.fut splits
    a large backward product into (the other programs do not read it).
    n_train: the documents training cycles over, the first n_train of the
    training order (engine.data.split.DataSplit; None: all); the kernel's step
    reads documents (step * B + b) % (the documents it is given) for b < B,
    B = train.batch_size, as DataSplit.step_documents does."""
    arrays = corpus.arrays
    docs = slice(0, len(corpus) if n_train is None else n_train)
    return (
        model.n_embd, model.n_layer, model.n_head, model.block_size, corpus.vocab_size,
        float(train.learning_rate), float(train.beta1), float(train.beta2), float(train.eps),
        train.num_steps, train.warmup_steps, threads, train.batch_size,
        layout_offsets(specs, model, corpus.vocab_size),
        np.ascontiguousarray(arrays.tokens, dtype=np.int32),
        np.ascontiguousarray(arrays.offsets[docs], dtype=np.int64),
        np.ascontiguousarray(arrays.lengths[docs], dtype=np.int32),
    )


class FutharkBackend(Backend):
    name = "futhark"
    target = "c"  # Futhark's compiler backend

    def _setup(self, params: np.ndarray) -> None:
        arguments = model_arguments(self.model, self.train_config, self.corpus, self.specs,
                                    self.threads() or 1, self.split.n_train)
        self._fut = open_context(self.library_target(), self.threads())
        self._model = self._call("new_model", *arguments)
        self._lost = ""  # why the weights are gone (a failed train call consumed them)
        self._weights = self._call("initial_weights", self._model, np.ascontiguousarray(params, np.float32))
        if self.train_config.batch_size > 1:
            # a batched step's buffers under 1 MiB come from malloc every step
            # (Futhark keeps larger ones itself): kept in the heap, as for NumPy
            keep_freed_memory(self.step_activation_bytes())
        # B > 1: the program for one document a step, for held-out losses and
        # sampling, and its copy of the weights (None: not made since they changed)
        self._eval_fut = self._eval_model = self._eval_weights = None
        if self.train_config.batch_size > 1:
            self._eval_fut = open_context(self.evaluation_target(), self.threads())
            self._eval_model = self._call("new_model", *arguments, fut=self._eval_fut)

    def threads(self) -> int | None:
        """The multicore runtime's thread count; None: Futhark's default."""
        return None

    def runtime_target(self) -> str:
        """The Futhark target whose programs run this backend (futhark-multicore's on
        one thread: c)."""
        return self.target

    def trains_in_parts(self) -> bool:
        """Whether a step's documents are split into a group per thread, each group's
        gradient computed by one thread (train_entry's in_parts)."""
        return False

    def library_target(self) -> str:
        """Which compiled library (a build of futhark_build.BUILDS) runs this backend's
        steps: its target's program for one document a step, or for batches."""
        return futhark_build.step_build(self.runtime_target(), self.train_config.batch_size)

    def evaluation_target(self) -> str:
        """Which library runs held-out losses and sampling: the program for one
        document a step, at every batch size."""
        return futhark_build.step_build(self.runtime_target(), 1)

    def library_targets(self) -> tuple[str, ...]:
        """Every library this backend opens: the training one first."""
        return tuple(dict.fromkeys((self.library_target(), self.evaluation_target())))

    # futhark-ffi reports a failed entry point or sync as ValueError with the
    # context's message; nothing was replaced yet when that happens.
    def _call(self, entry: str, *args, fut=None):
        """entry of the training program, or given `fut` (_evaluated's context), of the
        program for one document a step open there."""
        entries = (entry_points(self.train_config.batch_size, self.runtime_target()) if fut is None
                   else entry_points(1))
        if entry not in entries:
            raise ValueError(f"{entry!r} is not one of the Futhark program's entry points {entries}")
        try:
            return getattr(self._fut if fut is None else fut, entry)(*args)
        except ValueError as exc:
            raise BackendError(f"Futhark ({self.target}) {entry} failed: {str(exc).strip()}") from None

    def _values(self, *values, fut=None):
        try:
            return (self._fut if fut is None else fut).from_futhark(*values)
        except ValueError as exc:
            raise BackendError(f"Futhark ({self.target}) failed: {str(exc).strip()}") from None

    def _current_weights(self):
        if self._weights is None:
            raise BackendError(f"Futhark ({self.target}) has no weights: {self._lost}")
        return self._weights

    def memory_needs(self) -> list[tuple[str, int]]:
        needs = super().memory_needs()
        if self.train_config.batch_size > 1:  # the evaluation's weights: host memory on a CPU target
            copies = 4 if futhark_build.futhark_target(self.evaluation_target()) in ("c", "multicore") else 1
            needs.append((f"{copies} more cop{'ies' if copies > 1 else 'y'} for held-out losses and sampling "
                          "(batches: in the program for one document a step)", copies * self.num_params * 4))
        return needs

    def _evaluated(self):
        """The context, model and weights that doc_losses and sample read: the
        training ones at B = 1; at B > 1 the evaluation program's, its weights the
        training parameters (Adam's moments zero: it never trains), copied on
        first use after they changed."""
        weights = self._current_weights()
        if self._eval_fut is None:
            return self._fut, self._model, weights
        if self._eval_weights is None:
            params = self._values(self._call("get_params", weights))
            self._eval_weights = self._call("initial_weights", self._eval_model, params, fut=self._eval_fut)
        return self._eval_fut, self._eval_model, self._eval_weights

    def _train_steps(self, k: int) -> np.ndarray:
        weights, self._weights = self._current_weights(), None  # consumed by the call, whatever happens
        self._eval_weights = None
        self._lost = f"a failed train call at step {self.step} used them up (load a checkpoint or reset to go on)"
        try:
            weights, losses = self._call(train_entry(self.train_config.batch_size, self.trains_in_parts()),
                                         self._model, weights, k)
            losses = self._values(losses)  # syncs: errors of the steps surface here
        except BackendError as exc:
            raise BackendError(f"{exc}; {self._lost}") from None
        self._weights, self._lost = weights, ""
        return losses_until_divergence(losses)

    def _sample_ids(self, num_samples: int, temperature: float, seed: int, prefix: list[int],
                    cancel=None, *, max_length: int) -> list[list[int]]:
        """Samples in batches (a kernel call cannot be interrupted: cancel is
        polled between them); sample j's draws depend only on (seed, j) (the
        kernel's uniform is engine.model.sampling's), so the batches give the same
        names as one call, and as NumPy."""
        start = np.asarray(prefix, dtype=np.int32)
        batch = sample_batch(self.model, num_samples)
        samples = []
        for first in range(0, num_samples, batch):
            if cancel is not None and cancel():
                raise Cancelled("sampling was cancelled")
            count = min(batch, num_samples - first)
            fut, model, weights = self._evaluated()
            rows = self._values(self._call("sample", model, weights, start, count,
                                           temperature, seed % 2**64, first, max_length, fut=fut), fut=fut)
            samples += sample_rows_to_ids(rows, self.corpus.bos)
        return samples

    def _doc_losses(self, batch) -> np.ndarray:
        fut, model, weights = self._evaluated()
        sums, _ = self._call("doc_losses", model, weights,
                             np.ascontiguousarray(batch.tokens, dtype=np.int32),
                             np.ascontiguousarray(batch.lengths, dtype=np.int64), fut=fut)
        return self._values(sums, fut=fut)

    def _get_state(self) -> TrainState:
        weights = self._current_weights()
        params, m, v = (self._values(self._call(getter, weights)) for getter in ("get_params", "get_m", "get_v"))
        return TrainState(params, m, v, int(self._call("get_step", weights)))

    def _set_state(self, state: TrainState) -> None:
        self._weights = self._call("new_weights", self._model, state.params, state.m, state.v, int(state.step))
        self._eval_weights = None
        self._lost = ""

    def close(self) -> None:
        # Values hold a reference to their context, so dropping both frees them in order.
        self._model = self._weights = self._eval_model = self._eval_weights = None
        self._lost = "the backend was closed"
        self._fut = self._eval_fut = None


class _ThreadCountLib:
    """The compiled library, with futhark_context_config_new setting the
    thread count: futhark-ffi creates the config and the context in one call
    and has no option for it."""

    def __init__(self, lib, num_threads: int):
        self._lib, self._num_threads = lib, num_threads

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def __dir__(self):  # futhark-ffi looks up the C type of what it lists: not this method's
        return [name for name in dir(self._lib) if name != "futhark_context_config_new"]

    def futhark_context_config_new(self):
        config = self._lib.futhark_context_config_new()
        self._lib.futhark_context_config_set_num_threads(config, self._num_threads)
        return config


def open_context(target: str, num_threads: int | None = None):
    """A new futhark-ffi context over the compiled library (built on first use);
    num_threads: the multicore runtime's thread count (None: one per core)."""
    from futhark_ffi import Futhark

    libdir = futhark_build.build(target)
    module = futhark_build.import_library(libdir, target)
    runtime = futhark_build.futhark_target(target)
    if num_threads is not None and runtime == "multicore":  # the only runtime with threads
        module = SimpleNamespace(lib=_ThreadCountLib(module.lib, num_threads), ffi=module.ffi)
    options = {}
    cache_file = str(libdir / "kernels.cache")
    if runtime in ("cuda", "opencl") and cache_file.isascii():
        options["cache_file_path"] = cache_file  # skips the GPU kernels' compile on later runs
    try:
        return Futhark(module, **options)
    except ValueError as exc:
        raise BackendError(f"could not start Futhark's {target} backend: {str(exc).strip()}") from None


class FutharkCBackend(FutharkBackend):
    name, target = "futhark-c", "c"
    host_buffers = 6  # the weights' parameters and moments, and get_state's copies of them


# Below this much work a step (parameters times documents per step) the
# multicore backend runs on one thread: Futhark's scheduler costs microseconds
# per parallel region, and a step has dozens to hundreds. Measured side by
# side on a 2-core Xeon with the workers' spin-then-block wait
# (engine/futhark/spin_wait.h; docs/performance.md, "The workers' wait:
# spinning before sleeping", 2026-12-05): at one document per step two threads
# were slower at s64 (155,000 parameters: 0.477 against 0.432 ms) and faster
# at s128 (810,000: 1.33 against 1.53); at batches, level at s64 and 2
# documents (310,000), faster from s64 and 4 (620,000: 1.16 against 1.22 ms),
# at learn and 32 (860,000: 1.66 against 2.27) and s32 and 32 (1.65 against
# 2.02). Before that wait, when a worker woke for each region (~20 us on a
# virtual machine), the threshold was 2 million (s128 at B = 1 and s32 at 32
# were faster on one thread then).
MULTICORE_MIN_WORK = 300_000
THREADS_ENV = "MICROGPT_FUTHARK_THREADS"  # overrides the multicore thread count
# Batches of small models train in parts on several threads (kernels/lib/microgpt.fut
# batch_in_parts: a group of documents per thread, three parallel loops a step
# instead of about a hundred). A group's step runs inside one of Futhark's tasks,
# where Futhark 0.25.34 never frees what a function of the program returns: the
# step in parts leaked (learn at 32 documents 250 KB a step) until 2026-12-05,
# night, when it came to call none (lib/batch.fut batch_gradient_sum's in_task),
# each group padded to its own longest document. Measured side by side on the
# 2-core Xeon then (docs/performance.md, "A batch in parts that leaked"), ms a
# step, in parts against the products' tasks (or one thread where that is
# faster): tiny at 32 documents 0.40 against 0.71 (one thread), learn 1.29
# against 1.57-1.62, s32 1.33 against 1.62, s64 (155,000 parameters) 4.61 against
# 5.23; at 8 documents learn 0.39 against 0.53 (one thread), s64 1.55 against
# 1.77; s128 (810,000) mixed (20.3 against 21.4 at 32 documents, 11.8 against
# 11.0 at 16), s256 slower (120 against 113). Few documents are not worth the
# threads: tiny at 4 documents 0.097 against one thread's 0.079. Since the
# attention's sums ran by the position attended to (2026-12-06; docs/performance.md,
# "Attention by the position attended to"), a group's step is faster, and s128
# is faster in parts too: 17.8-18.6 against 19.8-21.1 at 32 documents, 10.3-10.5
# against 11.0-12.5 at 16, 7.0 against 7.1 at 8; s256 (4.8 million) level at 32
# (110.6 against 111.1) and slower at 16 (74 against 64).
PARTS_MAX_PARAMS = 1_000_000
PARTS_MIN_BATCH = 8
# A batched step never runs on more threads than it has documents: Futhark
# 0.25.34's multicore runtime runs a parallel loop of fewer iterations than
# threads through the loop's "nested" version, and the batched programs' loops
# over the B documents computed wrong steps that way (both train_batch and
# train_batch_parts; measured 2026-12-05: 3 threads at B = 2, 5 at 3, 6 at 4 went
# NaN or far off NumPy's losses, 8 threads at learn and s64 with B = 4 were 3e-2
# and 9e-3 off; every count of threads up to B, 2 to 16, within 5e-7).


def batches_in_parts(num_params: int, batch: int) -> bool:
    """Whether futhark-multicore trains `batch` documents a step of a model of
    num_params in parts, when it runs on several threads."""
    return batch >= PARTS_MIN_BATCH and num_params < PARTS_MAX_PARAMS


def multicore_threads(num_params: int, cores: int, environ=None, batch: int = 1) -> int:
    """The multicore backend's thread count for a model of num_params trained on
    `batch` documents per step ($MICROGPT_FUTHARK_THREADS, a whole number from 1,
    overrides it): every core where a step trains in parts; at batches never more
    than `batch` (see above), the override included."""
    text = (os.environ if environ is None else environ).get(THREADS_ENV, "").strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise BackendError(f"{THREADS_ENV} must be a whole number from 1, got {text!r}")
        threads = int(text)
    else:
        enough = num_params * batch >= MULTICORE_MIN_WORK or batches_in_parts(num_params, batch)
        threads = cores if enough else 1
    return threads if batch == 1 else min(threads, batch)


class FutharkMulticoreBackend(FutharkBackend):
    name, target = "futhark-multicore", "multicore"
    host_buffers = 6

    def threads(self) -> int:
        return multicore_threads(self.num_params, usable_cores(), batch=self.train_config.batch_size)

    def trains_in_parts(self) -> bool:
        return self.threads() > 1 and batches_in_parts(self.num_params, self.train_config.batch_size)

    def runtime_target(self) -> str:
        # One thread runs the sequential C build: the same kernel, without the
        # multicore runtime's per-region task, scratch memory and clock reads,
        # which made a one-thread multicore step 15-45% slower than futhark-c's.
        return "multicore" if self.threads() > 1 else "c"


class FutharkCudaBackend(FutharkBackend):
    name, target = "futhark-cuda", "cuda"


class FutharkOpenCLBackend(FutharkBackend):
    name, target = "futhark-opencl", "opencl"


def _registration(cls: type[FutharkBackend]):
    def probe() -> tuple[bool, str]:
        return futhark_build.probe_backend(cls.target)

    def opener(model, train, corpus, params):
        return cls(model, train, corpus, params)

    return probe, opener


FUTHARK_BACKENDS = {cls.name: _registration(cls) for cls in
                    (FutharkCBackend, FutharkMulticoreBackend, FutharkCudaBackend, FutharkOpenCLBackend)}
