"""Closed-form weight-decay schedulers (``cs_run.optim.weight_decay_scheduler``), the vendor's 2.10 names.

Each ``XWD`` is the schedule ``XScheduler`` of :mod:`.scheduler` (same arguments: ``initial_val``,
``end_val``, ...) applied to ``param_group['weight_decay']``, which becomes a 0-d tensor written in
place every step. Every cs-run optimizer reads its group's ``weight_decay`` as a number or a tensor.
"""

from __future__ import annotations

import torch

from . import scheduler as _s
from .scheduler import Scheduler, TagsT

__all__ = [
    "ChainedWD",
    "ConstantWD",
    "CosineAnnealingWD",
    "CosineAnnealingWarmRestartsWD",
    "CosineDecayWD",
    "CyclicWD",
    "ExponentialWD",
    "InverseExponentialTimeDecayWD",
    "InverseSquareRootDecayWD",
    "LambdaWD",
    "LinearWD",
    "MultiStepWD",
    "MultiplicativeWD",
    "OneCycleWD",
    "PiecewiseConstantWD",
    "PolynomialWD",
    "ScalePerParamWD",
    "SequentialWD",
    "StepWD",
    "WeightDecayScheduler",
]

class WeightDecayScheduler(Scheduler):
    """Base of the weight-decay schedulers: a :class:`~.scheduler.Scheduler` of ``param_group['weight_decay']``."""

    @property
    def param_group_key(self) -> str:
        return "weight_decay"

class ConstantWD(WeightDecayScheduler, _s.ConstantScheduler):
    """See :class:`~.scheduler.ConstantScheduler`."""

class PolynomialWD(WeightDecayScheduler, _s.PolynomialScheduler):
    """See :class:`~.scheduler.PolynomialScheduler`."""

class LinearWD(WeightDecayScheduler, _s.LinearScheduler):
    """See :class:`~.scheduler.LinearScheduler`."""

class ExponentialWD(WeightDecayScheduler, _s.ExponentialScheduler):
    """See :class:`~.scheduler.ExponentialScheduler`."""

class InverseExponentialTimeDecayWD(WeightDecayScheduler, _s.InverseExponentialTimeDecayScheduler):
    """See :class:`~.scheduler.InverseExponentialTimeDecayScheduler`."""

class InverseSquareRootDecayWD(WeightDecayScheduler, _s.InverseSquareRootDecayScheduler):
    """See :class:`~.scheduler.InverseSquareRootDecayScheduler`."""

class CosineDecayWD(WeightDecayScheduler, _s.CosineDecayScheduler):
    """See :class:`~.scheduler.CosineDecayScheduler`."""

class SequentialWD(WeightDecayScheduler, _s.SequentialScheduler):
    """See :class:`~.scheduler.SequentialScheduler`."""

class MultiStepWD(WeightDecayScheduler, _s.MultiStepScheduler):
    """See :class:`~.scheduler.MultiStepScheduler`."""

class StepWD(WeightDecayScheduler, _s.StepScheduler):
    """See :class:`~.scheduler.StepScheduler`."""

class CosineAnnealingWD(WeightDecayScheduler, _s.CosineAnnealingScheduler):
    """See :class:`~.scheduler.CosineAnnealingScheduler`."""

class LambdaWD(WeightDecayScheduler, _s.LambdaScheduler):
    """See :class:`~.scheduler.LambdaScheduler`."""

class CosineAnnealingWarmRestartsWD(WeightDecayScheduler, _s.CosineAnnealingWarmRestartsScheduler):
    """See :class:`~.scheduler.CosineAnnealingWarmRestartsScheduler`."""

class MultiplicativeWD(WeightDecayScheduler, _s.MultiplicativeScheduler):
    """See :class:`~.scheduler.MultiplicativeScheduler`."""

class ChainedWD(WeightDecayScheduler, _s.ChainedScheduler):
    """See :class:`~.scheduler.ChainedScheduler`."""

class CyclicWD(WeightDecayScheduler, _s.CyclicScheduler):
    """See :class:`~.scheduler.CyclicScheduler`."""

class OneCycleWD(WeightDecayScheduler, _s.OneCycleScheduler):
    """See :class:`~.scheduler.OneCycleScheduler`."""

class ScalePerParamWD(WeightDecayScheduler, _s.ScalePerParamScheduler):
    """See :class:`~.scheduler.ScalePerParamScheduler`."""

class PiecewiseConstantWD(WeightDecayScheduler, _s.PiecewiseConstantScheduler):
    """``vals[i]`` between milestones; see :class:`~.scheduler.PiecewiseConstantScheduler`."""

    def __init__(self, optimizer: torch.optim.Optimizer, vals: list[float], milestones: list[int],
                 param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, constant_cls=ConstantWD, vals=vals, milestones=milestones,
                         param_group_tags=param_group_tags)
