"""Adagrad; numerically torch.optim.Adagrad (dense gradients)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cs_run.creation import full_like

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _run_closure, _scalar, _weight_decay

__all__ = ["Adagrad", "adagrad"]


class Adagrad(Optimizer):
    """Adagrad (Duchi et al., 2011).

    .. code-block:: text

        step += 1;  g = -grad if maximize else grad;  g += weight_decay * p
        clr = lr / (1 + (step - 1) * lr_decay)
        sum += g * g;  p -= clr * g / (sqrt(sum) + eps)

    Args:
        {params}
        lr: learning rate (default: 1e-2).
        lr_decay: learning rate decay (default: 0).
        {weight_decay}
        initial_accumulator_value: initial value of the sum of squares (default: 0).
        eps: term added to the denominator (default: 1e-10).
        {maximize}

    {compliant}

    Note:
        Sparse gradients are not supported (their update depends on which indices are present).
    """

    def __init__(self, params: ParamsT, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10, maximize: bool = False) -> None:
        _check("learning rate", lr)
        _check("lr_decay value", lr_decay)
        _check("weight_decay value", weight_decay)
        _check("initial_accumulator_value", initial_accumulator_value)
        _check("epsilon value", eps)
        defaults = {"lr": lr, "lr_decay": lr_decay, "weight_decay": weight_decay, "eps": eps, "maximize": maximize,
                        "initial_accumulator_value": initial_accumulator_value}
        super().__init__(params, defaults, enable_global_step=True)

    def preinitialize(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["sum"] = full_like(p, group["initial_accumulator_value"])

    def state_names_to_sparsify(self) -> list[str]:
        return ["sum"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = _run_closure(closure)
        for group in self.param_groups:
            params, grads, steps, sums = self._group_tensors(group, "step", "sum")
            adagrad(params, grads, sums, steps, lr=group["lr"], lr_decay=group["lr_decay"],
                    weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"])
        return loss


Adagrad.__doc__ = _docs.fill(Adagrad.__doc__)


def adagrad(params: list[Tensor], grads: list[Tensor], sums: list[Tensor], steps: list[Tensor], *,
            lr: Tensor, lr_decay: float, weight_decay: float, eps: float, maximize: bool) -> None:
    """Functional Adagrad; see :class:`Adagrad`. Single-tensor only (not on a hot path)."""
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        steps[i].add_(1)
        grad = _weight_decay(param, grad, lr=lr, weight_decay=weight_decay)
        neg_clr = (_scalar(lr) / (1 + (_scalar(steps[i]) - 1) * lr_decay) * -1).to(param.dtype)
        sums[i].addcmul_(grad, grad, value=1)
        param.addcdiv_(grad.mul(neg_clr), sums[i].sqrt().add_(eps))
