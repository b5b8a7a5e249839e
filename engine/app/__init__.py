"""The application's state, Qt-free: one AppModel that front ends (the window's
controllers) observe and send commands to (engine.app.model)."""
from .model import AppModel, Change, DatasetState, Settings

__all__ = ["AppModel", "Change", "DatasetState", "Settings"]
