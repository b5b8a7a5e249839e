"""Sampling names one position at a time over a key/value cache (NumPy and CuPy).

A name starts as bos + prefix; at each position the next token is drawn from
softmax(logits / temperature) by the inverse CDF of one uniform number, until
bos or block_size tokens. The prefix runs through the model once, for one
row, and its keys and values are copied to every row; after that each new
token is one forward step (engine.model.forward with a KVCache) for all the
rows still going, instead of recomputing every earlier position.

The same seed gives the same names however the rows are grouped: row i's
uniform number for its j-th drawn token is number j*N + i of
default_rng(seed)'s stream (N = num_samples), which is what drawing
rng.random(N) once per position for all rows gives, and a group of rows reads
its numbers by jumping the generator there (PCG64.advance). So rows run in
batches that bound memory:
- at most batch_rows(V) rows at once (their logits and drawing's temporaries);
- a batch's cache starts small and doubles as its names get longer; where it
  would pass CACHE_LIMIT, the batch splits in two and the second half runs
  afterwards, first replaying the tokens it already drew (one row alone may
  exceed it: its cache is at most one block_size name). The limit holds ten
  gpt2-small names of 512 tokens, so splits are rare (where the weights are
  large, a position costs about the same for one row as for ten);
- finished rows leave the cache (a copy of the rows still going) once an
  eighth of its rows are finished: computing them costs at most 1/7 more, and
  the copies add up to a few times the largest cache (measured at s256, 200
  untrained names: 49 GFLOP and 0.3 GB copied, against 46 and 0.9 dropping
  them sooner, or 62 and 0.1 at half);
- the prefix runs in chunks whose attention scores stay under CHUNK_BYTES.
memory_bytes() is the most all this holds at once; the memory check counts it.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .config import ModelConfig
from .errors import Cancelled
from .model import KVCache, Weights, forward, linear

MAX_SAMPLES = 10_000  # names per sample() call (see Backend.sample)
CACHE_LIMIT = 512 << 20  # keys and values of the rows running together (2x while copied)
DRAW_BYTES = 64 << 20  # logits of the rows running together, and drawing's temporaries
CHUNK_BYTES = 64 << 20  # attention scores while the prefix runs
MAX_BATCH_ROWS = 256
FIRST_CAPACITY = 32  # positions a batch's cache holds before it first grows
# the rows' float32 logits and their host copy, the float64 scaled logits and
# drawing's CDF, and the comparison with u
DRAW_BYTES_PER_LOGIT = 4 + 4 + 8 + 8 + 1


def check_sample_args(num_samples, temperature, seed) -> None:
    """ValueError naming the first argument of a sample() call that is out of range
    (the CLI checks its flags with this before training)."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
    if num_samples > MAX_SAMPLES:
        raise ValueError(
            f"num_samples must be at most {MAX_SAMPLES:,} per call, got {num_samples:,}: names are "
            "generated one character at a time, so more would take minutes and hold every name in "
            "memory. Sample in several calls (with different seeds) instead.")
    if not isinstance(temperature, (int, float, np.floating)) or not temperature > 0:
        raise ValueError(f"temperature must be greater than 0, got {temperature!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")


def check_prefix_length(prefix: str, block_size: int, name: str = "the prefix") -> None:
    """A prefix must leave room for one drawn token: shorter than block_size."""
    if len(prefix) >= block_size:
        raise ValueError(f"{name} must be shorter than block_size ({block_size}), got {len(prefix)} characters")


def batch_rows(vocab_size: int) -> int:
    """Rows drawn together: as many as DRAW_BYTES of logits allow, at most MAX_BATCH_ROWS."""
    return max(1, min(MAX_BATCH_ROWS, DRAW_BYTES // (DRAW_BYTES_PER_LOGIT * vocab_size)))


def memory_bytes(model: ModelConfig, vocab_size: int) -> int:
    """The most memory sampling holds at once, beyond the parameters."""
    rows, block, c = batch_rows(vocab_size), model.block_size, model.n_embd
    one_name = KVCache.bytes_per_token(model) * block
    # the largest cache and the one it is copied from (growing, or dropping finished rows)
    cache = 2 * max(min(CACHE_LIMIT, rows * one_name), one_name)
    step = rows * (16 * c + model.n_head * block) * 4  # one position's activations per row
    prefix = min(CHUNK_BYTES, 4 * model.n_head * block * block) + block * 16 * c * 4
    return cache + rows * vocab_size * DRAW_BYTES_PER_LOGIT + step + prefix


def draw(logits: np.ndarray, u: np.ndarray) -> np.ndarray:
    """One token per row from softmax(logits): the first whose CDF passes the row's
    uniform u. (In place after the first subtraction: one temporary the size of logits.)"""
    cdf = logits - logits.max(axis=-1, keepdims=True)
    np.exp(cdf, out=cdf)
    cdf /= cdf.sum(axis=-1, keepdims=True)
    np.cumsum(cdf, axis=-1, out=cdf)
    return np.minimum((cdf < u[:, None]).sum(axis=-1), logits.shape[-1] - 1)


class Uniforms:
    """The uniform numbers of the module doc: row i's for its j-th token is
    number j*N + i of default_rng(seed)'s stream of doubles."""

    def __init__(self, seed: int, num_rows: int):
        self._state = np.random.default_rng(seed).bit_generator.state
        self._num_rows = num_rows

    def take(self, j: int, rows: np.ndarray) -> np.ndarray:
        """The numbers of the given rows (ascending) for their j-th token."""
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        bits = np.random.PCG64(0)
        bits.state = self._state
        bits.advance(j * self._num_rows + lo)  # one double per 64-bit output
        return np.random.Generator(bits).random(hi - lo)[rows - lo]


class Sampler:
    """One sample() call: the prefix's keys and values, then the rows in batches."""

    def __init__(self, w: Weights, model: ModelConfig, xp, bos: int, temperature: float,
                 seed: int, num_samples: int, prefix: list[int],
                 cancel: Callable[[], bool] | None, to_host: Callable):
        self.w, self.model, self.xp, self.bos = w, model, xp, bos
        self.temperature, self.cancel, self.to_host = temperature, cancel, to_host
        self.uniforms = Uniforms(seed, num_samples)
        self.num_samples = num_samples
        self.start = np.array([bos, *prefix], dtype=np.int64)
        self.draws = model.block_size - len(prefix)  # tokens a name may still get
        self.bytes_per_token = KVCache.bytes_per_token(model)
        self.tokens = [[] for _ in range(num_samples)]  # what each row drew, bos excluded
        self.prefix_cache, self.prefix_logits = self._run_prefix()

    def _check_cancel(self) -> None:
        if self.cancel is not None and self.cancel():
            raise Cancelled("sampling was cancelled")

    def _run_prefix(self):
        """Keys and values of bos + prefix for one row, and the logits after it."""
        n, xp, model = len(self.start), self.xp, self.model
        cache = KVCache.empty(model, 1, n, xp, self.w.wte.dtype)
        chunk = max(1, min(n, CHUNK_BYTES // (4 * model.n_head * n)))
        for lo in range(0, n, chunk):
            self._check_cancel()
            x, _ = forward(self.w, xp.asarray(self.start[None, lo : lo + chunk]), model, xp,
                           kv=cache, start=lo)
        return cache, linear(x[:, -1], self.w.lm_head)

    def run(self) -> list[list[int]]:
        per_batch = batch_rows(self.w.wte.shape[0])
        for lo in range(0, self.num_samples, per_batch):
            pending = [(np.arange(lo, min(lo + per_batch, self.num_samples)), 0)]
            while pending:
                rows, replay = pending.pop()
                pending += self._generate(rows, replay)
        return self.tokens

    def _capacity_fits(self, rows: int, capacity: int) -> bool:
        return rows == 1 or rows * capacity * self.bytes_per_token <= CACHE_LIMIT

    def _generate(self, rows: np.ndarray, replay: int) -> list[tuple[np.ndarray, int]]:
        """Draw the tokens of `rows` (ascending) after the first `replay` ones, which
        self.tokens already holds (they are run through the model again, not drawn).

        Returns rows split off to keep the cache under its bound, each with how
        many tokens they hold so far.
        """
        xp, w, bos, n_start = self.xp, self.w, self.bos, len(self.start)
        block = self.model.block_size
        capacity = min(block, max(FIRST_CAPACITY, n_start + replay + 1))
        split_off = []
        while not self._capacity_fits(len(rows), capacity):
            half = len(rows) // 2
            split_off.append((rows[half:], replay))
            rows = rows[:half]
        cache = self.prefix_cache.resized(len(rows), capacity, n_start, xp)
        logits = xp.broadcast_to(self.prefix_logits, (len(rows), self.prefix_logits.shape[-1]))
        slots = np.arange(len(rows))  # each row's row in the cache (finished rows stay until compacted)
        for j in range(self.draws):
            self._check_cancel()
            if j < replay:
                nxt = np.array([self.tokens[r][j] for r in rows])
            else:
                scaled = self.to_host(logits[xp.asarray(slots)]).astype(np.float64)
                scaled /= self.temperature
                nxt = draw(scaled, self.uniforms.take(j, rows))
                for r, token in zip(rows.tolist(), nxt.tolist()):
                    if token != bos:
                        self.tokens[r].append(token)
            going = nxt != bos
            rows, slots, nxt = rows[going], slots[going], nxt[going]
            if not len(rows) or j + 1 == self.draws:
                break
            position = n_start + j  # where token j goes
            if position == cache.capacity or 8 * len(rows) <= 7 * cache.rows:
                if position == cache.capacity:
                    capacity = min(2 * capacity, block)
                while not self._capacity_fits(len(rows), capacity):
                    half = len(rows) // 2
                    split_off.append((rows[half:], j + 1))
                    rows, slots, nxt = rows[:half], slots[:half], nxt[:half]
                cache = cache.resized(xp.asarray(slots), capacity, position, xp)
                slots = np.arange(len(rows))
            tokens = np.full((cache.rows, 1), bos, dtype=np.int64)
            tokens[slots, 0] = nxt
            x, _ = forward(w, xp.asarray(tokens), self.model, xp, kv=cache, start=position)
            logits = linear(x[:, -1], w.lm_head)
        return split_off


def sample_ids(w: Weights, model: ModelConfig, xp, bos: int, num_samples: int, temperature: float,
               seed: int, prefix: list[int], cancel: Callable[[], bool] | None = None,
               to_host: Callable = np.asarray) -> list[list[int]]:
    """Token ids each of num_samples names draws after bos + prefix, without bos.

    cancel() is polled once per position; when it returns True this raises Cancelled.
    """
    return Sampler(w, model, xp, bos, temperature, seed, num_samples, prefix, cancel, to_host).run()
