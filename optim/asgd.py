"""ASGD, as the vendor computes it (``eta`` starts at the constructor's lr)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cs_run.creation import ones, zeros_like

from . import _docs
from ._functional import decayed
from .optimizer import ParamsT, _checked_defaults, _CoreOptimizer

__all__ = ["ASGD", "asgd"]


class ASGD(_CoreOptimizer):
    """Averaged stochastic gradient descent (Polyak & Juditsky, 1992).

    .. code-block:: text

        step += 1;  g = -grad if maximize else grad;  g = g + weight_decay * p
        p *= 1 - lambd * eta;  p -= eta * g
        ax += mu * (p - ax)                         (ax = p while mu == 1)
        eta = lr / (1 + lambd * lr * step)^alpha;  mu = 1 / max(1, step - t0)

    Args:
        {params}
        lr: learning rate (default: 1e-2).
        lambd: decay term (default: 1e-4).
        alpha: power for the eta update (default: 0.75).
        t0: step at which averaging starts (default: 1e6).
        {weight_decay}
        {maximize}

    {compliant}

    Note:
        ``eta`` is the lr given at construction for the first step (the vendor's; torch reads the
        group's lr when it creates the state at the first step).
    """

    def __init__(self, params: ParamsT, lr: float = 1e-2, lambd: float = 1e-4, alpha: float = 0.75,
                 t0: float = 1e6, weight_decay: float = 0.0, maximize: bool = False) -> None:
        defaults = _checked_defaults(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay,
                                     maximize=maximize)
        super().__init__(params, defaults, enable_global_step=True)

    def preinitialize(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                scalar = {"dtype": torch.get_default_dtype(), "device": p.device}
                self.state[p]["eta"] = group["lr"].detach().to(**scalar).clone()
                self.state[p]["mu"] = ones((), **scalar)
                self.state[p]["ax"] = zeros_like(p)

    def state_names_to_sparsify(self) -> list[str]:
        return ["ax"]

    def _step_group(self, group: dict[str, Any]) -> None:
        asgd(*self._tensors(group, "ax", "eta", "mu", "step"), lr=group["lr"], lambd=group["lambd"],
             alpha=group["alpha"], t0=group["t0"], weight_decay=group["weight_decay"])


ASGD.__doc__ = _docs.fill(ASGD.__doc__)


def asgd(params: list[Tensor], grads: list[Tensor], axs: list[Tensor], etas: list[Tensor], mus: list[Tensor],
         steps: list[Tensor], *, lr: Tensor, lambd: float, alpha: float, t0: float, weight_decay: Any) -> None:
    """Functional ASGD; see :class:`ASGD`. Mutates params and state (``steps`` included) in place."""
    for p, grad, ax, eta, mu, step in zip(params, grads, axs, etas, mus, steps):
        step.add_(1)
        grad = decayed(grad, p, weight_decay)
        p.mul_(1 - lambd * eta)
        p.add_(grad * eta.neg())
        ax.copy_(torch.where(mu == 1, p, ax.add(p.sub(ax).mul(mu))))
        # lambd * lr in double, then float32, as the vendor's Python-float product is rounded
        decay = (lr.to(torch.float64) * lambd).to(step.dtype)
        eta.copy_(lr / torch.pow(1 + decay * step, torch.full_like(step, alpha)))
        mu.copy_(1 / torch.clamp(step - t0, min=1.0))
