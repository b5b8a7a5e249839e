"""Parameter names, shapes and flat-buffer layout, and the one initializer.

All parameters live in one flat float32 buffer in microgpt's order: wte, wpe,
lm_head, then per layer attn_wq, attn_wk, attn_wv, attn_wo, mlp_fc1, mlp_fc2.
Keeping attn_wq|wk|wv adjacent lets a backend view them as one (3C, C) matrix.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import ModelConfig

LAYER_PARAMS = ("attn_wq", "attn_wk", "attn_wv", "attn_wo", "mlp_fc1", "mlp_fc2")


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, int]  # (out, in), as microgpt's matrices
    offset: int

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def end(self) -> int:
        return self.offset + self.size


def param_specs(model: ModelConfig, vocab_size: int) -> list[ParamSpec]:
    c = model.n_embd
    shapes: list[tuple[str, tuple[int, int]]] = [
        ("wte", (vocab_size, c)),
        ("wpe", (model.block_size, c)),
        ("lm_head", (vocab_size, c)),
    ]
    layer_shapes = {
        "attn_wq": (c, c), "attn_wk": (c, c), "attn_wv": (c, c), "attn_wo": (c, c),
        "mlp_fc1": (4 * c, c), "mlp_fc2": (c, 4 * c),
    }
    for i in range(model.n_layer):
        shapes += [(f"layer{i}.{name}", layer_shapes[name]) for name in LAYER_PARAMS]
    specs, offset = [], 0
    for name, shape in shapes:
        specs.append(ParamSpec(name, shape, offset))
        offset += shape[0] * shape[1]
    return specs


def num_params(model: ModelConfig, vocab_size: int) -> int:
    """The parameter count, without building the layout (n_layer may be absurd)."""
    return model.num_params(vocab_size)


def init_params(model: ModelConfig, vocab_size: int, seed: int, std: float) -> np.ndarray:
    """N(0, std) for every parameter, drawn in layout order from one seeded Generator.

    Every backend starts from this buffer, so equal seeds give equal runs.
    """
    rng = np.random.default_rng(seed)
    specs = param_specs(model, vocab_size)
    flat = np.empty(specs[-1].end, dtype=np.float32)
    try:
        with np.errstate(over="raise"):  # a float32 overflow is an error, not a warning and inf
            for spec in specs:  # one matrix at a time: no float64 copy of the whole model
                flat[spec.offset : spec.end] = rng.normal(0.0, std, spec.size)
    except FloatingPointError:
        raise ValueError(f"init_std must be small enough for float32 weights, got {std:g} "
                         f"(it drew weights beyond {np.finfo(np.float32).max:.3g})") from None
    return flat


def unflatten(flat, specs: list[ParamSpec]) -> dict:
    """Views (not copies) of each matrix inside the flat buffer (NumPy or CuPy)."""
    return {s.name: flat[s.offset : s.end].reshape(s.shape) for s in specs}


def flatten(params: dict, specs: list[ParamSpec]) -> np.ndarray:
    """A new flat float32 buffer from a name -> array dict, checking names and shapes."""
    expected = {s.name for s in specs}
    missing, extra = expected - params.keys(), params.keys() - expected
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {sorted(missing)[:5]}")
        if extra:
            parts.append(f"unexpected {sorted(extra)[:5]}")
        raise ValueError("parameters do not match the model: " + "; ".join(parts))
    flat = np.empty(specs[-1].end, dtype=np.float32)
    for s in specs:
        value = np.asarray(params[s.name])
        if value.shape != s.shape:
            raise ValueError(f"parameter {s.name} has shape {value.shape}, expected {s.shape}")
        flat[s.offset : s.end] = value.reshape(-1)
    return flat
