"""The engine's exceptions, in one leaf module that every other module may import.

Each message is a sentence a person can act on; the CLI prints it as one line
and the window shows it in a message box.
"""
from __future__ import annotations


class BackendError(RuntimeError):
    """A backend failed (compile, device, out of memory); the message says what to do."""


class TrainingDiverged(RuntimeError):
    """The loss became NaN or inf; the parameters from before that step are kept."""

    def __init__(self, step: int, loss: float):
        self.step, self.loss = step, loss
        super().__init__(
            f"training diverged at step {step + 1}: the loss became {loss}. The parameters "
            "from before that step are kept; lower the learning rate or init std and retry."
        )


class Cancelled(RuntimeError):
    """A long call (sampling) was asked to stop and did, leaving the state unchanged."""


class DatasetError(ValueError):
    """A dataset that cannot be used, with a message a person can act on."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, with what is wrong with it."""
