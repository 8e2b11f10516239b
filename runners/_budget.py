"""How many steps a run takes, from num_epochs / num_steps / max_steps / steps_per_epoch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from cs_run.errors import ParamsError

__all__ = ["StepBudget", "compute_step_budget"]


@dataclass(frozen=True)
class StepBudget:
    steps: int
    """Optimizer steps to run in this invocation."""
    steps_per_epoch: int
    """Steps per epoch (a pass over the loader, or runconfig.steps_per_epoch if smaller)."""


def compute_step_budget(*, global_step: int, loader_steps: Optional[int], max_steps: Optional[int] = None,
                        num_steps: Optional[int] = None, num_epochs: Optional[int] = None,
                        steps_per_epoch: Optional[int] = None) -> StepBudget:
    """Model Zoo rules: num_steps and num_epochs count from now, max_steps caps the global step.

    Args:
        global_step: steps already done (from a loaded checkpoint).
        loader_steps: steps one pass over the train loader gives (None if it has no length).
    """
    if num_steps is not None and num_epochs is not None:
        raise ParamsError("params: runconfig.num_steps and runconfig.num_epochs are mutually exclusive")
    if loader_steps == 0:
        raise ParamsError("params: train_input: the train loader yields no full step (fewer samples than "
                          "batch_size x grad_accum_steps, with drop_last_batch); lower train_input.batch_size")
    per_epoch = min(x for x in (steps_per_epoch, loader_steps) if x is not None) if (
        steps_per_epoch is not None or loader_steps is not None) else None
    if num_epochs is not None:
        if per_epoch is None:
            raise ParamsError("params: runconfig.num_epochs needs runconfig.steps_per_epoch: the train loader "
                              "has no length")
        steps = num_epochs * per_epoch
    elif num_steps is not None:
        steps = num_steps
    elif max_steps is not None:
        steps = max_steps - global_step
    else:
        raise ParamsError("params: set one of runconfig.max_steps, runconfig.num_steps or runconfig.num_epochs "
                          "(or --max_steps / --num_steps / --num_epochs) to say how long to train")
    if max_steps is not None:
        steps = min(steps, max_steps - global_step)
    return StepBudget(steps=max(steps, 0), steps_per_epoch=per_epoch if per_epoch is not None else 2**62)
