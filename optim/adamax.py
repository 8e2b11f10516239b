"""Adamax (Adam with the infinity norm); numerically torch.optim.Adamax."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _check_betas, _run_closure, _scalar, _weight_decay

__all__ = ["Adamax", "adamax"]


class Adamax(Optimizer):
    """Adamax (Kingma & Ba, 2014, section 7).

    .. code-block:: text

        step += 1;  g = -grad if maximize else grad;  g += weight_decay * p
        m = lerp(m, g, 1 - beta1);  u = max(beta2 * u, |g| + eps)
        p -= lr / (1 - beta1^step) * m / u

    Args:
        {params}
        lr: learning rate (default: 2e-3).
        betas: coefficients of the running average and the infinity norm (default: (0.9, 0.999)).
        eps: term added to the denominator (default: 1e-8).
        {weight_decay}
        {maximize}

    {compliant}
    """

    def __init__(self, params: ParamsT, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, maximize: bool = False) -> None:
        _check("learning rate", lr)
        _check_betas(betas)
        _check("epsilon value", eps)
        _check("weight_decay value", weight_decay)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "maximize": maximize}
        super().__init__(params, defaults, enable_global_step=True)

    def preinitialize(self) -> None:
        self._zeros_like_params("exp_avg", "exp_inf")

    def state_names_to_sparsify(self) -> list[str]:
        return ["exp_avg", "exp_inf"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = _run_closure(closure)
        for group in self.param_groups:
            params, grads, steps, exp_avgs, exp_infs = self._group_tensors(group, "step", "exp_avg", "exp_inf")
            beta1, beta2 = group["betas"]
            adamax(params, grads, exp_avgs, exp_infs, steps, lr=group["lr"], beta1=beta1, beta2=beta2,
                   eps=group["eps"], weight_decay=group["weight_decay"], maximize=group["maximize"])
        return loss


Adamax.__doc__ = _docs.fill(Adamax.__doc__)


def adamax(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_infs: list[Tensor],
           steps: list[Tensor], *, lr: Tensor, beta1: float, beta2: float, eps: float, weight_decay: float,
           maximize: bool) -> None:
    """Functional Adamax; see :class:`Adamax`. Single-tensor only: Adamax is not on a hot path."""
    _single_tensor_adamax(params, grads, exp_avgs, exp_infs, steps, lr=lr, beta1=beta1, beta2=beta2,
                          eps=eps, weight_decay=weight_decay, maximize=maximize)


def _single_tensor_adamax(params, grads, exp_avgs, exp_infs, steps, *, lr, beta1, beta2, eps,
                          weight_decay, maximize) -> None:
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        steps[i].add_(1)
        grad = _weight_decay(param, grad, lr=lr, weight_decay=weight_decay)
        exp_avgs[i].lerp_(grad, 1 - beta1)
        torch.maximum(exp_infs[i].mul_(beta2), grad.abs().add_(eps), out=exp_infs[i])
        neg_clr = (_scalar(lr) / (1 - beta1 ** _scalar(steps[i])) * -1).to(param.dtype)
        param.addcdiv_(exp_avgs[i].mul(neg_clr), exp_infs[i])
