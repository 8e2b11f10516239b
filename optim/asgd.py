"""Averaged SGD; numerically torch.optim.ASGD."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cs_run.creation import full, ones, zeros_like

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _run_closure, _scalar, _weight_decay

__all__ = ["ASGD", "asgd"]


class ASGD(Optimizer):
    """Averaged stochastic gradient descent (Polyak & Juditsky, 1992).

    .. code-block:: text

        step += 1;  g = -grad if maximize else grad;  g += weight_decay * p
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
        ``eta`` starts as the group's lr at the first step (torch reads it when it creates the state),
        so an lr set by a scheduler after construction is honoured.
    """

    def __init__(self, params: ParamsT, lr: float = 1e-2, lambd: float = 1e-4, alpha: float = 0.75,
                 t0: float = 1e6, weight_decay: float = 0.0, maximize: bool = False) -> None:
        _check("learning rate", lr)
        _check("lambd value", lambd)
        _check("alpha value", alpha)
        _check("weight_decay value", weight_decay)
        defaults = {"lr": lr, "lambd": lambd, "alpha": alpha, "t0": t0, "weight_decay": weight_decay, "maximize": maximize}
        super().__init__(params, defaults, enable_global_step=True)

    def preinitialize(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                scalar = {"dtype": self.state[p]["step"].dtype, "device": p.device}
                self.state[p]["eta"] = full((), 0.0, **scalar)
                self.state[p]["mu"] = ones((), **scalar)
                self.state[p]["ax"] = zeros_like(p)

    def state_names_to_sparsify(self) -> list[str]:
        return ["ax"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = _run_closure(closure)
        for group in self.param_groups:
            params, grads, steps, etas, mus, axs = self._group_tensors(group, "step", "eta", "mu", "ax")
            asgd(params, grads, axs, mus, etas, steps, lr=group["lr"], lambd=group["lambd"],
                 alpha=group["alpha"], t0=group["t0"], weight_decay=group["weight_decay"],
                 maximize=group["maximize"])
        return loss


ASGD.__doc__ = _docs.fill(ASGD.__doc__)


def asgd(params: list[Tensor], grads: list[Tensor], axs: list[Tensor], mus: list[Tensor], etas: list[Tensor],
         steps: list[Tensor], *, lr: Tensor, lambd: float, alpha: float, t0: float, weight_decay: float,
         maximize: bool) -> None:
    """Functional ASGD; see :class:`ASGD`. Single-tensor only (not on a hot path)."""
    lr64 = _scalar(lr)
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        steps[i].add_(1)
        grad = _weight_decay(param, grad, lr=lr, weight_decay=weight_decay)
        # first step: eta is the lr, stored in the state's dtype as torch does
        eta = _scalar(torch.where(steps[i] == 1, lr.to(etas[i].dtype), etas[i]))
        param.mul_((1 - lambd * eta).to(param.dtype))
        param.addcmul_(grad, eta.neg().to(param.dtype))
        mu = mus[i].to(param.dtype)
        axs[i].copy_(torch.where(mu == 1, param, axs[i].add(param.sub(axs[i]).mul_(mu))))
        step64 = _scalar(steps[i])
        etas[i].copy_(lr64 / ((1 + lambd * lr64 * step64) ** alpha))
        mus[i].copy_(1 / torch.clamp(step64 - t0, min=1))
