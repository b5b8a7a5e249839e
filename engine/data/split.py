"""Which documents train and which are held out, and the padded batch each
step trains on: with engine.data.corpus's token arrays, the one place that shapes
what the backends train and evaluate on.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .corpus import Corpus


DEFAULT_HOLDOUT_MAX = 1000  # makemore holds out 1,000 names of names.txt
DEFAULT_HOLDOUT_SHARE = 0.1  # ...and at most a tenth of a smaller dataset


def default_holdout(num_docs: int) -> int:
    """How many documents a run holds out when TrainConfig.holdout is None."""
    return min(DEFAULT_HOLDOUT_MAX, int(num_docs * DEFAULT_HOLDOUT_SHARE))


def resolve_holdout(holdout: int | None, num_docs: int) -> int:
    """The held-out count a run uses (None: the default); ValueError when it leaves
    no document to train on."""
    h = default_holdout(num_docs) if holdout is None else holdout
    if h >= num_docs:
        raise ValueError(f"holdout {h:,} leaves no documents to train on: the dataset has "
                         f"{num_docs:,}; hold out fewer (0: none)")
    return h


@dataclass(frozen=True)
class Batch:
    """B documents padded to the longest: tokens (B, T+1), the inputs
    tokens[:, :-1] and targets tokens[:, 1:]; document b's first lengths[b]
    positions are real (the rest are bos and masked out). Arrays are NumPy's
    or, for a GPU backend, its array module's (lengths stay on the host)."""

    tokens: object
    lengths: np.ndarray

    @property
    def inputs(self):
        return self.tokens[:, :-1]

    @property
    def targets(self):
        return self.tokens[:, 1:]

    @property
    def positions(self) -> int:
        """Real (unpadded) predicted positions in the batch: a step's loss divides by this."""
        return int(self.lengths.sum())


class DataSplit:
    """Which documents train and which are held out, and what each step trains on.

    The held-out documents are the last `holdout` of the training order; training
    cycles over the first n_train = len(corpus) - holdout. Step s, batch element
    b trains on document (s * B + b) mod n_train, its first min(block_size,
    len(doc) + 1) predicted positions. So B = 1, holdout = 0 is microgpt's run, and a
    run shorter than n_train sees microgpt's documents in microgpt's order.
    """

    def __init__(self, corpus: Corpus, holdout: int | None, block_size: int, batch_size: int = 1):
        self.corpus, self.block_size, self.batch_size = corpus, block_size, batch_size
        self.holdout = resolve_holdout(holdout, len(corpus))
        self.n_train = len(corpus) - self.holdout
        a = corpus.arrays
        self.offsets = a.offsets
        # predicted positions of each document: microgpt's n = min(block_size, len(tokens) - 1),
        # computed in the lengths' int32 (a block beyond them truncates nothing: no
        # OverflowError from a block_size past int32, which ModelConfig refuses anyway)
        self.positions = np.minimum(a.lengths - 1, min(block_size, a.max_length - 1)).astype(np.int32)
        # the most positions of any document: the longest a padded batch can be
        self.longest = int(self.positions.max())

    # training -----------------------------------------------------------------
    def step_documents(self, step: int) -> np.ndarray:
        """The document indices step `step` trains on, (B,) int64."""
        b = self.batch_size
        return (step * b + np.arange(b, dtype=np.int64)) % self.n_train

    def window(self, step: int) -> tuple[int, int]:
        """At B = 1: (offset, n) of the step's document in the flat token array; its
        inputs are tokens[offset : offset + n], its targets one token later."""
        d = step % self.n_train
        return int(self.offsets[d]), int(self.positions[d])

    def step_tokens(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """At B = 1: the step's inputs and targets, (T,) each (microgpt's step)."""
        off, n = self.window(step)
        tokens = self.corpus.arrays.tokens
        return tokens[off : off + n], tokens[off + 1 : off + 1 + n]

    def batch(self, step: int, tokens=None, xp=np) -> Batch:
        """Step `step`'s B documents, padded; tokens: the flat token array on xp's device."""
        return self.documents_batch(self.step_documents(step), tokens, xp)

    # held-out -----------------------------------------------------------------
    def heldout_documents(self) -> np.ndarray:
        return np.arange(self.n_train, len(self.corpus), dtype=np.int64)

    def heldout_batches(self, max_docs: int, tokens=None, xp=np):
        """The held-out documents as padded batches of at most max_docs each."""
        docs = self.heldout_documents()
        for lo in range(0, len(docs), max_docs):
            yield self.documents_batch(docs[lo : lo + max_docs], tokens, xp)

    # shared -------------------------------------------------------------------
    def documents_batch(self, docs: np.ndarray, tokens=None, xp=np) -> Batch:
        """Documents `docs` padded with bos to the longest of them: Batch((B, T+1), (B,))."""
        tokens = self.corpus.arrays.tokens if tokens is None else tokens
        lengths = self.positions[docs]
        t = int(lengths.max())
        index = self.offsets[docs][:, None] + np.arange(t + 1)[None, :]
        real = np.arange(t + 1)[None, :] <= lengths[:, None]  # the inputs and the last target
        index = np.where(real, index, 0)  # padding reads token 0: document 0's opening bos
        padded = tokens[xp.asarray(index)]
        return Batch(padded, lengths)

    def names_seen(self, steps: int) -> int:
        """Training documents the first `steps` steps trained on (repeats counted)."""
        return steps * self.batch_size

    def epochs(self, steps: int) -> float:
        """Passes over the training documents in `steps` steps."""
        return self.names_seen(steps) / self.n_train
