"""Rprop (resilient backpropagation); numerically torch.optim.Rprop."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _run_closure

__all__ = ["Rprop", "rprop"]


class Rprop(Optimizer):
    """Rprop (Riedmiller & Braun, 1993), torch's variant.

    .. code-block:: text

        step += 1;  g = -grad if maximize else grad;  s = sign(g * prev)
        factor = etaplus if s > 0, etaminus if s < 0, 1 if s == 0       (torch.where, no masks)
        step_size = clamp(step_size * factor, step_size_min, step_size_max)
        g = 0 where s < 0;  p -= sign(g) * step_size;  prev = g

    Args:
        {params}
        lr: learning rate, the initial step size (default: 1e-2).
        etas: (etaminus, etaplus) multiplicative decrease and increase factors (default: (0.5, 1.2)).
        step_sizes: (min, max) allowed step sizes (default: (1e-6, 50)).
        {maximize}

    {compliant}

    Note:
        The step sizes start at the group's lr at the first step (torch fills them when it creates the
        state), so an lr set by a scheduler after construction is honoured.
    """

    def __init__(self, params: ParamsT, lr: float = 1e-2, etas: tuple[float, float] = (0.5, 1.2),
                 step_sizes: tuple[float, float] = (1e-6, 50), maximize: bool = False) -> None:
        _check("learning rate", lr)
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"Invalid eta values: {etas[0]}, {etas[1]} (must be 0 < etaminus < 1 < etaplus)")
        defaults = {"lr": lr, "etas": tuple(etas), "step_sizes": tuple(step_sizes), "maximize": maximize}
        super().__init__(params, defaults, enable_global_step=True)

    def preinitialize(self) -> None:
        self._zeros_like_params("prev", "step_size")

    def state_names_to_sparsify(self) -> list[str]:
        return ["prev", "step_size"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = _run_closure(closure)
        for group in self.param_groups:
            params, grads, steps, prevs, step_sizes = self._group_tensors(group, "step", "prev", "step_size")
            etaminus, etaplus = group["etas"]
            step_size_min, step_size_max = group["step_sizes"]
            rprop(params, grads, prevs, step_sizes, steps, lr=group["lr"], etaminus=etaminus,
                  etaplus=etaplus, step_size_min=step_size_min, step_size_max=step_size_max,
                  maximize=group["maximize"])
        return loss


Rprop.__doc__ = _docs.fill(Rprop.__doc__)


def rprop(params: list[Tensor], grads: list[Tensor], prevs: list[Tensor], step_sizes: list[Tensor],
          steps: list[Tensor], *, lr: Tensor, etaminus: float, etaplus: float, step_size_min: float,
          step_size_max: float, maximize: bool) -> None:
    """Functional Rprop; see :class:`Rprop`. Single-tensor only (not on a hot path)."""
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        steps[i].add_(1)
        step_size = step_sizes[i]
        step_size.copy_(torch.where(steps[i] == 1, lr.to(step_size.dtype), step_size))
        sign = grad.mul(prevs[i]).sign()
        # the ones tensor sets the dtype: two Python floats would round etas to float32
        factor = torch.where(sign > 0, etaplus, torch.where(sign < 0, etaminus, torch.ones_like(step_size)))
        step_size.mul_(factor).clamp_(step_size_min, step_size_max)
        grad = torch.where(sign < 0, torch.zeros_like(grad), grad)
        param.addcmul_(grad.sign(), step_size, value=-1)
        prevs[i].copy_(grad)
