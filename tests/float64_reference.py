"""A float64 reference of a batched training run: the engine's own model, loss,
gradient and Adam (engine/model/gpt.py: loss_and_grad, adam_update and
doc_losses, which follow the dtype of the arrays they are given) run on float64
buffers, over the documents engine.data.split.DataSplit gives each step.

A backend's run (float32 throughout) should follow it to its rounding: the
reference shares the backend's model, training configuration, data split and
initial parameters, and nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.model.gpt import Weights, adam_update, doc_losses, loss_and_grad


@dataclass
class Float64Run:
    """The reference's state after `step` steps: float64 parameters and Adam moments,
    and each step's loss so far."""

    params: np.ndarray
    m: np.ndarray
    v: np.ndarray
    step: int
    losses: list[float]


def start(backend) -> Float64Run:
    """The reference at a backend's current state (its parameters and moments,
    cast to float64), typically step 0."""
    state = backend.get_state()
    cast = lambda a: np.asarray(a, dtype=np.float64).copy()  # noqa: E731
    return Float64Run(cast(state.params), cast(state.m), cast(state.v), state.step, [])


def train(run: Float64Run, backend, k: int) -> np.ndarray:
    """k more training steps of backend's run (its model, TrainConfig and split) in
    float64, in place on run; their losses, (k,) float64."""
    model, tc, split = backend.model, backend.train_config, backend.split
    w = Weights(run.params, backend.specs, model)
    grad = np.zeros_like(run.params)
    g = Weights(grad, backend.specs, model)
    scratch = np.empty_like(run.params)
    losses = []
    for step in range(run.step, run.step + k):
        batch = split.batch(step)
        loss = loss_and_grad(w, g, batch.inputs, batch.targets, model, np, lengths=batch.lengths)
        adam_update(run.params, grad, run.m, run.v, scratch, tc.lr_at(step), tc.beta1, tc.beta2, tc.eps,
                    step, np, block=run.params.shape[0])
        losses.append(float(loss))
    run.step += k
    run.losses += losses
    return np.array(losses)


def heldout_loss(run: Float64Run, backend) -> float:
    """Backend.heldout_loss's definition at the reference's parameters: the summed
    cross-entropy over every held-out document's real positions, divided by
    their number, all in float64."""
    w = Weights(run.params, backend.specs, backend.model)
    total, count = 0.0, 0
    for batch in backend.split.heldout_batches(len(backend.split.heldout_documents())):
        total += float(doc_losses(w, batch.inputs, batch.targets, batch.lengths, backend.model, np).sum())
        count += batch.positions
    return total / count
