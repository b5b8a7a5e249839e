"""The one Backend interface every engine (NumPy, CuPy, Futhark) implements.

The base class owns what is the same everywhere: argument checks, the step
counter, the loss history, divergence handling, sampling's decoding and
checkpoints. A subclass supplies the arithmetic through the `_` methods.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..training.checkpoint import save_checkpoint
from ..config import ModelConfig, TrainConfig
from ..data.split import Batch, DataSplit
from ..data.corpus import Corpus
from ..errors import BackendError, Cancelled, TrainingDiverged
from ..training.heldout import HeldoutPoint
from ..memory import available_memory_bytes, format_bytes, format_count, grown, limit_note
from ..model.gpt import step_activation_bytes
from ..params import flatten, init_params, param_specs, unflatten
from ..model.sampling import (check_max_length, check_prefix_length, check_sample_args, default_max_length,
                        longest_document, memory_bytes as sampling_memory_bytes)


@dataclass
class TrainState:
    """Everything that determines the next step: host copies, flat float32."""

    params: np.ndarray
    m: np.ndarray
    v: np.ndarray
    step: int


def losses_until_divergence(losses) -> np.ndarray:
    """losses cut after the first non-finite one (what _train_steps returns
    when a step diverges), as float32."""
    losses = np.asarray(losses, dtype=np.float32)
    bad = np.flatnonzero(~np.isfinite(losses))
    return losses[: bad[0] + 1] if len(bad) else losses


def sample_rows_to_ids(rows, bos: int) -> list[list[int]]:
    """Each row of generated tokens up to (without) its first bos."""
    samples = []
    for row in np.asarray(rows):
        stop = np.flatnonzero(row == bos)
        samples.append(row[: stop[0] if len(stop) else len(row)].tolist())
    return samples


# Allocations under this size are not checked against free memory (the check reads /proc).
LARGE_ALLOCATION = 64 << 20
# The held-out loss evaluates documents in batches of at most this many, fewer
# where their activations would pass EVAL_BYTES.
EVAL_MAX_DOCS = 1024
EVAL_BYTES = 64 << 20


class HeldoutEvaluation:
    """The held-out bookkeeping every runner shares (Backend, and bench's
    engine.bench.torch_reference.TorchReference): progress over self.split (an
    engine.data.split.DataSplit) at self.step, and the held-out loss from the
    runner's _doc_losses(batch) (Backend's abstract method says what it returns).
    The runner sets self._heldout = [] at step 0."""

    split: DataSplit
    model: ModelConfig
    corpus: Corpus
    step: int
    _heldout: list[HeldoutPoint]

    @property
    def holdout(self) -> int:
        """Documents held out of training (0: none, and no held-out loss)."""
        return self.split.holdout

    @property
    def names_seen(self) -> int:
        """Training documents trained on so far (repeats counted): step x batch size."""
        return self.split.names_seen(self.step)

    @property
    def epochs(self) -> float:
        """Passes over the training documents so far."""
        return self.split.epochs(self.step)

    @property
    def heldout_history(self) -> list[HeldoutPoint]:
        return list(self._heldout)

    def heldout_loss(self, cancel: Callable[[], bool] | None = None) -> float:
        """The mean per-token loss over every held-out document at the current
        parameters (a forward pass only; training state unchanged). Recorded in
        heldout_history at the current step. cancel() is asked between batches of
        documents: True raises Cancelled (nothing recorded)."""
        if self.holdout == 0:
            raise ValueError("this run holds out no documents (holdout 0): there is no held-out loss")
        total, count = 0.0, 0
        for positions, sums in self._heldout_doc_losses(cancel):
            total += float(np.sum(np.asarray(sums, dtype=np.float64)))
            count += positions
        loss = total / count
        if self._heldout and self._heldout[-1].step == self.step:  # evaluated again: same parameters
            self._heldout.pop()
        self._heldout.append(HeldoutPoint(self.step, loss))
        return loss


    def heldout_batches(self):
        """The held-out documents in padded batches, as many at a time as
        EVAL_MAX_DOCS and EVAL_BYTES allow (a generator)."""
        per_doc = max(1, step_activation_bytes(self.model, self.corpus.vocab_size, self.split.longest))
        return self.split.heldout_batches(max(1, min(EVAL_MAX_DOCS, EVAL_BYTES // per_doc)))

    def _heldout_doc_losses(self, cancel: Callable[[], bool] | None):
        """(real positions, each document's summed loss) of each held-out batch in
        turn, by _doc_losses; cancel() is asked before each batch."""
        for batch in self.heldout_batches():
            if cancel is not None and cancel():
                raise Cancelled("the held-out evaluation was cancelled")
            yield batch.positions, self._doc_losses(batch)

    def prepare_heldout(self) -> None:
        """Get ready to evaluate the held-out loss soon (a caller that will evaluate
        says so after opening; a backend that evaluates elsewhere starts that now)."""


class Backend(HeldoutEvaluation, ABC):
    name: str = "?"
    # Parameter-sized float32 buffers this backend holds in host memory at its
    # peak (the initial parameters and a read-back copy, by default).
    host_buffers: int = 2
    # Whether a training step's activations and sampling's caches are in host
    # memory (not on a GPU): the memory check counts them then.
    host_activations: bool = True

    def __init__(self, model: ModelConfig, train: TrainConfig, corpus: Corpus,
                 params: np.ndarray | None = None):
        if not isinstance(model, ModelConfig) or not isinstance(train, TrainConfig):
            raise TypeError("open_backend needs a ModelConfig and a TrainConfig")
        self.model, self.train_config, self.corpus = model, train, corpus
        # which documents train, which are held out (ValueError if none would train)
        self.split = DataSplit(corpus, train.holdout, model.block_size, train.batch_size)
        self.num_params = model.num_params(corpus.vocab_size)
        self._check_host_memory()  # before anything the size of the model exists
        self.specs = param_specs(model, corpus.vocab_size)
        if params is None:
            params = init_params(model, corpus.vocab_size, train.seed, train.init_std)
        elif params.shape != (self.num_params,):
            raise ValueError(f"expected {self.num_params} parameters, got {params.shape}")
        self._step = 0
        self._losses = np.empty(0, dtype=np.float32)  # grows as steps happen (_record_losses)
        self._heldout: list[HeldoutPoint] = []  # every held-out evaluation, by step
        self._setup(np.ascontiguousarray(params, dtype=np.float32))

    # memory -----------------------------------------------------------------
    def memory_needs(self) -> list[tuple[str, int]]:
        """What this backend holds in host memory at its peak: (what for, bytes)."""
        needs = [(f"{self.host_buffers} copies of the parameters (weights, gradient, Adam moments, "
                  "copies while saving)", self.host_buffers * self.num_params * 4)]
        if self.host_activations:
            needs.append((f"a training step's activations ({self.batch_size:,} x {self.split.longest:,} tokens)",
                          self.step_activation_bytes()))
            needs.append(("sampling", sampling_memory_bytes(self.model, self.corpus.vocab_size)))
        return needs

    def step_activation_bytes(self) -> int:
        """About the most a training step's activations take: B documents of the
        longest window (engine.model.gpt.step_activation_bytes)."""
        return step_activation_bytes(self.model, self.corpus.vocab_size, self.split.longest, self.batch_size)

    def _check_host_memory(self) -> None:
        """Refuse a model that cannot fit, before allocating it: on Linux an
        allocation past free memory can succeed and then get the process killed."""
        needs = self.memory_needs()
        need, free = sum(size for _, size in needs), available_memory_bytes()
        if free is None or need <= free:
            return
        m, vocab = self.model, self.corpus.vocab_size
        parts = "; ".join(f"{format_bytes(size)} for {what}" for what, size in needs)
        embeddings = 2 * vocab * m.n_embd
        why = (f" The vocabulary of {vocab:,} characters (wte and lm_head) makes "
               f"{embeddings / self.num_params:.0%} of the parameters; a dataset with fewer distinct "
               "characters needs less." if embeddings > self.num_params / 2 else "")
        raise BackendError(
            f"the model has {format_count(self.num_params)} parameters (n_embd {m.n_embd:,}, "
            f"{m.n_layer:,} layers, block_size {m.block_size:,}, vocabulary {vocab:,}): the "
            f"{self.name} backend needs about {format_bytes(need)} of memory ({parts}), but "
            f"{format_bytes(free)} is available{limit_note()}.{why} Choose a smaller model (n_embd, n_layer, "
            "block_size) or close other programs.")

    def _check_fits(self, what: str, nbytes: int, advice: str) -> None:
        free = available_memory_bytes()
        if free is not None and nbytes > free:
            raise BackendError(f"{what} needs {format_bytes(nbytes)} of memory, but "
                               f"{format_bytes(free)} is available{limit_note()}; {advice}")

    def _record_losses(self, losses: np.ndarray) -> None:
        """Append the losses of steps just trained and advance the step; the history
        doubles when full, so a long run's history costs what its steps so far need."""
        end = self._step + len(losses)
        self._losses = grown(self._losses, end, self._step, least=1024, most=self.train_config.num_steps)
        self._losses[self._step : end] = losses
        self._step = end

    # what a subclass implements --------------------------------------------
    @abstractmethod
    def _setup(self, params: np.ndarray) -> None:
        """Take the initial parameters; zero Adam moments; step 0."""

    @abstractmethod
    def _train_steps(self, k: int) -> np.ndarray:
        """Run up to k steps from self._step; return their losses (float32).

        If a loss is not finite, stop there *without* applying that step's
        update and return the losses up to and including the bad one.
        """

    @abstractmethod
    def _sample_ids(self, num_samples: int, temperature: float, seed: int, prefix: list[int],
                    cancel: Callable[[], bool] | None, *, max_length: int) -> list[list[int]]:
        """Token ids each sample generates after bos + prefix, without bos tokens,
        drawn as engine.model.sampling's module doc defines (the same on every backend).

        At most max_length - len(prefix) tokens each (max_length <= block_size,
        checked). Where the backend can, it calls cancel() between positions and
        raises Cancelled when it is true.
        """

    @abstractmethod
    def _doc_losses(self, batch: Batch) -> np.ndarray:
        """Forward only, at the current parameters: each document's summed loss
        over its real positions, (B,) float. batch: held-out documents (host arrays)."""

    @abstractmethod
    def _get_state(self) -> TrainState: ...

    @abstractmethod
    def _set_state(self, state: TrainState) -> None: ...

    def close(self) -> None:
        """Release device memory or contexts (nothing to do for host backends)."""

    # the public interface --------------------------------------------------
    @property
    def step(self) -> int:
        """Steps trained so far (the next step's index, counted from 0)."""
        return self._step

    @property
    def finished(self) -> bool:
        return self._step >= self.train_config.num_steps

    @property
    def loss_history(self) -> np.ndarray:
        return self._losses[: self._step].copy()

    # batches (epochs and the held-out loss: HeldoutEvaluation) -----------------
    @property
    def batch_size(self) -> int:
        return self.split.batch_size

    def train(self, k: int) -> np.ndarray:
        """The chunked step call: run the next k steps, return each step's loss.

        Stops at num_steps (fewer losses are returned then). Raises
        TrainingDiverged if a loss is NaN or inf, keeping the parameters from
        before that step.
        """
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"the number of steps per call must be a positive integer, got {k!r}")
        k = min(int(k), self.train_config.num_steps - self._step)
        if k <= 0:
            return np.empty(0, dtype=np.float32)
        losses_bytes = 4 * (k + 2 * (self._step + k))  # this call's, and the history doubled
        if losses_bytes > LARGE_ALLOCATION:
            self._check_fits(f"training {k:,} steps in one call (the losses it returns and the loss "
                             f"history of {self._step + k:,} steps)", losses_bytes,
                             "train fewer steps per call.")
        losses = np.asarray(self._train_steps(k), dtype=np.float32)
        bad = ~np.isfinite(losses)
        good = losses[: int(np.argmax(bad))] if bad.any() else losses
        self._record_losses(good)
        if bad.any():
            raise TrainingDiverged(self._step, float(losses[len(good)]))
        return losses

    def sample(self, num_samples: int = 10, temperature: float = 0.5, seed: int = 0, prefix: str = "",
               cancel: Callable[[], bool] | None = None, max_length: int | None = None) -> list[str]:
        """Generate names that start with prefix: feed bos + prefix, then draw from
        softmax(logits / temperature) until bos or max_length characters (prefix
        included; None: default_max_length(), the longest training document plus
        a few characters, at most block_size).

        The same arguments give the same names on every backend (engine.model.sampling).
        cancel, if given, is polled during the call; when it returns True the call
        raises Cancelled (the training state is never changed by sampling)."""
        check_sample_args(num_samples, temperature, seed)
        if not isinstance(prefix, str):
            raise ValueError(f"prefix must be a string, got {prefix!r}")
        check_prefix_length(prefix, self.model.block_size)
        if max_length is None:
            max_length = self.default_max_length(len(prefix))
        check_max_length(max_length, self.model.block_size, len(prefix))
        prefix_ids = self.corpus.encode(prefix)
        ids = self._sample_ids(int(num_samples), float(temperature), int(seed), prefix_ids, cancel,
                               max_length=int(max_length))
        return [prefix + self.corpus.decode(sample) for sample in ids]

    def default_max_length(self, prefix_length: int = 0) -> int:
        """sample()'s max_length when none is given (engine.model.sampling.default_max_length)."""
        return default_max_length(longest_document(self.corpus), self.model.block_size, prefix_length)

    def get_params(self) -> dict[str, np.ndarray]:
        return unflatten(self._get_state().params, self.specs)

    def set_params(self, params: dict[str, np.ndarray]) -> None:
        """Replace the parameters; the step and Adam moments stay."""
        state = self._get_state()
        state.params = flatten(params, self.specs)
        self._set_state(state)

    def get_state(self) -> TrainState:
        return self._get_state()

    def set_state(self, state: TrainState, losses: np.ndarray | None = None,
                  heldout: list[HeldoutPoint] | None = None) -> None:
        """Restore a training state (checkpoints, switching backends mid-run), with
        the held-out evaluations of the steps up to it."""
        n = self.num_params
        for name in ("params", "m", "v"):
            arr = getattr(state, name)
            if arr.shape != (n,):
                raise ValueError(f"state.{name} has shape {arr.shape}, expected ({n},)")
        if not 0 <= state.step <= self.train_config.num_steps:
            raise ValueError(f"step {state.step} is outside 0..{self.train_config.num_steps}")
        self._set_state(TrainState(*(np.ascontiguousarray(getattr(state, a), dtype=np.float32)
                                     for a in ("params", "m", "v")), int(state.step)))
        step = int(state.step)
        self._check_fits(f"the loss history of {step:,} steps", 4 * step, "close other programs.")
        history = np.full(step, np.nan, dtype=np.float32)  # unknown losses are NaN
        if losses is not None:
            known = np.asarray(losses, dtype=np.float32)[:step]
            history[: len(known)] = known
        self._step, self._losses = step, history  # grows from here as _record_losses adds steps
        self._heldout = [HeldoutPoint(int(p.step), float(p.loss)) for p in (heldout or []) if p.step <= step]

    def save(self, path) -> None:
        save_checkpoint(path, self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} step {self._step}/{self.train_config.num_steps}>"
