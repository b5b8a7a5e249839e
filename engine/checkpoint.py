"""Checkpoints: one .npz with configs, vocabulary, documents in training order,
parameters, Adam moments, step and loss history; written atomically."""
from __future__ import annotations

import os
import tempfile
import zipfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from .config import ModelConfig, TrainConfig
from .data import Corpus
from .errors import CheckpointError, DatasetError

FORMAT_VERSION = 1
_ARRAYS = ("params", "m", "v", "losses")


@dataclass
class Checkpoint:
    model: ModelConfig
    train: TrainConfig
    corpus: Corpus
    params: np.ndarray
    m: np.ndarray
    v: np.ndarray
    step: int
    losses: np.ndarray
    backend: str


def save_checkpoint(path, backend) -> Path:
    """Write backend's full training state to path (temp file + rename)."""
    path = Path(path)
    state = backend.get_state()
    corpus = backend.corpus
    payload = {
        "format_version": np.int64(FORMAT_VERSION),
        "backend": np.str_(backend.name),
        "step": np.int64(state.step),
        "chars": np.str_("".join(corpus.chars)),
        "docs": np.str_("\n".join(corpus.docs)),
        "params": state.params, "m": state.m, "v": state.v,
        "losses": backend.loss_history,
    }
    for prefix, cfg in (("model.", backend.model), ("train.", backend.train_config)):
        for key, value in asdict(cfg).items():
            payload[prefix + key] = np.asarray(value)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            np.savez(out, **payload)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def read_checkpoint(path) -> Checkpoint:
    """Read and validate a checkpoint without opening a backend."""
    path = Path(path)
    try:
        # our own file handle: np.load leaks its handle when the zip is unreadable
        with open(path, "rb") as f, np.load(f, allow_pickle=False) as z:
            data = {key: z[key] for key in z.files}
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"{path} is not a readable microgpt-gui checkpoint (truncated or corrupt: {exc})"
        ) from None

    def need(key):
        if key not in data:
            raise CheckpointError(f"{path} is not a microgpt-gui checkpoint: it has no '{key}'")
        return data[key]

    version = int(need("format_version"))
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format {version}; this version reads {FORMAT_VERSION}")
    try:
        model = ModelConfig(**{f.name: int(need("model." + f.name)) for f in fields(ModelConfig)})
        train = TrainConfig(**{f.name: need("train." + f.name).item() for f in fields(TrainConfig)})
        docs = str(need("docs")).split("\n")
        corpus = Corpus.from_training_order(docs, list(str(need("chars"))))
    except (ValueError, DatasetError) as exc:
        raise CheckpointError(f"{path} holds an invalid configuration: {exc}") from None
    n = model.num_params(corpus.vocab_size)
    arrays = {}
    for key in _ARRAYS:
        arr = need(key)
        if arr.dtype != np.float32 or arr.ndim != 1:
            raise CheckpointError(f"{path}: '{key}' must be a 1-D float32 array, got {arr.dtype} {arr.shape}")
        arrays[key] = arr
    for key in ("params", "m", "v"):
        if arrays[key].shape != (n,):
            raise CheckpointError(
                f"{path}: '{key}' has {arrays[key].shape[0]} values but the model "
                f"{model} with vocabulary {corpus.vocab_size} has {n} parameters"
            )
    step = int(need("step"))
    if not 0 <= step <= train.num_steps or len(arrays["losses"]) != step:
        raise CheckpointError(f"{path}: step {step} does not match its loss history or num_steps")
    return Checkpoint(model, train, corpus, arrays["params"], arrays["m"], arrays["v"],
                      step, arrays["losses"], str(need("backend")))
