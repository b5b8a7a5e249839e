"""The engine's exceptions, in one leaf module that every other module may import.

Each message is a sentence a person can act on; the CLI prints it as one line
and the window shows it in a message box.
"""
from __future__ import annotations


class EngineError(RuntimeError):
    """An engine failure whose message says what to do, with optional `details`
    (e.g. a compiler's log) that a window shows behind a "Show details" button."""

    def __init__(self, message: str = "", details: str = ""):
        super().__init__(message)
        self.details = details


class BackendError(EngineError):
    """A backend failed (compile, device, out of memory); the message says what to do."""


class TrainingDiverged(EngineError):
    """The loss became NaN or inf; the parameters from before that step are kept."""

    def __init__(self, step: int, loss: float):
        self.step, self.loss = step, loss
        super().__init__(
            f"training diverged at step {step + 1}: the loss became {loss}. The parameters "
            "from before that step are kept; lower the learning rate or init std and retry."
        )


class Cancelled(EngineError):
    """A long call (sampling) was asked to stop and did, leaving the state unchanged."""


class DatasetError(ValueError):
    """A dataset that cannot be used, with a message a person can act on."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, with what is wrong with it."""


def error_details(exc: BaseException) -> str:
    """What an exception carries beyond its message (an EngineError's details), or ""."""
    return exc.details if isinstance(exc, EngineError) else ""
