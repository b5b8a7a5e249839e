"""microgpt-gui's engine: Qt-free configuration, data, backends and checkpoints."""
from .backends import Backend, BackendInfo, TrainState, list_backends, load_checkpoint, open_backend
from .training.checkpoint import read_checkpoint, save_checkpoint
from .config import PRESETS, ModelConfig, Preset, TrainConfig, get_preset
from .data.split import DataSplit
from .data.corpus import Corpus, default_dataset_path, load_corpus
from .training.heldout import HeldoutPoint, HoldoutSchedule
from .training.health import loss_warning
from .errors import (BackendError, Cancelled, CheckpointError, DatasetError, EngineError, TrainingDiverged,
                     error_details)
from .params import init_params, num_params, param_specs
from .model import introspect  # `from engine import introspect`, as documented

__version__ = "0.1.0"

__all__ = [
    "Backend", "BackendError", "BackendInfo", "Cancelled", "CheckpointError", "Corpus", "DataSplit",
    "DatasetError", "EngineError", "HeldoutPoint", "HoldoutSchedule",
    "ModelConfig", "PRESETS", "Preset", "TrainConfig", "TrainState", "TrainingDiverged",
    "default_dataset_path", "error_details", "get_preset", "init_params", "list_backends", "load_checkpoint",
    "load_corpus", "loss_warning", "num_params", "open_backend", "param_specs", "read_checkpoint",
    "save_checkpoint",
]
