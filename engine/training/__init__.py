"""Training a run: the protocol of commands and events, the run's phases and
model, held-out evaluation, checkpoints, autosave, run records."""
