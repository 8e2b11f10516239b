"""Closed-form LR schedulers (``cs_run.optim.lr_scheduler``): the vendor's names and arguments.

Each ``XLR`` is the schedule ``XScheduler`` of :mod:`.scheduler` applied to ``param_group['lr']``,
with the learning-rate spellings of its arguments (``initial_learning_rate`` for ``initial_val``, ...).
The closed forms, their phases and the documented differences from the vendor live there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from . import scheduler as _s
from .scheduler import Scheduler, TagsT

__all__ = [
    "BaseChainedScheduler",
    "ChainedLR",
    "ChainedScheduler",
    "ConstantLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "CosineDecayLR",
    "CyclicLR",
    "ExponentialLR",
    "InverseExponentialTimeDecayLR",
    "InverseSquareRootDecayLR",
    "LRScheduler",
    "LambdaLR",
    "LinearLR",
    "MultiStepLR",
    "MultiplicativeLR",
    "OneCycleLR",
    "PiecewiseConstantLR",
    "PolynomialLR",
    "ScalePerParamLR",
    "Scheduler",
    "SequentialLR",
    "StepLR",
]


class LRScheduler(Scheduler):
    """Base of the compliant LR schedulers: a :class:`~.scheduler.Scheduler` of ``param_group['lr']``.

    Every ``param_group['lr']`` is a 0-d tensor the schedule writes in place.
    """

    @property
    def param_group_key(self) -> str:
        return "lr"

    @property
    def initial_learning_rate(self) -> float:
        """The schedule's starting value (``initial_val``; ChainedLR divides by it)."""
        return self.initial_val  # type: ignore[attr-defined]

    @initial_learning_rate.setter
    def initial_learning_rate(self, value: float) -> None:
        self.initial_val = float(value)

    def get_lr(self) -> list[Tensor | None]:
        """The lr of the current step for every group (computed, not read from the groups)."""
        return self.get()

    def get_last_lr(self) -> list[Tensor | None]:
        """Copies of the groups' current lr tensors (read their values in a step closure on CSX)."""
        return self.get_last_value()


class ConstantLR(LRScheduler, _s.ConstantScheduler):
    """``lr = learning_rate``; see :class:`~.scheduler.ConstantScheduler`."""

    def __init__(self, optimizer: torch.optim.Optimizer, learning_rate: float, total_iters: int | None = None,
                 param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, val=learning_rate, total_iters=total_iters, param_group_tags=param_group_tags)

    @property
    def learning_rate(self) -> float:
        return self.val



class PolynomialLR(LRScheduler, _s.PolynomialScheduler):
    """Polynomial decay of the lr; see :class:`~.scheduler.PolynomialScheduler`."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, end_learning_rate: float,
                 total_iters: int, power: float = 1.0, cycle: bool = False,
                 param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, initial_val=initial_learning_rate, end_val=end_learning_rate,
                         total_iters=total_iters, power=power, cycle=cycle, param_group_tags=param_group_tags)


class LinearLR(LRScheduler, _s.LinearScheduler):
    """Linear ramp of the lr, then flat; see :class:`~.scheduler.PolynomialScheduler`."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, end_learning_rate: float,
                 total_iters: int, cycle: bool = False, param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, initial_val=initial_learning_rate, end_val=end_learning_rate,
                         total_iters=total_iters, cycle=cycle, param_group_tags=param_group_tags)


class ExponentialLR(LRScheduler, _s.ExponentialScheduler):
    """Exponential decay of the lr; see :class:`~.scheduler.ExponentialScheduler`."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, total_iters: int,
                 decay_rate: float, staircase: bool = False, param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, initial_val=initial_learning_rate, total_iters=total_iters,
                         decay_rate=decay_rate, staircase=staircase, param_group_tags=param_group_tags)


class InverseExponentialTimeDecayLR(LRScheduler, _s.InverseExponentialTimeDecayScheduler):
    """Keras' InverseTimeDecay of the lr; see :class:`~.scheduler.InverseExponentialTimeDecayScheduler`."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, step_exponent: int,
                 total_iters: int, decay_rate: float, staircase: bool = False,
                 param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, initial_val=initial_learning_rate, step_exponent=step_exponent,
                         total_iters=total_iters, decay_rate=decay_rate, staircase=staircase,
                         param_group_tags=param_group_tags)


class InverseSquareRootDecayLR(LRScheduler, _s.InverseSquareRootDecayScheduler):
    """Inverse square-root decay of the lr; see :class:`~.scheduler.InverseSquareRootDecayScheduler`."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float = 1.0, scale: float = 1.0,
                 warmup_steps: int = 1.0, param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, initial_val=initial_learning_rate, scale=scale, warmup_steps=warmup_steps,
                         param_group_tags=param_group_tags)


class CosineDecayLR(LRScheduler, _s.CosineDecayScheduler):
    """Keras' CosineDecay of the lr; see :class:`~.scheduler.CosineDecayScheduler`."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, end_learning_rate: float,
                 total_iters: int, param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, initial_val=initial_learning_rate, end_val=end_learning_rate,
                         total_iters=total_iters, param_group_tags=param_group_tags)


class CosineAnnealingLR(LRScheduler, _s.CosineAnnealingScheduler):
    """SGDR's cosine without restarts; see :class:`~.scheduler.CosineAnnealingScheduler`."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, T_max: int,
                 eta_min: float = 0.0, param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, initial_val=initial_learning_rate, T_max=T_max, eta_min=eta_min,
                         param_group_tags=param_group_tags)


class StepLR(LRScheduler, _s.StepScheduler):
    """torch's StepLR; see :class:`~.scheduler.StepScheduler`."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, step_size: int,
                 gamma: float, param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, initial_val=initial_learning_rate, step_size=step_size, gamma=gamma,
                         param_group_tags=param_group_tags)


class MultiStepLR(LRScheduler, _s.MultiStepScheduler):
    """torch's MultiStepLR; see :class:`~.scheduler.MultiStepScheduler`."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, gamma: float,
                 milestones: list[int], param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, initial_val=initial_learning_rate, gamma=gamma, milestones=milestones,
                         param_group_tags=param_group_tags)


class PiecewiseConstantLR(LRScheduler, _s.PiecewiseConstantScheduler):
    """``learning_rates[i]`` between milestones; see :class:`~.scheduler.PiecewiseConstantScheduler`."""

    def __init__(self, optimizer: torch.optim.Optimizer, learning_rates: list[float], milestones: list[int],
                 param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, constant_cls=ConstantLR, vals=learning_rates, milestones=milestones,
                         param_group_tags=param_group_tags)



class CosineAnnealingWarmRestarts(LRScheduler, _s.CosineAnnealingWarmRestartsScheduler):
    """SGDR with restarts; see :class:`~.scheduler.CosineAnnealingWarmRestartsScheduler` (vendor defect noted)."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, T_0: int, T_mult: int = 1,
                 eta_min: float = 0.0, param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, initial_val=initial_learning_rate, T_0=T_0, T_mult=T_mult, eta_min=eta_min,
                         param_group_tags=param_group_tags)


class CyclicLR(LRScheduler, _s.CyclicScheduler):
    """Cyclical learning rates; see :class:`~.scheduler.CyclicScheduler`."""

    def __init__(self, optimizer: torch.optim.Optimizer, base_lr: float, max_lr: float, step_size_up: int = 2000,
                 step_size_down: int | None = None, mode: str = "triangular", gamma: float = 1.0,
                 scale_mode: str = "cycle", param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, base_val=base_lr, max_val=max_lr, step_size_up=step_size_up,
                         step_size_down=step_size_down, mode=mode, gamma=gamma, scale_mode=scale_mode,
                         param_group_tags=param_group_tags)

    @property
    def base_lr(self) -> float:
        return self.base_val

    @property
    def max_lr(self) -> float:
        return self.max_val


class OneCycleLR(LRScheduler, _s.OneCycleScheduler):
    """1cycle; see :class:`~.scheduler.OneCycleScheduler` (vendor defect past ``total_steps`` noted)."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, max_lr: float,
                 total_steps: int = 1000, pct_start: float = 0.3, final_div_factor: float = 1e4,
                 three_phase: bool = False, anneal_strategy: str = "cos",
                 param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, initial_val=initial_learning_rate, max_val=max_lr, total_steps=total_steps,
                         pct_start=pct_start, final_div_factor=final_div_factor, three_phase=three_phase,
                         anneal_strategy=anneal_strategy, param_group_tags=param_group_tags)

    @property
    def max_lr(self) -> float:
        return self.max_val


class LambdaLR(LRScheduler, _s.LambdaScheduler):
    """``lr = initial * lr_lambda(t)``, or the vendor's default rule; see :class:`~.scheduler.LambdaScheduler`.

    Override ``set_value_lambda`` (the vendor's hook, a list of functions) or ``set_lr_lambda`` (one
    function, cs-run's older hook), or pass ``lr_lambda``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 param_group_tags: TagsT | None = None,
                 lr_lambda: Callable[[Tensor], Tensor | float] | None = None) -> None:
        if lr_lambda is None and type(self).set_lr_lambda is not LambdaLR.set_lr_lambda:
            lr_lambda = self.set_lr_lambda()
        super().__init__(optimizer, initial_val=initial_learning_rate, param_group_tags=param_group_tags,
                         value_lambda=lr_lambda)

    def set_lr_lambda(self) -> Callable[[Tensor], Tensor | float] | None:
        """cs-run's older hook: one factor function (None: the vendor's ``set_value_lambda`` rule)."""
        return None


class MultiplicativeLR(LRScheduler, _s.MultiplicativeScheduler):
    """``lr = initial * coefficient^t``; see :class:`~.scheduler.MultiplicativeScheduler`."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, coefficient: float,
                 param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, initial_val=initial_learning_rate, coefficient=coefficient,
                         param_group_tags=param_group_tags)


class SequentialLR(LRScheduler, _s.SequentialScheduler):
    """Schedulers one after the other; see :class:`~.scheduler.SequentialScheduler`."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedulers: list[LRScheduler], milestones: list[int],
                 last_epoch: int = -1, param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, schedulers=schedulers, milestones=milestones, last_epoch=last_epoch,
                         param_group_tags=param_group_tags)



class ChainedLR(LRScheduler, _s.ChainedScheduler):
    """The first scheduler's lr scaled by the others'; see :class:`~.scheduler.ChainedScheduler`."""

    def __init__(self, schedulers: list[LRScheduler], param_group_tags: TagsT | None = None,
                 optimizer: Any = None) -> None:
        schedulers = list(schedulers)
        if optimizer is not None and schedulers and schedulers[0].optimizer is not optimizer:
            raise ValueError("ChainedLR: schedulers[0] belongs to another optimizer")
        super().__init__(schedulers=schedulers, param_group_tags=param_group_tags)



ChainedScheduler = ChainedLR  # torch's name (the vendor's lr_scheduler.ChainedScheduler is ChainedLR too)
BaseChainedScheduler = _s.ChainedScheduler  # the vendor's name for the generic one in this module


class ScalePerParamLR(LRScheduler, _s.ScalePerParamScheduler):
    """Another LR scheduler's lr scaled per group; see :class:`~.scheduler.ScalePerParamScheduler`."""

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: LRScheduler,
                 param_group_tags: TagsT | None = None) -> None:
        super().__init__(optimizer, scheduler=scheduler, param_group_tags=param_group_tags)

