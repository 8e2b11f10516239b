"""One training step and one eval step, written once for every runner.

The eager runner calls these functions every step; the CS runner traces the very same functions into
a graph, which is why they use only torch ops on tensors (no ``.item()``, no branching on values).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from cs_run.amp.optimizer_step import apply_gradients
from cs_run.amp.precision import autocast

__all__ = ["StepConfig", "train_step", "eval_step"]


@dataclass(frozen=True)
class StepConfig:
    """The Python settings of a step; frozen, so a traced step never depends on changing ones."""

    max_gradient_norm: Optional[float] = None
    max_gradient_value: Optional[float] = None
    autocast_dtype: Optional[torch.dtype] = None
    device_type: str = "cpu"


def _autocast(config: StepConfig):
    if config.autocast_dtype is None:
        return contextlib.nullcontext()
    return autocast(device_type=config.device_type, dtype=config.autocast_dtype)


def train_step(model: torch.nn.Module, micro_batches: Sequence[Any], optimizer: torch.optim.Optimizer,
               lr_scheduler: Any, grad_scaler: Any, config: StepConfig) -> torch.Tensor:
    """Forward and backward over the micro-batches, the gradient step (:func:`~cs_run.amp.optimizer_step.apply_gradients`),
    then the LR step.

    Returns the mean loss over the micro-batches (detached). With one micro-batch the gradients are
    those of plain ``loss.backward()``; with k they are of ``loss / k`` summed, i.e. of the mean loss.
    A data-parallel model (``no_sync``, :class:`cs_run.replicas.ReplicatedModule`) all-reduces the summed
    gradients once, in the last micro-batch's backward.
    """
    k = len(micro_batches)
    total = None
    for i, batch in enumerate(micro_batches):
        local = model.no_sync() if i < k - 1 and hasattr(model, "no_sync") else contextlib.nullcontext()
        with local:
            with _autocast(config):
                loss = model(batch)
            scaled = loss / k if k > 1 else loss
            if grad_scaler is not None:
                scaled = grad_scaler.scale(scaled)
            scaled.backward()
        total = loss.detach() if total is None else total + loss.detach()
    apply_gradients(optimizer, grad_scaler, config.max_gradient_norm, config.max_gradient_value)
    if lr_scheduler is not None:
        lr_scheduler.step()
    return total / k if k > 1 else total


def eval_step(model: torch.nn.Module, batch: Any, config: StepConfig) -> torch.Tensor:
    """Forward only; the model updates its metrics itself."""
    with torch.no_grad(), _autocast(config):
        return model(batch).detach()
