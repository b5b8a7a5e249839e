"""Looking inside a trained model: the next-character distribution after a
prefix, beam-search completions, attention matrices and a 2-D map of the
token embeddings. Qt-free, over a parameter Snapshot.

Everything runs engine.model.gpt's own forward pass (never a second copy of the
model) on a snapshot's float32 parameters, as the backends' sampling does;
probabilities are then taken in float64. A Snapshot is a copy detached from
the backend, so it can be read in any thread while training goes on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..config import ModelConfig
from ..data.corpus import char_encoder
from ..errors import Cancelled
from .gpt import Weights, forward, next_token_logits
from ..params import flatten, param_specs
from .sampling import check_prefix_length

END_LABEL = "end"  # bos as the next character: the name ends here
START_LABEL = "start"  # bos as the first input position
VOWELS = frozenset("aeiou")

CancelFn = Callable[[], bool] | None


@dataclass(frozen=True, eq=False)
class Snapshot:
    """A model's parameters at one step, with the vocabulary to read them.

    flat is the flat float32 buffer in engine.params' layout. The snapshot
    keeps a read-only copy (a read-only float32 array is taken as it is), so it
    can be shared between threads.
    """

    flat: np.ndarray
    model: ModelConfig
    chars: tuple[str, ...]
    step: int = 0
    weights: Weights = field(init=False, repr=False)

    def __post_init__(self) -> None:
        chars = tuple(self.chars)
        specs = param_specs(self.model, len(chars) + 1)
        flat = self.flat
        if not (isinstance(flat, np.ndarray) and flat.dtype == np.float32 and not flat.flags.writeable):
            flat = np.array(flat, dtype=np.float32)  # our own copy: the caller's may change
        if flat.shape != (specs[-1].end,):
            raise ValueError(f"expected {specs[-1].end} parameters for this model and vocabulary, "
                             f"got an array of shape {flat.shape}")
        flat.setflags(write=False)
        object.__setattr__(self, "chars", chars)
        object.__setattr__(self, "flat", flat)
        object.__setattr__(self, "weights", Weights(flat, specs, self.model))
        object.__setattr__(self, "encode", char_encoder(chars))

    @classmethod
    def from_params(cls, params: dict, model: ModelConfig, chars, step: int = 0) -> "Snapshot":
        """From a name -> array dict (Backend.get_params())."""
        chars = tuple(chars)
        return cls(flatten(params, param_specs(model, len(chars) + 1)), model, chars, step)

    @classmethod
    def from_backend(cls, backend) -> "Snapshot":
        """The backend's current parameters. Call it in the thread that owns the backend."""
        flat = backend.get_state().params  # a fresh host copy: no second copy needed
        flat.setflags(write=False)
        return cls(flat, backend.model, backend.corpus.chars, backend.step)

    @property
    def bos(self) -> int:
        return len(self.chars)

    @property
    def vocab_size(self) -> int:
        return len(self.chars) + 1

    def context(self, prefix: str) -> np.ndarray:
        """bos + prefix as token ids; the prefix must leave room for one more token."""
        check_prefix_length(prefix, self.model.block_size)
        return np.array([self.bos, *self.encode(prefix)], dtype=np.int64)

    def next_labels(self) -> tuple[str, ...]:
        """A label per vocabulary entry as a next character: the characters, then END_LABEL."""
        return (*self.chars, END_LABEL)


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """softmax(logits / temperature) over the last axis, in float64."""
    z = np.asarray(logits, dtype=np.float64) / _check_temperature(temperature)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def log_softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64) / _check_temperature(temperature)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _check_temperature(temperature: float) -> float:
    if not isinstance(temperature, (int, float, np.floating)) or not temperature > 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    return float(temperature)


# next character -------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class NextChar:
    """The model's distribution over the token after bos + prefix."""

    prefix: str
    temperature: float
    labels: tuple[str, ...]  # the characters, then END_LABEL (bos)
    probs: np.ndarray        # (vocab_size,) float64, sums to 1
    step: int

    def ranked(self) -> list[int]:
        """Vocabulary indices from the most to the least likely (ties: vocabulary order)."""
        return np.argsort(-self.probs, kind="stable").tolist()


def next_char(snap: Snapshot, prefix: str, temperature: float = 1.0, cancel: CancelFn = None) -> NextChar:
    tokens = snap.context(prefix)
    _poll(cancel)
    logits = next_token_logits(snap.weights, tokens[None, :], snap.model, np)[0]
    return NextChar(prefix, float(temperature), snap.next_labels(), softmax(logits, temperature), snap.step)


# completions ------------------------------------------------------------------

@dataclass(frozen=True)
class Completion:
    """A name that starts with the prefix, and its probability under the model:
    the product of the conditional probability of each character after the
    prefix and, when ended, of the end."""

    text: str
    prob: float
    ended: bool  # False: cut at block_size characters, as sampling cuts names


def complete(snap: Snapshot, prefix: str, width: int = 5, temperature: float = 1.0,
             cancel: CancelFn = None) -> list[Completion]:
    """The most likely completions of prefix by beam search, most likely first.

    Each step extends the `width` best unfinished names by every token; an end
    token finishes a name. The search stops when no unfinished name can beat
    the width-th best finished one (probabilities only shrink as names grow),
    or at block_size characters, where the unfinished names end as cut.
    """
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 1:
        raise ValueError(f"the beam width must be a positive integer, got {width!r}")
    start = snap.context(prefix)
    bos = snap.bos
    live_tokens = start[None, :]
    live_logp = np.zeros(1)
    finished: list[tuple[float, tuple[int, ...], bool]] = []  # (log prob, generated ids, ended)

    def worst_kept() -> float:
        return sorted((f[0] for f in finished), reverse=True)[width - 1] if len(finished) >= width else -math.inf

    for _ in range(snap.model.block_size - len(prefix)):
        _poll(cancel)
        logits = next_token_logits(snap.weights, live_tokens, snap.model, np)
        candidates = live_logp[:, None] + log_softmax(logits, temperature)  # (beams, V)
        for row, logp in enumerate(candidates[:, bos]):
            if logp > -math.inf:
                finished.append((float(logp), tuple(live_tokens[row, len(start):].tolist()), True))
        candidates[:, bos] = -math.inf
        flat = candidates.ravel()
        best = np.argsort(-flat, kind="stable")[:width]
        best = best[flat[best] > max(-math.inf, worst_kept())]  # those that can still make the list
        if not len(best):
            break
        rows, tokens = np.divmod(best, candidates.shape[1])
        live_tokens = np.concatenate([live_tokens[rows], tokens[:, None]], axis=1)
        live_logp = flat[best]
    else:  # block_size reached: what is left ends as cut
        finished += [(float(logp), tuple(t[len(start):].tolist()), False)
                     for logp, t in zip(live_logp, live_tokens)]
    finished.sort(key=lambda f: -f[0])
    return [Completion(prefix + "".join(snap.chars[i] for i in ids), math.exp(logp), ended)
            for logp, ids, ended in finished[:width]]


# attention ----------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Attention:
    """Attention probabilities of every layer and head for bos + text.

    maps[layer, head, i, j] is how much position i (the query) attends to
    position j (the key); rows sum to 1 and entries above the diagonal are 0
    (a position sees only itself and earlier ones).
    """

    text: str                # the characters shown (cut to block_size - 1)
    labels: tuple[str, ...]  # per position: START_LABEL, then the characters
    maps: np.ndarray         # (n_layer, n_head, T, T) float64
    step: int
    truncated: bool = False  # text was longer than the model's context


def attention(snap: Snapshot, text: str, cancel: CancelFn = None) -> Attention:
    shown = text[: snap.model.block_size - 1]
    tokens = np.array([snap.bos, *snap.encode(shown)], dtype=np.int64)
    _poll(cancel)
    _, cache = forward(snap.weights, tokens, snap.model, np, keep=True)
    maps = np.stack([layer.p for layer in cache[1:]]).astype(np.float64)
    return Attention(shown, (START_LABEL, *shown), maps, snap.step, truncated=len(shown) < len(text))


# character map ------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class CharMap:
    """The characters' embeddings (wte rows, bos left out) projected onto their
    first two principal components."""

    labels: tuple[str, ...]
    points: np.ndarray      # (len(labels), 2) float64
    explained: np.ndarray   # (2,) fraction of the variance along each axis
    step: int
    embeddings: np.ndarray = field(repr=False, default=None)  # (len(labels), C) the rows projected, centred
    trails: np.ndarray = field(repr=False, default=None)      # (K, len(labels), 2) earlier embeddings, same axes


def char_map(snap: Snapshot, previous: CharMap | None = None, history=(), cancel: CancelFn = None) -> CharMap:
    """PCA of the character embeddings: centred, by SVD.

    A principal axis has no sign of its own, so each is oriented to agree with
    the previous map when one is given (the picture does not flip between
    refreshes), else so that its largest coordinate is positive. `history`:
    earlier maps' `embeddings`, projected on these same axes as `trails`, so a
    character's path shows its own movement, not the axes turning.
    """
    _poll(cancel)
    x = np.asarray(snap.weights.wte[: snap.bos], dtype=np.float64)
    x = x - x.mean(axis=0)
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    k = min(2, len(s))
    axes = np.zeros((2, x.shape[1]))
    axes[:k] = vt[:k]
    points = x @ axes.T
    total = float((s**2).sum())
    explained = np.zeros(2)
    if total > 0:
        explained[:k] = s[:k] ** 2 / total
    for axis in range(2):
        if previous is not None and previous.points.shape == points.shape:
            flip = float(points[:, axis] @ previous.points[:, axis]) < 0
        else:
            flip = points[np.argmax(np.abs(points[:, axis])), axis] < 0
        if flip:
            points[:, axis] *= -1
            axes[axis] *= -1
    trails = np.array([(e - e.mean(axis=0)) @ axes.T for e in history if np.shape(e) == x.shape]).reshape(-1, len(x), 2)
    return CharMap(snap.chars, points, explained, snap.step, x, trails)


def group_spread(cmap: CharMap, members) -> float:
    """Mean distance between two members of a group on the map, as a fraction of
    the mean distance between any two characters (below 1: the group clusters).
    NaN when the group has fewer than two characters on the map."""
    inside = [i for i, label in enumerate(cmap.labels) if label in members]
    if len(inside) < 2 or len(cmap.labels) < 2:
        return math.nan
    every = _mean_pairwise_distance(cmap.points)
    return _mean_pairwise_distance(cmap.points[inside]) / every if every > 0 else math.nan


def _mean_pairwise_distance(points: np.ndarray) -> float:
    d = np.linalg.norm(points[:, None, :] - points[None, :, :], axis=-1)
    n = len(points)
    return float(d.sum() / (n * (n - 1)))


def _poll(cancel: CancelFn) -> None:
    if cancel is not None and cancel():
        raise Cancelled("superseded by a newer request")
