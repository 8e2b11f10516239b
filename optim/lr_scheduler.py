"""Closed-form LR schedulers (``cs_run.optim.lr_scheduler``), the vendor's names and arguments.

Each scheduler's ``_get_closed_form_lr()`` is a tensor function of the step ``t = last_epoch``; its
phases are the numbered ``torch.where`` cases in the code. This module holds the decays; cyclic
schedules live in ``_lr_cyclic.py`` and composition in ``_lr_composite.py``; all are exported here.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._lr_base import LRScheduler
from ._lr_composite import ChainedLR, ChainedScheduler, SequentialLR
from ._lr_cyclic import (
    CosineAnnealingWarmRestarts,
    CyclicLR,
    LambdaLR,
    MultiplicativeLR,
    OneCycleLR,
)

__all__ = [
    "ChainedLR",
    "ChainedScheduler",
    "ConstantLR",
    "CosineAnnealingLR",
    # from _lr_cyclic / _lr_composite
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
    "SequentialLR",
    "StepLR",
]


class ConstantLR(LRScheduler):
    """``lr = learning_rate`` (``total_iters`` only matters inside SequentialLR).

    Note:
        Unlike torch.optim.lr_scheduler.ConstantLR (a factor applied for ``total_iters`` steps), this
        is the vendor's: a constant value.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, learning_rate: float, total_iters: int | None = None):
        self.learning_rate = float(learning_rate)
        super().__init__(optimizer, total_iters=total_iters)

    def _get_closed_form_lr(self) -> Tensor:
        return self._const(self.learning_rate)


class PolynomialLR(LRScheduler):
    """Polynomial decay from ``initial_learning_rate`` to ``end_learning_rate`` over ``total_iters``.

    ``lr = (initial - end) * (1 - t' / T')^power + end`` with, without ``cycle``, ``t' = min(t, T)`` and
    ``T' = T``; with ``cycle`` (Keras), ``t' = t`` and ``T' = T * max(1, ceil(t / T))``.
    Equals torch's PolynomialLR when ``end_learning_rate == 0``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, end_learning_rate: float,
                 total_iters: int, power: float = 1.0, cycle: bool = False):
        self.initial_learning_rate = float(initial_learning_rate)
        self.end_learning_rate = float(end_learning_rate)
        self.power = float(power)
        self.cycle = cycle
        super().__init__(optimizer, total_iters=total_iters)

    def _get_closed_form_lr(self) -> Tensor:
        t = self._step_float()
        total = float(self.total_iters)
        if self.cycle:
            period = torch.clamp(torch.ceil(t / total), min=1.0) * total
        else:
            t, period = torch.clamp(t, max=total), self._const(total)
        decay = (1 - t / period) ** self.power
        return decay * (self.initial_learning_rate - self.end_learning_rate) + self.end_learning_rate


class LinearLR(PolynomialLR):
    """Linear ramp from ``initial_learning_rate`` to ``end_learning_rate`` over ``total_iters``, then flat."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, end_learning_rate: float,
                 total_iters: int, cycle: bool = False):
        super().__init__(optimizer, initial_learning_rate, end_learning_rate, total_iters, power=1.0, cycle=cycle)


class ExponentialLR(LRScheduler):
    """``lr = initial * decay_rate^(t / total_iters)``, the exponent floored when ``staircase``.

    torch's ExponentialLR is ``total_iters=1``; ``staircase=True`` is torch's StepLR.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, total_iters: int,
                 decay_rate: float, staircase: bool = False):
        self.initial_learning_rate = float(initial_learning_rate)
        self.decay_rate = float(decay_rate)
        self.staircase = staircase
        super().__init__(optimizer, total_iters=total_iters)

    def _get_closed_form_lr(self) -> Tensor:
        power = self._step_float() / self.total_iters
        if self.staircase:
            power = torch.floor(power)
        return self._const(self.decay_rate) ** power * self.initial_learning_rate


class InverseExponentialTimeDecayLR(LRScheduler):
    """Keras' InverseTimeDecay: ``lr = initial / (1 + decay_rate * t^step_exponent / total_iters)``.

    The ratio ``t^step_exponent / total_iters`` is floored when ``staircase``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, step_exponent: float,
                 total_iters: int, decay_rate: float, staircase: bool = False):
        self.initial_learning_rate = float(initial_learning_rate)
        self.step_exponent = step_exponent
        self.decay_rate = float(decay_rate)
        self.staircase = staircase
        super().__init__(optimizer, total_iters=total_iters)

    def _get_closed_form_lr(self) -> Tensor:
        ratio = self._step_float() ** self.step_exponent / self.total_iters
        if self.staircase:
            ratio = torch.floor(ratio)
        return self.initial_learning_rate / (1 + self.decay_rate * ratio)


class InverseSquareRootDecayLR(LRScheduler):
    """``lr = initial * scale / sqrt(max(t, warmup_steps))`` (constant during the warm-up)."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float = 1.0, scale: float = 1.0,
                 warmup_steps: int = 1):
        if warmup_steps <= 0:
            raise ValueError(f"Invalid warmup_steps: {warmup_steps} (must be > 0)")
        self.initial_learning_rate = float(initial_learning_rate)
        self.scale = float(scale)
        self.warmup_steps = warmup_steps
        super().__init__(optimizer, total_iters=None)

    def _get_closed_form_lr(self) -> Tensor:
        t = torch.clamp(self._step_float(), min=float(self.warmup_steps))
        return self.scale / torch.sqrt(t) * self.initial_learning_rate


class CosineDecayLR(LRScheduler):
    """Keras' CosineDecay: half a cosine from ``initial`` to ``end`` over ``total_iters``, then ``end``.

    Equals torch's CosineAnnealingLR(T_max=total_iters, eta_min=end) up to ``total_iters``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, end_learning_rate: float,
                 total_iters: int):
        self.initial_learning_rate = float(initial_learning_rate)
        self.end_learning_rate = float(end_learning_rate)
        super().__init__(optimizer, total_iters=total_iters)

    def _get_closed_form_lr(self) -> Tensor:
        t = torch.clamp(self._step_float(), max=float(self.total_iters))
        progress = 0.5 * (1 + torch.cos(math.pi * t / self.total_iters))
        return progress * (self.initial_learning_rate - self.end_learning_rate) + self.end_learning_rate


class CosineAnnealingLR(LRScheduler):
    """SGDR's cosine without restarts: ``eta_min + (initial - eta_min) (1 + cos(pi t / T_max)) / 2``.

    Periodic past ``T_max``, like torch's CosineAnnealingLR.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, T_max: int,
                 eta_min: float = 0.0):
        if T_max <= 0:
            raise ValueError(f"Invalid T_max: {T_max} (must be > 0)")
        self.initial_learning_rate = float(initial_learning_rate)
        self.T_max = T_max
        self.eta_min = float(eta_min)
        super().__init__(optimizer, total_iters=None)

    def _get_closed_form_lr(self) -> Tensor:
        cosine = 1 + torch.cos(math.pi * self._step_float() / self.T_max)
        return self.eta_min + (self.initial_learning_rate - self.eta_min) * cosine / 2


class StepLR(LRScheduler):
    """``lr = initial * gamma^floor(t / step_size)``, torch's StepLR."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, step_size: int,
                 gamma: float = 0.1):
        if step_size <= 0:
            raise ValueError(f"Invalid step_size: {step_size} (must be > 0)")
        self.initial_learning_rate = float(initial_learning_rate)
        self.step_size = step_size
        self.gamma = float(gamma)
        super().__init__(optimizer, total_iters=None)

    def _get_closed_form_lr(self) -> Tensor:
        return self._const(self.gamma) ** torch.floor(self._step_float() / self.step_size) * self.initial_learning_rate


class MultiStepLR(LRScheduler):
    """``lr = initial * gamma^(number of milestones <= t)``, torch's MultiStepLR."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, gamma: float,
                 milestones: list[int]):
        self.initial_learning_rate = float(initial_learning_rate)
        self.gamma = float(gamma)
        self.milestones = sorted(int(m) for m in milestones)
        super().__init__(optimizer, total_iters=None)

    def _get_closed_form_lr(self) -> Tensor:
        passed = self._const(0.0)
        for milestone in self.milestones:  # a fixed loop over Python constants: static structure
            passed = passed + (self.last_epoch >= milestone).to(passed.dtype)
        return self._const(self.gamma) ** passed * self.initial_learning_rate


class PiecewiseConstantLR(LRScheduler):
    """``learning_rates[i]`` for ``milestones[i-1] <= t < milestones[i]`` (one more rate than milestones)."""

    def __init__(self, optimizer: torch.optim.Optimizer, learning_rates: list[float], milestones: list[int]):
        if len(learning_rates) != len(milestones) + 1:
            raise ValueError(f"Invalid learning_rates: {len(learning_rates)} values for {len(milestones)} "
                             "milestones (must be one more than the milestones)")
        if list(milestones) != sorted(milestones):
            raise ValueError(f"Invalid milestones: {list(milestones)} (must be increasing)")
        self.learning_rates = [float(v) for v in learning_rates]
        self.milestones = [int(m) for m in milestones]
        super().__init__(optimizer, total_iters=None)

    def _get_closed_form_lr(self) -> Tensor:
        lr = self._const(self.learning_rates[0])
        for milestone, value in zip(self.milestones, self.learning_rates[1:]):
            lr = torch.where(self.last_epoch >= milestone, self._const(value), lr)
        return lr

