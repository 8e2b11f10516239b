"""Closed-form cyclic and user-defined schedules: warm restarts, CyclicLR, OneCycleLR, Lambda, Multiplicative."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ._lr_base import LRScheduler

__all__ = ["CosineAnnealingWarmRestarts", "CyclicLR", "LambdaLR", "MultiplicativeLR", "OneCycleLR"]


class CosineAnnealingWarmRestarts(LRScheduler):
    """SGDR: cosine from ``initial`` to ``eta_min`` over periods ``T_0, T_0 T_mult, T_0 T_mult^2, ...``.

    Period ``n`` starts at ``s_n = T_0 (T_mult^n - 1) / (T_mult - 1)`` (``n T_0`` when ``T_mult == 1``);
    ``lr = eta_min + (initial - eta_min) (1 + cos(pi (t - s_n) / (T_0 T_mult^n))) / 2``. Equals torch's.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, T_0: int, T_mult: int = 1,
                 eta_min: float = 0.0):
        if T_0 <= 0 or int(T_0) != T_0:
            raise ValueError(f"Invalid T_0: {T_0} (must be a positive integer)")
        if T_mult < 1 or int(T_mult) != T_mult:
            raise ValueError(f"Invalid T_mult: {T_mult} (must be an integer >= 1)")
        self.initial_learning_rate = float(initial_learning_rate)
        self.T_0, self.T_mult, self.eta_min = int(T_0), int(T_mult), float(eta_min)
        super().__init__(optimizer, total_iters=None)

    def _period_start(self, n: Tensor) -> Tensor:
        return self.T_0 * (self.T_mult**n - 1) / (self.T_mult - 1)

    def _get_closed_form_lr(self) -> Tensor:
        t = self._step_float()
        if self.T_mult == 1:
            t_cur, t_i = torch.remainder(t, self.T_0), self._const(self.T_0)
        else:
            n = torch.floor(torch.log(t / self.T_0 * (self.T_mult - 1) + 1) / math.log(self.T_mult))
            # log rounding can put n one off at a period boundary: correct it with exact integers
            n = torch.where(self._period_start(n + 1) <= t, n + 1, n)
            n = torch.where(self._period_start(n) > t, n - 1, n)
            t_cur, t_i = t - self._period_start(n), self.T_0 * self._const(self.T_mult) ** n
        cosine = 1 + torch.cos(math.pi * t_cur / t_i)
        return self.eta_min + (self.initial_learning_rate - self.eta_min) * cosine / 2


class CyclicLR(LRScheduler):
    """Cyclical learning rates (Smith, 2017): triangles between ``base_lr`` and ``max_lr``.

    ``mode`` is 'triangular' (constant amplitude), 'triangular2' (halved every cycle) or 'exp_range'
    (scaled by ``gamma^t``); ``scale_mode`` defaults to the mode's ('cycle', or 'iterations' for
    exp_range). Equals torch's CyclicLR with ``cycle_momentum=False``.
    """

    _MODES = ("triangular", "triangular2", "exp_range")

    def __init__(self, optimizer: torch.optim.Optimizer, base_lr: float, max_lr: float, step_size_up: int = 2000,
                 step_size_down: int | None = None, mode: str = "triangular", gamma: float = 1.0,
                 scale_mode: str | None = None):
        if mode not in self._MODES:
            raise ValueError(f"Invalid mode: {mode!r} (must be one of {', '.join(self._MODES)})")
        if scale_mode not in (None, "cycle", "iterations"):
            raise ValueError(f"Invalid scale_mode: {scale_mode!r} (must be 'cycle' or 'iterations')")
        self.base_lr, self.max_lr = float(base_lr), float(max_lr)
        self.initial_learning_rate = self.base_lr  # the factor ChainedLR divides by
        self.step_size_up = float(step_size_up)
        self.step_size_down = float(step_size_down) if step_size_down is not None else self.step_size_up
        self.mode, self.gamma = mode, float(gamma)
        self.scale_mode = scale_mode or ("iterations" if mode == "exp_range" else "cycle")
        super().__init__(optimizer, total_iters=None)

    def _scale(self, x: Tensor) -> Tensor:
        if self.mode == "triangular":
            return torch.ones_like(x)
        if self.mode == "triangular2":
            return 1 / (2.0 ** (x - 1))
        return self._const(self.gamma) ** x

    def _get_closed_form_lr(self) -> Tensor:
        t = self._step_float()
        total = self.step_size_up + self.step_size_down
        ratio = self.step_size_up / total
        cycle = torch.floor(1 + t / total)
        x = 1.0 + t / total - cycle
        # 1. rising edge: x / ratio; 2. falling edge: (x - 1) / (ratio - 1)
        factor = torch.where(x <= ratio, x / ratio, (x - 1) / (ratio - 1))
        height = (self.max_lr - self.base_lr) * factor
        return self.base_lr + height * self._scale(cycle if self.scale_mode == "cycle" else t)


class OneCycleLR(LRScheduler):
    """1cycle (Smith & Topin, 2018): ``initial -> max_lr -> initial / final_div_factor`` over ``total_steps``.

    Phases end at ``pct_start * total_steps - 1`` and ``total_steps - 1`` (three-phase: also
    ``2 pct_start total_steps - 2``), annealed by cosine or linearly. Equals torch's OneCycleLR with
    ``div_factor = max_lr / initial_learning_rate`` and ``cycle_momentum=False``; past ``total_steps``
    the last phase is held at its end value (torch raises there).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, max_lr: float,
                 total_steps: int = 1000, pct_start: float = 0.3, final_div_factor: float = 1e4,
                 three_phase: bool = False, anneal_strategy: str = "cos"):
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"Invalid anneal_strategy: {anneal_strategy!r} (must be 'cos' or 'linear')")
        if not 0 < pct_start < 1:
            raise ValueError(f"Invalid pct_start: {pct_start} (must be in (0, 1))")
        self.initial_learning_rate, self.max_lr = float(initial_learning_rate), float(max_lr)
        self.total_steps, self.pct_start = int(total_steps), float(pct_start)
        self.final_div_factor, self.three_phase = float(final_div_factor), three_phase
        self.anneal_strategy = anneal_strategy
        super().__init__(optimizer, total_iters=None)

    def _phases(self) -> list[tuple[float, float, float]]:
        """(end_step, start_lr, end_lr) of each phase, as torch defines them."""
        init, peak = self.initial_learning_rate, self.max_lr
        low = init / self.final_div_factor
        up_end = self.pct_start * self.total_steps - 1
        if self.three_phase:
            return [(up_end, init, peak), (2 * self.pct_start * self.total_steps - 2, peak, init),
                    (self.total_steps - 1, init, low)]
        return [(up_end, init, peak), (self.total_steps - 1, peak, low)]

    def _anneal(self, start: float, end: float, pct: Tensor) -> Tensor:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (torch.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _get_closed_form_lr(self) -> Tensor:
        t = self._step_float()
        phases, lrs, begin = self._phases(), [], 0.0
        for end_step, start_lr, end_lr in phases:
            pct = torch.clamp((t - begin) / (end_step - begin), max=1.0)
            lrs.append(self._anneal(start_lr, end_lr, pct))
            begin = end_step
        lr = lrs[-1]
        for (end_step, _, _), phase_lr in reversed(list(zip(phases[:-1], lrs[:-1]))):
            lr = torch.where(t <= end_step, phase_lr, lr)  # the first phase whose end is not passed
        return lr


class LambdaLR(LRScheduler):
    """``lr = initial * lr_lambda(t)``; ``lr_lambda`` maps the step (a float64 0-d tensor) to a factor.

    Pass ``lr_lambda`` or override :meth:`set_lr_lambda` (the vendor's hook). Python branching on
    ``t`` inside the lambda is not allowed (the step is a tensor); use ``torch.where``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 lr_lambda: Callable[[Tensor], Tensor | float] | None = None):
        self.initial_learning_rate = float(initial_learning_rate)
        self._lr_lambda = lr_lambda
        super().__init__(optimizer, total_iters=None)

    def set_lr_lambda(self) -> Callable[[Tensor], Tensor | float]:
        """The factor function; the default returns the ``lr_lambda`` given to the constructor."""
        if self._lr_lambda is None:
            raise ValueError(f"{type(self).__name__} needs lr_lambda (or a subclass overriding set_lr_lambda)")
        return self._lr_lambda

    def _get_closed_form_lr(self) -> Tensor:
        factor = self.set_lr_lambda()(self._step_float())
        return torch.as_tensor(factor, device=self.last_epoch.device).to(self._dtype) * self.initial_learning_rate


class MultiplicativeLR(LRScheduler):
    """``lr = initial * coefficient^t``: torch's MultiplicativeLR with a constant factor, in closed form."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, coefficient: float):
        self.initial_learning_rate = float(initial_learning_rate)
        self.coefficient = float(coefficient)
        super().__init__(optimizer, total_iters=None)

    def _get_closed_form_lr(self) -> Tensor:
        return self._const(self.coefficient) ** self._step_float() * self.initial_learning_rate
