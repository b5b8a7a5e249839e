"""Model and training configuration, the presets, and their validation.

One definition of each hyperparameter default, and of each one's limits, lives
here; everything else (the backends, the CLI, the window, the checkpoint reader)
reads them from these objects.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace


# ---- limits ---------------------------------------------------------------------
# One set of limits for every number that configures a run, by checkpoint member
# name: ModelConfig and TrainConfig refuse a value outside them, the command line's
# flags are checked against them as they are parsed, the window's fields have these
# ranges (its spin boxes hold 32-bit ints), and the checkpoint reader builds the
# configs, so it refuses what they refuse. Whatever is accepted saves a checkpoint
# that loads. Why each bound is where it is: docs/reliability.md.

# The most steps a run may ask for: the loss history keeps 4 bytes a step (in
# memory, in the checkpoint and in the window's plot), 40 MB at this count.
MAX_NUM_STEPS = 10_000_000

# The most documents one step may train on: a step's activations grow with it
# (names.txt has 32,033 names; past a few hundred a step only gets slower).
MAX_BATCH_SIZE = 4096

# Adam divides by 1 - beta^t: a beta must stay below 1 also as a float32 (a
# kernel's), where 1 - 1e-8 already rounds to 1.
MAX_BETA = 0.999999

FIELD_LIMITS: dict[str, tuple[int, int] | tuple[float, float]] = {
    # ints (whole numbers): the model's shape
    "model.n_embd": (1, 4096), "model.n_layer": (1, 96), "model.n_head": (1, 128),
    "model.block_size": (2, 4096),
    # ints: the run
    "train.num_steps": (1, MAX_NUM_STEPS), "train.seed": (0, 2**31 - 1),
    "train.warmup_steps": (0, MAX_NUM_STEPS), "train.batch_size": (1, MAX_BATCH_SIZE),
    "train.holdout": (0, 10_000_000),
    # floats: with Adam a learning rate of 1 moves every weight by about 1 a step,
    # and microgpt's init std is 0.08 (1e19 overflowed float32)
    "train.learning_rate": (1e-6, 1.0), "train.init_std": (1e-4, 1.0),
    "train.beta1": (0.0, MAX_BETA), "train.beta2": (0.0, MAX_BETA),
    # Adam's eps: positive, and a normal float32 even divided by the largest step size
    "train.eps": (1e-30, 1.0),
}


def show_number(value) -> str:
    """A limit or a value as a message shows it: 10,000,000 and 1e-06."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float):  # 1e-06 and 10000, but 0.9999999 in full (:g shows it as 1)
        return f"{value:g}" if float(f"{value:g}") == value else repr(value)
    return repr(value)


def limit_problem(key: str, value) -> str | None:
    """Why value cannot be FIELD_LIMITS[key] ("must be at most 1, got 10"), or None.

    A field whose limits are ints takes only ints (not floats, not bools); the
    others take any finite int or float."""
    low, high = FIELD_LIMITS[key]
    if isinstance(low, int):
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be a whole number, got {value!r}"
    elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        # type first (a string must not reach the comparison), and finite: inf
        # passes a lower bound but turns every parameter into inf or NaN
        return f"must be a finite number, got {value!r}"
    if value < low:
        return f"must be at least {show_number(low)}, got {show_number(value)}"
    if value > high:
        return f"must be at most {show_number(high)}, got {show_number(value)}"
    return None


def check_fields(config, section: str) -> None:
    """ValueError naming the first field of config outside FIELD_LIMITS[section.*]
    ("learning_rate must be at most 1, got 10"); None (holdout's default) passes."""
    for f in fields(config):
        key, value = f"{section}.{f.name}", getattr(config, f.name)
        if value is None and "None" in str(f.type):  # holdout: the default share
            continue
        if key in FIELD_LIMITS and (problem := limit_problem(key, value)):
            raise ValueError(f"{f.name} {problem}")


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a microgpt network (vocabulary size comes from the corpus)."""

    n_embd: int = 16
    n_layer: int = 1
    n_head: int = 4
    block_size: int = 16

    def __post_init__(self) -> None:
        check_fields(self, "model")
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
        check_fields(self, "train")

    def lr_factor(self, step: int) -> float:
        """The schedule, as a fraction of learning_rate at `step` (counted from 0):
        min(1, (step + 1) / warmup_steps) * (1 - step / num_steps).

        The warm-up ramps linearly to the full rate at step warmup_steps - 1 (a
        warm-up longer than the run never reaches it); microgpt's linear decay to
        0 at num_steps multiplies it throughout. The Futhark kernel's lr_factor
        (kernels/lib/train.fut) computes the same in f64 (tests hold them equal)."""
        decay = 1 - step / self.num_steps
        if self.warmup_steps == 0:  # microgpt's schedule, bit for bit
            return decay
        return min(1.0, (step + 1) / self.warmup_steps) * decay
    def lr_at(self, step: int) -> float:
        """The learning rate of training step `step`: learning_rate * lr_factor(step)."""
        return self.learning_rate * self.lr_factor(step)


@dataclass(frozen=True)
class Preset:
    model: ModelConfig
    train: TrainConfig = field(default_factory=TrainConfig)

    def with_steps(self, num_steps: int) -> "Preset":
        return replace(self, train=replace(self.train, num_steps=num_steps))


def _preset(c: int, layers: int, heads: int, block: int, lr: float, std: float, warmup: int = 0) -> Preset:
    return Preset(ModelConfig(c, layers, heads, block),
                  TrainConfig(learning_rate=lr, init_std=std, warmup_steps=warmup))


# Listed in this order everywhere (the window's combo, --preset's help): `learn`,
# the preset for learning, first; then microgpt and the sizes up from it.
# `learn` trains 32 names per step for 4000 steps (4 epochs of names.txt's
# training names); measured on numpy to reach a held-out loss of 2.05 in under
# 20 s of training (docs/learning.md, "Presets"). Block 16 holds every name of names.txt.
# `tiny` is microgpt itself with its own hyperparameters. microgpt's lr 0.01 and
# init_std 0.08 make the wider networks diverge, so those carry smaller values
# (measured: see docs/learning.md, "Presets"). gpt2-small's first Adam steps at the full
# rate move each of its 85 million weights by lr and overfit one name: it warms
# up, and starts from smaller weights (no final norm: std 0.02 puts the first
# logits' spread near 1, and the initial losses well above ln(V)).
PRESETS: dict[str, Preset] = {
    "learn": Preset(ModelConfig(32, 2, 4, 16), TrainConfig(num_steps=4000, learning_rate=0.01, init_std=0.05,
                                                          batch_size=32)),
    "tiny": _preset(16, 1, 4, 16, lr=0.01, std=0.08),
    "s32": _preset(32, 2, 4, 32, lr=0.005, std=0.05),
    "s64": _preset(64, 3, 4, 64, lr=0.002, std=0.02),
    "s128": _preset(128, 4, 4, 128, lr=0.001, std=0.02),
    "s256": _preset(256, 6, 8, 256, lr=0.0005, std=0.02),
    "gpt2-small": _preset(768, 12, 12, 1024, lr=0.0002, std=0.005, warmup=20),
}

# The preset selected when nothing else is chosen (the window's first start, demo):
# microgpt's own.
DEFAULT_PRESET = "tiny"


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}") from None
