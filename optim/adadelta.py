"""Adadelta; numerically torch.optim.Adadelta."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _run_closure, _weight_decay

__all__ = ["Adadelta", "adadelta"]


class Adadelta(Optimizer):
    """Adadelta (Zeiler, 2012).

    .. code-block:: text

        g = -grad if maximize else grad;  g += weight_decay * p
        v = rho * v + (1 - rho) * g * g
        delta = sqrt(u + eps) / sqrt(v + eps) * g
        u = rho * u + (1 - rho) * delta * delta
        p -= lr * delta

    Args:
        {params}
        lr: coefficient that scales delta (default: 1.0).
        rho: coefficient of the running averages (default: 0.9).
        eps: term added to the denominator (default: 1e-6).
        {weight_decay}
        {maximize}

    {compliant}
    """

    def __init__(self, params: ParamsT, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0.0, maximize: bool = False) -> None:
        _check("learning rate", lr)
        _check("rho value", rho, 0.0, 1.0, high_open=False)
        _check("epsilon value", eps)
        _check("weight_decay value", weight_decay)
        defaults = {"lr": lr, "rho": rho, "eps": eps, "weight_decay": weight_decay, "maximize": maximize}
        super().__init__(params, defaults, enable_global_step=True)

    def preinitialize(self) -> None:
        self._zeros_like_params("square_avg", "acc_delta")

    def state_names_to_sparsify(self) -> list[str]:
        return ["square_avg", "acc_delta"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = _run_closure(closure)
        for group in self.param_groups:
            params, grads, steps, sq, acc = self._group_tensors(group, "step", "square_avg", "acc_delta")
            adadelta(params, grads, sq, acc, steps, lr=group["lr"], rho=group["rho"], eps=group["eps"],
                     weight_decay=group["weight_decay"], maximize=group["maximize"])
        return loss


Adadelta.__doc__ = _docs.fill(Adadelta.__doc__)


def adadelta(params: list[Tensor], grads: list[Tensor], square_avgs: list[Tensor], acc_deltas: list[Tensor],
             steps: list[Tensor], *, lr: Tensor, rho: float, eps: float, weight_decay: float,
             maximize: bool) -> None:
    """Functional Adadelta; see :class:`Adadelta`. Single-tensor only (not on a hot path)."""
    neg_lr = lr.neg()
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        steps[i].add_(1)
        grad = _weight_decay(param, grad, lr=lr, weight_decay=weight_decay)
        square_avgs[i].mul_(rho).addcmul_(grad, grad, value=1 - rho)
        std = square_avgs[i].add(eps).sqrt_()
        delta = acc_deltas[i].add(eps).sqrt_().div_(std).mul_(grad)
        acc_deltas[i].mul_(rho).addcmul_(delta, delta, value=1 - rho)
        param.addcmul_(delta, neg_lr)
