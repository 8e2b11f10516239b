"""Rprop, as the vendor computes it: the step sizes start at lr and every sign change masks the step."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cs_run.creation import zeros_like

from . import _docs
from .optimizer import ParamsT, _check, _CoreOptimizer

__all__ = ["Rprop", "rprop"]


class Rprop(_CoreOptimizer):
    """Resilient backpropagation (Riedmiller & Braun, 1993).

    .. code-block:: text

        g = -grad if maximize else grad;  s = g * prev
        factor = etaplus (s > 0) | etaminus (s < 0) | 1 (s == 0)
        step_size = clamp(step_size * factor, step_size_min, step_size_max)
        g = 0 where factor == etaminus;  p -= sign(g) * step_size;  prev = g

    Args:
        {params}
        lr: initial step size (default: 1e-3, the vendor's; torch uses 1e-2).
        etas: (etaminus, etaplus) factors (default: (0.5, 1.2)).
        step_sizes: (minimal, maximal) step size (default: (1e-6, 50)).
        {maximize}

    {compliant}

    Note:
        The rule is torch's; the state is the vendor's: ``prev`` and ``step_size`` (starting at lr),
        no ``step``.
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, etas: tuple[float, float] = (0.5, 1.2),
                 step_sizes: tuple[float, float] = (1e-6, 50.0), maximize: bool = False) -> None:
        _check("learning rate", lr)
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"Invalid eta values: {etas[0]}, {etas[1]} (must be 0 < etaminus < 1 < etaplus)")
        defaults = {"lr": lr, "etas": tuple(etas), "step_sizes": tuple(step_sizes), "maximize": maximize}
        super().__init__(params, defaults)

    def preinitialize(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["prev"] = zeros_like(p)
                self.state[p]["step_size"] = zeros_like(p).copy_(group["lr"])

    def state_names_to_sparsify(self) -> list[str]:
        return ["prev", "step_size"]

    def _step_group(self, group: dict[str, Any]) -> None:
        (etaminus, etaplus), (step_size_min, step_size_max) = group["etas"], group["step_sizes"]
        rprop(*self._tensors(group, "prev", "step_size"), etaminus=etaminus, etaplus=etaplus,
              step_size_min=step_size_min, step_size_max=step_size_max)


Rprop.__doc__ = _docs.fill(Rprop.__doc__)


def rprop(params: list[Tensor], grads: list[Tensor], prevs: list[Tensor], step_sizes: list[Tensor], *,
          etaminus: float, etaplus: float, step_size_min: float, step_size_max: float) -> None:
    """Functional Rprop (torch.optim's signature, less its ``state_steps``); see :class:`Rprop`. Mutates
    params and state in place."""
    for p, grad, prev, step_size in zip(params, grads, prevs, step_sizes):
        grad = grad.clone()
        # the etas as the vendor holds them: float32 tensors (also for float64 params)
        minus = torch.full((), etaminus, dtype=torch.float32, device=p.device)
        plus = torch.full((), etaplus, dtype=torch.float32, device=p.device)
        product = grad.mul(prev)
        factor = torch.where(product > 0, plus, torch.where(product < 0, minus, 1.0)).to(p.dtype)
        step_size.mul_(factor).clamp_(min=step_size_min, max=step_size_max)
        grad.mul_((factor != minus).to(p.dtype))
        p.sub_(torch.sign(grad).mul_(step_size))
        prev.copy_(grad)
