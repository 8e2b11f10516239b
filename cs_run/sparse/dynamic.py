"""``cstorch.sparse.DynamicSparsityAlgorithm``: masks that change on the update schedule's steps."""

from __future__ import annotations

import abc
import os
from typing import Optional

import torch

from cs_run.sparse.base import SparseParameter, SparsityAlgorithm
from cs_run.sparse.utils import make_hyperparam_schedule, make_update_schedule

__all__ = ["DropAndRegrow", "DynamicSparsityAlgorithm"]


class DynamicSparsityAlgorithm(SparsityAlgorithm, abc.ABC):
    """Counts finite optimizer steps in ``step`` (a 0-d int64 tensor) and, after each step, replaces every
    mask by :meth:`update_mask` where ``update(step)`` says so.

    The count advances only when every gradient of the optimizer is finite (a step a loss scaler skips
    changes no mask), so step ``n`` is the n-th finite optimizer step. ``update``: ``{freq, start,
    stop}`` (every freq steps from start, before stop; default every step) or ``{steps: [...]}``. A
    schedule that does not update at step 0 starts dense.
    """

    def __init__(self, sparsity=None, update=None, **kwargs) -> None:
        super().__init__(sparsity=sparsity, **kwargs)
        self.update_schedule = make_update_schedule(update)
        self.starts_sparse = bool(self.update_schedule(torch.zeros((), dtype=torch.int64)))
        self.step = torch.zeros((), dtype=torch.int64)
        self._started: set[int] = set()  # ids of the sparsity schedules moved on past the first masks

    def _initial_mask(self, param: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
        if not self.starts_sparse:
            return torch.ones_like(param, dtype=torch.bool)
        return super()._initial_mask(param, level)

    def _after_sparsify(self) -> None:
        device = next(iter(self.sparse_params.values())).param.device
        self.step = self.step.to(device)
        for schedule in self._schedules():
            schedule.to(device)
            if id(schedule) not in self._started and schedule in self._sparsity_schedules():
                # the first masks used the step-0 level; a cycling level moves on if they were sparse
                self._started.add(id(schedule))
                schedule.update(torch.tensor(self.starts_sparse, device=device))

    def _sparsity_schedules(self) -> list:
        """The sparsity schedules of this algorithm's weights, each once, in the weights' order."""
        unique: dict[int, object] = {}
        for sparse in self.sparse_params.values():
            unique.setdefault(id(sparse.schedule), sparse.schedule)
        return list(unique.values())

    def _schedules(self) -> list:
        """Every schedule with state that moves on update steps (SET and RigL add drop_fraction)."""
        return self._sparsity_schedules()

    @torch.no_grad()
    def update(self, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        finite = _finite_gradients(optimizer, self.step.device)
        self.step.add_(finite.to(torch.int64))
        due = self.update_schedule(self.step) & finite
        params = list(self.sparse_params_of(optimizer))
        levels: dict[int, torch.Tensor] = {}  # one level per schedule, reported once under its weights' prefix
        for schedule in self._sparsity_schedules():
            names = [s.name for s in params if s.schedule is schedule]
            if names:
                levels[id(schedule)] = torch.clamp(schedule(self.step), 0.0, 1.0)
                self._report_target(os.path.commonprefix(names) + "*", levels[id(schedule)])
        for sparse in params:
            if sparse.param.grad is None:  # not updated this step: its mask stays
                continue
            level = levels[id(sparse.schedule)]
            new = self.update_mask(sparse.param, sparse.mask, level, sparse)
            sparse.mask.copy_(torch.where(due, new, sparse.mask))
            self._prune_all(optimizer, sparse)
            if self._computed_sparsity_hooks:
                self._report_computed(sparse.name, 1 - sparse.mask.sum() / sparse.mask.numel())
        for schedule in self._schedules():
            schedule.update(due)
        self._end_update()

    def _end_update(self) -> None:
        """Drop what one update needed (RigL's dense gradients)."""

    @abc.abstractmethod
    def update_mask(self, p: torch.Tensor, mask: torch.Tensor, sparsity: torch.Tensor,
                    sparse: Optional[SparseParameter] = None) -> torch.Tensor:
        """The new mask of weight ``p`` (current ``mask``) at the scheduled ``sparsity``."""

    def state_dict(self) -> dict:
        """``step`` and, as the vendor keys them, ``sparsity``: each stateful sparsity schedule's state under
        the name of (the last of) its weights; SET and RigL add a stateful ``drop_fraction``'s."""
        named = {id(s.schedule): (s.name, s.schedule) for s in self.sparse_params.values()}
        levels = {name: state for name, schedule in named.values() if (state := schedule.state_dict())}
        return {"step": self.step, **({"sparsity": levels} if levels else {}), **self._extra_state()}

    def load_state_dict(self, state: dict) -> None:
        """Also reads the layout cs-run wrote before it keyed states as the vendor does: ``schedules``,
        ``"0"`` the one schedule every weight shared (``"1"`` SET's and RigL's ``drop_fraction``)."""
        self.step.copy_(torch.as_tensor(state["step"]))
        shared = state.get("schedules", {}).get("0")
        for sparse in self.sparse_params.values():
            saved = state.get("sparsity", {}).get(sparse.name) or shared
            if saved:
                sparse.schedule.load_state_dict(saved)
        self._load_extra_state(state)

    def _extra_state(self) -> dict:
        return {}

    def _load_extra_state(self, state: dict) -> None:
        return None


class DropAndRegrow(DynamicSparsityAlgorithm, abc.ABC):
    """A dynamic algorithm that drops ``drop_fraction`` of each weight's connections on an update and
    regrows as many (SET, RigL): the fraction is one more schedule, evaluated each step with the
    sparsity's and kept in the checkpoint beside them."""

    def __init__(self, drop_fraction=0.3, **kwargs) -> None:
        super().__init__(**kwargs)
        self.drop_fraction = make_hyperparam_schedule(drop_fraction)

    def _schedules(self) -> list:
        return [*self._sparsity_schedules(), self.drop_fraction]

    def _extra_state(self) -> dict:
        state = self.drop_fraction.state_dict()
        return {"drop_fraction": state} if state else {}

    def _load_extra_state(self, state: dict) -> None:
        saved = state.get("drop_fraction") or state.get("schedules", {}).get("1")
        if saved:
            self.drop_fraction.load_state_dict(saved)


def _finite_gradients(optimizer: Optional[torch.optim.Optimizer], device: torch.device) -> torch.Tensor:
    """True unless a gradient of the optimizer holds NaN or inf (what a loss scaler's overflow check reads)."""
    grads = [p.grad for group in (optimizer.param_groups if optimizer is not None else [])
             for p in group["params"] if p.grad is not None]
    if not grads:
        return torch.ones((), dtype=torch.bool, device=device)
    return torch.stack([g.isfinite().all().to(device) for g in grads]).all()
