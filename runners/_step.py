"""One training step and one eval step, written once for every runner.

The eager runner calls these functions every step; the CS runner traces the very same functions into
a graph, which is why they use only torch ops on tensors (no ``.item()``, no branching on values).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

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
    from cs_run.amp import autocast

    return autocast(device_type=config.device_type, dtype=config.autocast_dtype)


def train_step(model: torch.nn.Module, micro_batches: Sequence[Any], optimizer: torch.optim.Optimizer,
               lr_scheduler: Any, grad_scaler: Any, config: StepConfig) -> torch.Tensor:
    """Forward and backward over the micro-batches, clip, optimizer step, LR step, zero_grad.

    Returns the mean loss over the micro-batches (detached). With one micro-batch the gradients are
    those of plain ``loss.backward()``; with k they are of ``loss / k`` summed, i.e. of the mean loss.
    """
    k = len(micro_batches)
    total = None
    for batch in micro_batches:
        with _autocast(config):
            loss = model(batch)
        scaled = loss / k if k > 1 else loss
        if grad_scaler is not None:
            scaled = grad_scaler.scale(scaled)
        scaled.backward()
        total = loss.detach() if total is None else total + loss.detach()
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if grad_scaler is not None and (config.max_gradient_norm or config.max_gradient_value):
        grad_scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    if config.max_gradient_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, config.max_gradient_norm)
    elif config.max_gradient_value is not None:
        torch.nn.utils.clip_grad_value_(params, config.max_gradient_value)
    if grad_scaler is not None:
        grad_scaler.step(optimizer)
        grad_scaler.update()
    else:
        optimizer.step()
    if lr_scheduler is not None:
        lr_scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return total / k if k > 1 else total


def eval_step(model: torch.nn.Module, batch: Any, config: StepConfig) -> torch.Tensor:
    """Forward only; the model updates its metrics itself."""
    with torch.no_grad(), _autocast(config):
        return model(batch).detach()
