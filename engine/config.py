"""Model and training configuration, the presets, and their validation.

One definition of each hyperparameter default lives here; everything else
(the backends, the CLI, the window) reads them from these objects.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a microgpt network (vocabulary size comes from the corpus)."""

    n_embd: int = 16
    n_layer: int = 1
    n_head: int = 4
    block_size: int = 16

    def __post_init__(self) -> None:
        for name in ("n_embd", "n_layer", "n_head", "block_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be at least 2, got {self.block_size}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"
            )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def num_params(self, vocab_size: int) -> int:
        """Parameter count: wte, wpe, lm_head and 12 C^2 per layer."""
        c = self.n_embd
        return 2 * vocab_size * c + self.block_size * c + self.n_layer * 12 * c * c


# The most steps a run may ask for: at the fastest step measured (under 0.1 ms)
# 10^12 steps would take years, and the count stays far inside int64.
MAX_NUM_STEPS = 10**12


# The most documents one step may train on: a step's activations grow with it
# (names.txt has 32,033 names; past a few hundred a step only gets slower).
MAX_BATCH_SIZE = 4096


@dataclass(frozen=True)
class TrainConfig:
    """microgpt's Adam with a linearly decaying learning rate, optionally after a
    linear warm-up (warmup_steps; 0, microgpt's, starts at the full rate)."""

    num_steps: int = 1000
    learning_rate: float = 0.01
    beta1: float = 0.85
    beta2: float = 0.99
    eps: float = 1e-8
    init_std: float = 0.08
    seed: int = 42
    warmup_steps: int = 0
    # documents per step (1: microgpt's one name per step), padded and masked
    batch_size: int = 1
    # documents held out of training for the held-out loss: the last `holdout`
    # of the training order; None: engine.data.split.default_holdout, 0: none
    holdout: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.num_steps, bool) or not isinstance(self.num_steps, int):
            raise ValueError(f"num_steps must be an integer, got {self.num_steps!r}")
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be at least 1, got {self.num_steps}")
        if self.num_steps > MAX_NUM_STEPS:
            raise ValueError(f"num_steps must be at most 10^12 (years of training at the fastest "
                             f"step), got {self.num_steps:,}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int):
            raise ValueError(f"warmup_steps must be a whole number of steps, got {self.warmup_steps!r}")
        if not 0 <= self.warmup_steps <= MAX_NUM_STEPS:
            raise ValueError(f"warmup_steps must be between 0 and 10^12, got {self.warmup_steps:,}")
        self._check_batch()
        checks = {
            "learning_rate": lambda x: x > 0,
            "init_std": lambda x: x > 0,
            "eps": lambda x: x > 0,
            "beta1": lambda x: 0 <= x < 1,
            "beta2": lambda x: 0 <= x < 1,
        }
        for name, ok in checks.items():
            value = getattr(self, name)
            # type first (a string must not reach the comparison), and finite:
            # inf passes "> 0" but turns every parameter into inf or NaN
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            if not ok(value):
                bound = "in [0, 1)" if name.startswith("beta") else "positive"
                raise ValueError(f"{name} must be {bound}, got {value}")

    def lr_factor(self, step: int) -> float:
        """The schedule, as a fraction of learning_rate at `step` (counted from 0):
        min(1, (step + 1) / warmup_steps) * (1 - step / num_steps).

        The warm-up ramps linearly to the full rate at step warmup_steps - 1 (a
        warm-up longer than the run never reaches it); microgpt's linear decay to
        0 at num_steps multiplies it throughout. The Futhark kernel's lr_factor
        (kernels/train.fut) computes the same in f64 (tests hold them equal)."""
        decay = 1 - step / self.num_steps
        if self.warmup_steps == 0:  # microgpt's schedule, bit for bit
            return decay
        return min(1.0, (step + 1) / self.warmup_steps) * decay
    def _check_batch(self) -> None:
        b, h = self.batch_size, self.holdout
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size must be a whole number from 1 to {MAX_BATCH_SIZE:,}, got {b!r}")
        if h is not None and (isinstance(h, bool) or not isinstance(h, int) or h < 0):
            raise ValueError(f"holdout must be a non-negative whole number (0: none), got {h!r}")

    def lr_at(self, step: int) -> float:
        """The learning rate of training step `step`: learning_rate * lr_factor(step)."""
        return self.learning_rate * self.lr_factor(step)


# What every front end can hold, by checkpoint field name: the window's fields have
# these ranges (a Qt spin box holds a 32-bit int: 10^12 steps overflowed it), and a
# checkpoint outside them is refused when it is read (limits_problem).
FIELD_LIMITS: dict[str, tuple[float, float]] = {
    "model.n_embd": (1, 4096), "model.n_layer": (1, 96), "model.n_head": (1, 128),
    "model.block_size": (2, 4096), "train.num_steps": (1, 10_000_000),
    "train.learning_rate": (1e-6, 1.0), "train.init_std": (1e-4, 1.0), "train.seed": (0, 2**31 - 1),
    "train.warmup_steps": (0, 10_000_000), "train.batch_size": (1, MAX_BATCH_SIZE),
    "train.holdout": (0, 10_000_000),
}


def limits_problem(model: ModelConfig, train: TrainConfig) -> str | None:
    """The first field outside FIELD_LIMITS, as a sentence; None when all fit."""
    for key, (low, high) in FIELD_LIMITS.items():
        section, name = key.split(".")
        value = getattr(model if section == "model" else train, name)
        if value is not None and not low <= value <= high:  # holdout None: the default share
            show = "{:,}" if isinstance(value, int) else "{:g}"
            return (f"{key} is {show.format(value)}, outside {show.format(low)}..{show.format(high)}, "
                    "the range microgpt-gui's fields hold")
    return None


@dataclass(frozen=True)
class Preset:
    model: ModelConfig
    train: TrainConfig = field(default_factory=TrainConfig)

    def with_steps(self, num_steps: int) -> "Preset":
        return replace(self, train=replace(self.train, num_steps=num_steps))


def _preset(c: int, layers: int, heads: int, block: int, lr: float, std: float, warmup: int = 0) -> Preset:
    return Preset(ModelConfig(c, layers, heads, block),
                  TrainConfig(learning_rate=lr, init_std=std, warmup_steps=warmup))


# `tiny` is microgpt itself with its own hyperparameters. microgpt's lr 0.01 and
# init_std 0.08 make the wider networks diverge, so those carry smaller values
# (measured: see docs/learning.md, "Presets"). gpt2-small's first Adam steps at the full
# rate move each of its 85 million weights by lr and overfit one name: it warms
# up, and starts from smaller weights (no final norm: std 0.02 puts the first
# logits' spread near 1, and the initial losses well above ln(V)).
PRESETS: dict[str, Preset] = {
    "tiny": _preset(16, 1, 4, 16, lr=0.01, std=0.08),
    "s32": _preset(32, 2, 4, 32, lr=0.005, std=0.05),
    "s64": _preset(64, 3, 4, 64, lr=0.002, std=0.02),
    "s128": _preset(128, 4, 4, 128, lr=0.001, std=0.02),
    "s256": _preset(256, 6, 8, 256, lr=0.0005, std=0.02),
    "gpt2-small": _preset(768, 12, 12, 1024, lr=0.0002, std=0.005, warmup=20),
    # for learning: 32 names per step, 4000 steps (4 epochs of names.txt's training
    # names); measured on numpy to reach a held-out loss of 2.05 in under 20 s of
    # training (docs/learning.md, "Presets"). Block 16 holds every name of names.txt.
    "learn": Preset(ModelConfig(32, 2, 4, 16), TrainConfig(num_steps=4000, learning_rate=0.01, init_std=0.05,
                                                          batch_size=32)),
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}") from None
