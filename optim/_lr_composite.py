"""Composition as arithmetic on the step: SequentialLR shifts it, ChainedLR multiplies factors."""

from __future__ import annotations

import torch
from torch import Tensor

from ._lr_base import LRScheduler, _at_step

__all__ = ["ChainedLR", "ChainedScheduler", "SequentialLR"]


def _check_same_optimizer(kind: str, optimizer: torch.optim.Optimizer, schedulers: list[LRScheduler]) -> None:
    if not schedulers:
        raise ValueError(f"{kind} needs at least one scheduler")
    for index, scheduler in enumerate(schedulers):
        if not isinstance(scheduler, LRScheduler):
            raise TypeError(f"{kind}: schedulers[{index}] is a {type(scheduler).__name__}, "
                            "not a cs_run.optim.lr_scheduler.LRScheduler")
        if scheduler.optimizer is not optimizer:
            raise ValueError(f"{kind}: schedulers[{index}] belongs to another optimizer")


class SequentialLR(LRScheduler):
    """Scheduler ``k`` runs from ``milestones[k-1]`` on, at the shifted step ``t - milestones[k-1]``.

    Its state is one step; the children's own steps are not used. Equals torch's SequentialLR.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, schedulers: list[LRScheduler], milestones: list[int],
                 last_epoch: int = -1):
        schedulers = list(schedulers)
        _check_same_optimizer("SequentialLR", optimizer, schedulers)
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR: {len(schedulers)} schedulers need {len(schedulers) - 1} milestones, "
                             f"got {len(milestones)}")
        if list(milestones) != sorted(milestones):
            raise ValueError(f"Invalid milestones: {list(milestones)} (must be increasing)")
        self._schedulers = schedulers
        self._milestones = [int(m) for m in milestones]
        super().__init__(optimizer, total_iters=None, last_epoch=last_epoch)

    def _get_closed_form_lr(self) -> Tensor:
        with _at_step(self._schedulers[0], self.last_epoch) as first:
            lr = first._get_closed_form_lr()
        for milestone, scheduler in zip(self._milestones, self._schedulers[1:]):
            with _at_step(scheduler, self.last_epoch - milestone) as shifted:
                lr = torch.where(self.last_epoch >= milestone, shifted._get_closed_form_lr(), lr)
        return lr


class ChainedLR(LRScheduler):
    """``lr = s_0(t) * prod_i s_i(t) / s_i.initial_learning_rate``: the first sets the value, the rest scale it.

    Matches torch's ChainedScheduler for multiplicative schedules (StepLR, ExponentialLR, ...).
    """

    def __init__(self, schedulers: list[LRScheduler], optimizer: torch.optim.Optimizer | None = None):
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueError("ChainedLR needs at least one scheduler")
        optimizer = optimizer if optimizer is not None else schedulers[0].optimizer
        _check_same_optimizer("ChainedLR", optimizer, schedulers)
        for index, scheduler in enumerate(schedulers[1:], start=1):
            if not getattr(scheduler, "initial_learning_rate", 0.0):
                raise ValueError(f"ChainedLR: schedulers[{index}] ({type(scheduler).__name__}) needs a non-zero "
                                 "initial_learning_rate to act as a factor")
        self._schedulers = schedulers
        super().__init__(optimizer, total_iters=None)

    def _get_closed_form_lr(self) -> Tensor:
        lr = None
        for scheduler in self._schedulers:
            with _at_step(scheduler, self.last_epoch) as s:
                value = s._get_closed_form_lr()
            lr = value if lr is None else lr * (value / scheduler.initial_learning_rate)
        return lr


ChainedScheduler = ChainedLR  # the vendor's older name
