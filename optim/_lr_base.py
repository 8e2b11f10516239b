"""The closed-form LR scheduler base: the lr is a tensor function of a step tensor.

torch's schedulers are chainable (each step multiplies ``group['lr']`` by a factor computed in Python),
which bakes a new Python number into every traced step. Here ``step()`` adds 1 to the tensor
``last_epoch``, evaluates ``_get_closed_form_lr()`` with torch ops and copies the result into each
group's lr tensor in place, so one captured graph serves every step (DESIGN §6, STYLE §2.3).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from cs_run.creation import full

from .optimizer import _scalar_dtype

__all__ = ["LRScheduler"]


class LRScheduler(abc.ABC):
    """Base of the compliant LR schedulers.

    Subclasses set their hyper-parameters, call ``super().__init__(optimizer, total_iters=...,
    last_epoch=...)`` and implement ``_get_closed_form_lr()`` (the newer vendor name
    ``_get_closed_form`` works too): the lr at step ``self.last_epoch`` (an int64 tensor) computed
    with torch ops only, e.g. phases selected with ``torch.where``.

    Like torch, construction already applies the lr of step ``last_epoch + 1`` (0 by default); call
    ``step()`` after each ``optimizer.step()``.

    Args:
        optimizer: the optimizer whose ``param_group['lr']`` tensors are scheduled.
        total_iters: number of steps the schedule lasts (used by SequentialLR and some schedules).
        last_epoch: the step before the first one; -1 starts from scratch.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_get_closed_form" in cls.__dict__ and "_get_closed_form_lr" not in cls.__dict__:
            cls._get_closed_form_lr = cls.__dict__["_get_closed_form"]  # type: ignore[attr-defined]

    def __init__(self, optimizer: torch.optim.Optimizer, total_iters: int | None = None,
                 last_epoch: int = -1) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"{type(self).__name__} needs a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if total_iters is not None and total_iters <= 0:
            raise ValueError(f"Invalid total_iters: {total_iters} (must be > 0)")
        self.optimizer = optimizer
        self.total_iters = total_iters
        for group in optimizer.param_groups:  # a torch.optim optimizer may hold a Python float
            if not isinstance(group["lr"], Tensor):
                group["lr"] = torch.tensor(float(group["lr"]))
        device = optimizer.param_groups[0]["lr"].device if optimizer.param_groups else torch.device("cpu")
        self.last_epoch = full((), int(last_epoch), dtype=torch.int64, device=device)
        self.step()

    @abc.abstractmethod
    def _get_closed_form_lr(self) -> Tensor:
        """The lr at step ``self.last_epoch`` as a 0-d tensor, with torch ops only."""

    def _get_closed_form(self) -> Tensor:
        """Alias of :meth:`_get_closed_form_lr` (the vendor's newer name)."""
        return self._get_closed_form_lr()

    # -- helpers for subclasses ---------------------------------------------------------------
    @property
    def _dtype(self) -> torch.dtype:
        return _scalar_dtype(self.last_epoch.device)

    def _step_float(self) -> Tensor:
        """The step as a float tensor (float64 where the device has it)."""
        return self.last_epoch.to(self._dtype)

    def _const(self, value: float) -> Tensor:
        """A 0-d constant made inside the step (an ``aten.full`` node, not a captured tensor)."""
        return torch.full((), float(value), dtype=self._dtype, device=self.last_epoch.device)

    # -- the public protocol ------------------------------------------------------------------
    def step(self, epoch: int | None = None) -> None:
        """Advance one step (or jump to ``epoch``) and write the new lr into every group in place."""
        if epoch is None:
            self.last_epoch.add_(1)
        else:
            self.last_epoch.fill_(int(epoch))
        self._apply_lr(self._get_closed_form_lr())

    def _apply_lr(self, lr: Tensor) -> None:
        for group in self.optimizer.param_groups:
            group["lr"].copy_(lr)

    def get_lr(self) -> list[Tensor]:
        """The lr of the current step for every group (computed, not read from the groups)."""
        lr = self._get_closed_form_lr()
        return [lr for _ in self.optimizer.param_groups]

    def get_last_lr(self) -> list[Tensor]:
        """Copies of the groups' current lr tensors (read their values in a step closure on CSX)."""
        return [group["lr"].detach().clone() for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """Just the step: every other attribute is a hyper-parameter from the constructor."""
        return {"last_epoch": self.last_epoch.detach().clone()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Copy the step in place (a traced step keeps its input) and reapply its lr.

        Accepts torch.optim.lr_scheduler state dicts too (only ``last_epoch`` is read).
        """
        value = state_dict["last_epoch"]
        with torch.no_grad():
            if isinstance(value, Tensor):
                self.last_epoch.copy_(value)
            else:
                self.last_epoch.fill_(int(value))
        self._apply_lr(self._get_closed_form_lr())


@contextlib.contextmanager
def _at_step(scheduler: LRScheduler, step: Tensor) -> Iterator[LRScheduler]:
    """Evaluate ``scheduler`` at another step tensor (composition), restoring its own afterwards."""
    own = scheduler.last_epoch
    scheduler.last_epoch = step
    try:
        yield scheduler
    finally:
        scheduler.last_epoch = own
