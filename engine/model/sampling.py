"""Sampling names one position at a time over a key/value cache (NumPy and CuPy),
and the one definition of sampling's randomness that every backend follows.

A name starts as bos + prefix; at each position the next token is drawn from
softmax(logits / temperature) by the inverse CDF of one uniform number, until
bos or max_length characters (default_max_length: the longest training
document plus MAX_LENGTH_MARGIN, at most block_size). The prefix runs through
the model once, for one row, and its keys and values are copied to every row;
after that each new token is one forward step (engine.model.gpt.forward with a
KVCache) for all the rows still going, instead of recomputing every earlier
position.

The draw (NumPy, CuPy and kernels/lib/sample.fut alike, so a seed gives the same
names on every backend):
- key = splitmix64(splitmix64(splitmix64(seed) ^ sample) ^ position), where
  splitmix64(x) is SplitMix64's output for the state x (add 0x9E3779B97F4A7C15,
  then its mixing function), all mod 2**64; sample is the name's index in the
  call (0 .. num_samples - 1) and position the index in the name of the
  character being drawn (the prefix's characters count: the first drawn after
  prefix "ka" is position 2); seed is taken mod 2**64;
- u = (key >> 11) * 2**-53, a float64 in [0, 1);
- p = softmax(float64(logits) / temperature), from the model's float32 logits;
- the token is the number of entries of cumsum(p) below u (at most V - 1).
A row's draws depend on nothing but its own (seed, sample, position), so the
rows can be grouped any way; they run in batches that bound memory:
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

from ..config import ModelConfig
from ..errors import Cancelled
from .gpt import KVCache, Weights, forward, linear

MAX_SAMPLES = 10_000  # names per sample() call (see Backend.sample)
MAX_LENGTH_MARGIN = 5  # default_max_length: characters beyond the longest training document
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


def longest_document(corpus) -> int:
    """Characters in the corpus's longest document."""
    return corpus.arrays.max_length - 2  # each document is stored as bos + characters + bos


def default_max_length(longest: int, block_size: int, prefix_length: int = 0) -> int:
    """The default max_length: the longer of the longest training document and the
    prefix, plus MAX_LENGTH_MARGIN characters, at most block_size. (A model that
    learned names of up to 15 characters has no use for names of hundreds; on
    names.txt, tiny's block_size 16 is the cap, as in microgpt.)"""
    return min(block_size, max(longest, prefix_length) + MAX_LENGTH_MARGIN)


def check_max_length(max_length, block_size: int, prefix_length: int, name: str = "max_length") -> None:
    """A max_length is a whole number from prefix_length + 1 (one drawn character) to block_size."""
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)):
        raise ValueError(f"{name} must be a whole number, got {max_length!r}")
    if max_length > block_size:
        raise ValueError(f"{name} must be at most block_size ({block_size}), got {max_length}")
    least = prefix_length + 1
    if max_length < least:
        what = f"longer than the prefix ({prefix_length} characters)" if prefix_length else "at least 1"
        raise ValueError(f"{name} must be {what}, got {max_length}")


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
    """One token per row from softmax(logits) (float64, already divided by the
    temperature): the number of CDF entries below the row's uniform u, as the
    module doc defines. (In place after the first subtraction: one temporary the
    size of logits.)"""
    cdf = logits - logits.max(axis=-1, keepdims=True)
    np.exp(cdf, out=cdf)
    cdf /= cdf.sum(axis=-1, keepdims=True)
    np.cumsum(cdf, axis=-1, out=cdf)
    return np.minimum((cdf < u[:, None]).sum(axis=-1), logits.shape[-1] - 1)


GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment
KEY_SHIFT = 11  # a key's top 53 bits make the double
UNIT = 2.0 ** -53


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output for the state x (uint64 array; wraps mod 2**64)."""
    z = x + np.uint64(GOLDEN_GAMMA)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def uniforms(seed: int, samples: np.ndarray, position: int) -> np.ndarray:
    """The module doc's u for each of the samples (indices) at one position: float64 in [0, 1)."""
    key = splitmix64(np.array([seed % 2**64], dtype=np.uint64))
    key = splitmix64(key ^ np.asarray(samples, dtype=np.uint64))
    key = splitmix64(key ^ np.uint64(position))
    return (key >> np.uint64(KEY_SHIFT)).astype(np.float64) * UNIT


class Sampler:
    """One sample() call: the prefix's keys and values, then the rows in batches."""

    def __init__(self, w: Weights, model: ModelConfig, xp, bos: int, temperature: float,
                 seed: int, num_samples: int, prefix: list[int], max_length: int,
                 cancel: Callable[[], bool] | None, to_host: Callable):
        self.w, self.model, self.xp, self.bos = w, model, xp, bos
        self.temperature, self.cancel, self.to_host = temperature, cancel, to_host
        self.seed, self.num_samples, self.max_length = seed, num_samples, max_length
        self.start = np.array([bos, *prefix], dtype=np.int64)
        self.draws = max_length - len(prefix)  # tokens a name may still get
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
        block = self.max_length  # positions the cache may need
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
                # token j after the prefix is the name's character n_start - 1 + j (bos is none)
                nxt = draw(scaled, uniforms(self.seed, rows, n_start - 1 + j))
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
               seed: int, prefix: list[int], max_length: int, cancel: Callable[[], bool] | None = None,
               to_host: Callable = np.asarray) -> list[list[int]]:
    """Token ids each of num_samples names draws after bos + prefix, without bos:
    at most max_length - len(prefix) of them.

    cancel() is polled once per position; when it returns True this raises Cancelled.
    """
    return Sampler(w, model, xp, bos, temperature, seed, num_samples, prefix, max_length, cancel,
                   to_host).run()
