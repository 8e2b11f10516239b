"""One training step and one eval step, written once for every runner.

The eager runner calls these functions every step; the CS runner traces the very same functions into
a graph, which is why they use only torch ops on tensors (no ``.item()``, no branching on values).
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from cs_run.amp.optimizer_step import apply_gradients
from cs_run.amp.precision import autocast
from cs_run.errors import ModelError
from cs_run.parallel import Strategy

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


def _loss(model: torch.nn.Module, batch: Any, training: bool) -> torch.Tensor:
    """``model(batch)``, checked to be the loss (Python-level facts only, so a traced step checks it once,
    at its trace): the usual slip, a forward that returns its logits or a (loss, outputs) tuple, is one
    line naming the forward instead of a torch error from inside the step."""
    loss = model(batch)
    problem = None
    if not isinstance(loss, torch.Tensor):
        problem = f"returned {type(loss).__name__} instead of the loss" + (
            " (return the loss alone: `return loss`, not `return loss, logits`)" if isinstance(loss, (tuple, list, dict))
            else "")
    elif loss.ndim > 0 and any(size != 1 for size in loss.shape):
        problem = (f"returned a tensor of shape {list(loss.shape)} instead of the loss (reduce it, e.g. with "
                   "torch.nn.functional.cross_entropy(logits, labels))")
    elif not loss.is_floating_point():
        problem = f"returned a {loss.dtype} tensor instead of the loss"
    elif training and not loss.requires_grad:
        problem = "returned a loss that does not depend on the model's parameters (it has no grad_fn)"
    if problem is not None:
        raise ModelError(f"the model's forward(batch) {problem}: it must return the loss, a scalar floating-point "
                         f"tensor ({_where(model)})")
    return loss


def _where(model: torch.nn.Module) -> str:
    """Where the model's forward is defined, for the message."""
    module = getattr(model, "module", model)  # a data-parallel wrapper's model
    forward = type(module).forward
    try:
        return f"{type(module).__qualname__}.forward at {inspect.getsourcefile(forward)}:{inspect.getsourcelines(forward)[1]}"
    except (OSError, TypeError):
        return f"{type(module).__qualname__}.forward"


def train_step(model: torch.nn.Module, micro_batches: Sequence[Any], optimizer: torch.optim.Optimizer,
               lr_scheduler: Any, grad_scaler: Any, config: StepConfig,
               strategy: Optional[Strategy] = None) -> torch.Tensor:
    """Forward and backward over the micro-batches, the gradient step (:func:`~cs_run.amp.optimizer_step.apply_gradients`),
    then the LR step.

    Returns the mean loss over the micro-batches (detached). With one micro-batch the gradients are
    those of plain ``loss.backward()``; with k they are of ``loss / k`` summed, i.e. of the mean loss.
    Several replicas reduce the summed gradients once, in the last micro-batch's backward: the
    others run in ``strategy``'s :meth:`~cs_run.parallel.Strategy.holding_gradients` (the run's; data
    parallel when None, as in a traced step, whose all-reduce the engine places).
    """
    strategy = strategy if strategy is not None else Strategy()
    k = len(micro_batches)
    total = None
    for i, batch in enumerate(micro_batches):
        with strategy.holding_gradients(model) if i < k - 1 else contextlib.nullcontext():
            with _autocast(config):
                loss = _loss(model, batch, training=True)
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
        return _loss(model, batch, training=False).detach()
