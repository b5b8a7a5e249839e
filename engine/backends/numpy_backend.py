"""The reference backend: engine.model.gpt's math on NumPy (float32, CPU).

Parameters, gradients and both Adam moments each live in one flat buffer,
so a step allocates nothing proportional to the model beyond activations.
CuPy's backend subclasses this with another array module. The held-out loss
is computed by the same code in a child process (engine.backends.heldout_process),
where a busy thread of this process cannot slow it down.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import heldout_process
from .blas import one_blas_thread
from .heap import keep_freed_memory
from ..model.gpt import ADAM_BLOCK, Weights, adam_update, doc_losses, loss_and_grad
from ..model.sampling import sample_ids
from .base import Backend, TrainState

# Adam is memory-bound and NumPy's element-wise operations use one core; on
# large models, contiguous parts of the buffers are updated in parallel threads
# (NumPy releases the GIL inside each operation). One thread more than cores,
# since OpenBLAS's workers keep spinning after the backward pass and hold a core.
# Below ADAM_MIN_PER_THREAD parameters per thread the hand-off costs more than it
# saves. Figures: docs/performance.md, "What makes the NumPy step fast".
ADAM_MIN_PER_THREAD = 1 << 20
ADAM_MAX_THREADS = 4
# A batch's products run on one OpenBLAS thread below this many parameters, where
# OpenBLAS's threads mostly wait on each other (engine/backends/blas.py; figures:
# docs/performance.md, "A batch's products run on one OpenBLAS thread").
BATCH_BLAS_THREADS_FROM = 1 << 20


# The most cores this process may use, when set: a sweep trial holds some CPUs of a
# shared machine and runs one thread per CPU it holds (engine.sweep.trial).
CPUS_ENV = "MICROGPT_CPUS"


def usable_cores() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        cores = os.cpu_count() or 1
    limit = os.environ.get(CPUS_ENV, "").strip()
    return min(cores, int(limit)) if limit.isdigit() and int(limit) >= 1 else cores


class NumpyBackend(Backend):
    name = "numpy"
    xp = np
    # p, g, m, v, and three more while saving (get_state's copies of p, m, v) or
    # opening (the initial parameters, or a checkpoint's params, m and v)
    host_buffers = 7

    def _setup(self, params: np.ndarray) -> None:
        xp, n = self.xp, self.num_params
        # the held-out evaluation's child-process session: None until the first
        # evaluation, False once evaluations run in this process
        self._heldout_session = None
        self.p = xp.asarray(params).copy()
        self.g = xp.zeros(n, dtype=xp.float32)
        self.m = xp.zeros(n, dtype=xp.float32)
        self.v = xp.zeros(n, dtype=xp.float32)
        self.w = Weights(self.p, self.specs, self.model)
        self.gw = Weights(self.g, self.specs, self.model)
        threads = self._adam_threads()
        bounds = [n * i // threads for i in range(threads + 1)]
        self.adam_parts = [slice(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]
        self.scratch = [xp.empty(min(ADAM_BLOCK, part.stop - part.start), dtype=xp.float32)
                        for part in self.adam_parts]
        self._pool = ThreadPoolExecutor(threads, "adam") if threads > 1 else None
        if self.xp is np and self.split.batch_size > 1:
            # a batch's activations are freed and allocated again every step (engine.backends.heap)
            keep_freed_memory(self.step_activation_bytes())

    def _adam_threads(self) -> int:
        if self.xp is not np:  # a GPU array module runs one update on the device
            return 1
        return max(1, min(usable_cores() + 1, ADAM_MAX_THREADS, self.num_params // ADAM_MIN_PER_THREAD))

    def _adam(self, step: int) -> None:
        tc = self.train_config
        hyper = (tc.lr_at(step), tc.beta1, tc.beta2, tc.eps, step, self.xp)
        if self._pool is None:
            adam_update(self.p, self.g, self.m, self.v, self.scratch[0], *hyper)
            return
        jobs = [self._pool.submit(adam_update, self.p[part], self.g[part], self.m[part],
                                  self.v[part], scratch, *hyper)
                for part, scratch in zip(self.adam_parts, self.scratch)]
        for job in jobs:
            job.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._heldout_session:
            self._heldout_session.close()
        self._heldout_session = None

    # the held-out loss, computed in a child process (engine.backends.heldout_process) ----------
    heldout_in_child = True  # False: evaluate in this process (scripts/loop_latency.py compares)

    def _evaluates_in_child(self) -> bool:
        """NumPy's own evaluation (not a subclass's or a replacement's, not on a GPU),
        where the child can run: it computes what this module's _doc_losses does."""
        return (self.heldout_in_child and self.xp is np and type(self)._doc_losses is _DOC_LOSSES
                and getattr(self, "_heldout_session", None) is not False and self.holdout > 0)

    def memory_needs(self) -> list[tuple[str, int]]:
        needs = super().memory_needs()
        if self._evaluates_in_child():
            needs.append(("a copy of the parameters for the held-out evaluation's process", 4 * self.num_params))
        return needs

    def prepare_heldout(self) -> None:
        """Start the child now: it imports NumPy while this run trains."""
        if self._evaluates_in_child():
            try:
                heldout_process.shared()
            except heldout_process.Unavailable:
                self._heldout_session = False

    def _heldout_doc_losses(self, cancel):
        if self._evaluates_in_child():
            try:
                if self._heldout_session is None:
                    self._heldout_session = heldout_process.Session(
                        self.model, self.corpus.vocab_size, self.num_params, self._small_products(),
                        list(self.heldout_batches()))
                sums = self._heldout_session.doc_losses(self.p, cancel)
                return zip(self._heldout_session.positions, sums)
            except (heldout_process.Unavailable, OSError):  # evaluate here, as before, from now on
                if self._heldout_session:
                    self._heldout_session.close()
                self._heldout_session = False
        return super()._heldout_doc_losses(cancel)

    def _to_host(self, arr) -> np.ndarray:
        return np.array(arr, dtype=np.float32, copy=True)

    def _tokens(self, step: int):
        """At B = 1: the step's inputs and targets (microgpt's step)."""
        return self.split.step_tokens(step)

    def _batch(self, step: int):
        """At B > 1: the step's padded documents."""
        return self.split.batch(step)

    def _step_loss(self, step: int):
        """Loss of step `step`, its gradient written into self.g. B = 1 runs one
        unpadded document, exactly microgpt's step."""
        if self.split.batch_size == 1:
            inputs, targets = self._tokens(step)
            return loss_and_grad(self.w, self.gw, inputs, targets, self.model, self.xp)
        batch = self._batch(step)
        return loss_and_grad(self.w, self.gw, batch.inputs, batch.targets, self.model, self.xp,
                             batch.lengths)

    def _doc_losses(self, batch) -> np.ndarray:
        tokens = self.xp.asarray(batch.tokens)
        # held-out batches are up to EVAL_MAX_DOCS documents: products of thousands
        # of rows, faster on one OpenBLAS thread too (docs/performance.md)
        with np.errstate(over="ignore", invalid="ignore"), one_blas_thread(self._small_products()):
            sums = doc_losses(self.w, tokens[:, :-1], tokens[:, 1:], batch.lengths, self.model, self.xp)
        return self._to_host(sums)

    def _train_steps(self, k: int) -> np.ndarray:
        # overflow shows up as a non-finite loss, which stops training with an
        # error; NumPy's own warnings about it would only add noise
        with np.errstate(over="ignore", invalid="ignore"), one_blas_thread(self._one_blas_thread()):
            return self._train_steps_unchecked(k)

    def _one_blas_thread(self) -> bool:
        """Whether a step's products run on one OpenBLAS thread (engine.backends.blas): a
        batch's products below BATCH_BLAS_THREADS_FROM parameters, on NumPy.
        One document's products are too small for OpenBLAS to split anyway."""
        return self.split.batch_size > 1 and self._small_products()

    def _small_products(self) -> bool:
        """Whether a batch's products run faster on one OpenBLAS thread (NumPy, a small model)."""
        return self.xp is np and self.num_params < BATCH_BLAS_THREADS_FROM

    def _train_steps_unchecked(self, k: int) -> np.ndarray:
        xp = self.xp
        losses = xp.empty(k, dtype=xp.float32)
        for i in range(k):
            step = self._step + i
            loss = self._step_loss(step)
            if not np.isfinite(xp.dot(self.g, self.g)):
                # a finite loss can still have a NaN/inf gradient (overflow in the
                # backward pass); Adam would write NaN into every parameter
                loss = xp.nan
            losses[i] = loss
            if not np.isfinite(loss):  # keep the parameters from before this step
                return self._to_host(losses[: i + 1])
            self._adam(step)
        return self._to_host(losses)

    def _sample_ids(self, num_samples: int, temperature: float, seed: int, prefix: list[int],
                    cancel=None, *, max_length: int) -> list[list[int]]:
        return sample_ids(self.w, self.model, self.xp, self.corpus.bos, num_samples, temperature,
                          seed, prefix, max_length, cancel, self._to_host)

    def _get_state(self) -> TrainState:
        return TrainState(self._to_host(self.p), self._to_host(self.m), self._to_host(self.v), self._step)

    def _set_state(self, state: TrainState) -> None:
        self.p[...] = self.xp.asarray(state.params)
        self.m[...] = self.xp.asarray(state.m)
        self.v[...] = self.xp.asarray(state.v)


_DOC_LOSSES = NumpyBackend._doc_losses  # what the held-out process computes
