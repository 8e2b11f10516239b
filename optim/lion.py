"""Lion (EvoLved Sign Momentum); checked against the paper's algorithm in the tests."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import _docs
from .optimizer import (
    Optimizer,
    ParamsT,
    _check,
    _check_betas,
    _foreach_ok,
    _run_closure,
)

__all__ = ["Lion", "lion"]


class Lion(Optimizer):
    """Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2).

    .. code-block:: text

        g = -grad if maximize else grad
        c = beta1 * m + (1 - beta1) * g
        p = p - lr * (sign(c) + weight_decay * p)
        m = beta2 * m + (1 - beta2) * g

    Args:
        {params}
        lr: learning rate (default: 1e-4; Lion wants 3-10x smaller than AdamW).
        betas: interpolation factors for the update and the momentum (default: (0.9, 0.99)).
        weight_decay: decoupled weight decay (default: 0; use 3-10x AdamW's).
        {maximize}

    {compliant}
    """

    def __init__(self, params: ParamsT, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, maximize: bool = False) -> None:
        _check("learning rate", lr)
        _check_betas(betas)
        _check("weight_decay value", weight_decay)
        defaults = {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay, "maximize": maximize}
        super().__init__(params, defaults)

    def preinitialize(self) -> None:
        self._zeros_like_params("exp_avg")

    def state_names_to_sparsify(self) -> list[str]:
        return ["exp_avg"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = _run_closure(closure)
        for group in self.param_groups:
            params, grads, exp_avgs = self._group_tensors(group, "exp_avg")
            beta1, beta2 = group["betas"]
            lion(params, grads, exp_avgs, lr=group["lr"], beta1=beta1, beta2=beta2,
                 weight_decay=group["weight_decay"], maximize=group["maximize"])
        return loss


Lion.__doc__ = _docs.fill(Lion.__doc__)


def lion(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], *, lr: Tensor, beta1: float,
         beta2: float, weight_decay: float, maximize: bool, foreach: bool | None = None) -> None:
    """Functional Lion; see :class:`Lion`. Mutates params and exp_avgs in place."""
    if not params:
        return
    use_foreach = _foreach_ok(params) if foreach is None else foreach
    impl = _foreach_lion if use_foreach else _single_tensor_lion
    impl(params, grads, exp_avgs, lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay,
         maximize=maximize)


def _single_tensor_lion(params, grads, exp_avgs, *, lr, beta1, beta2, weight_decay, maximize) -> None:
    neg_lr = lr.neg()
    for param, grad, exp_avg in zip(params, grads, exp_avgs):
        grad = grad if not maximize else -grad
        if weight_decay != 0:
            param.mul_(1 - lr * weight_decay)
        param.addcmul_(exp_avg.lerp(grad, 1 - beta1).sign_(), neg_lr)
        exp_avg.lerp_(grad, 1 - beta2)


def _foreach_lion(params, grads, exp_avgs, *, lr, beta1, beta2, weight_decay, maximize) -> None:
    if maximize:
        grads = torch._foreach_neg(grads)
    if weight_decay != 0:
        torch._foreach_mul_(params, 1 - lr * weight_decay)
    updates = [exp_avg.lerp(grad, 1 - beta1) for exp_avg, grad in zip(exp_avgs, grads)]
    torch._foreach_sign_(updates)
    torch._foreach_addcmul_(params, updates, [lr.neg()] * len(params))
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta2)
