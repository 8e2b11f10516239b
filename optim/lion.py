"""Lion (evolved sign momentum), as the vendor computes it."""

from __future__ import annotations

from typing import Any

import torch

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _check_betas, _run_closure

__all__ = ["Lion"]


class Lion(Optimizer):
    """Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2).

    .. code-block:: text

        g = -grad if maximize else grad
        p *= 1 - lr * weight_decay
        p -= lr * sign(beta1 * m + (1 - beta1) * g)
        m = beta2 * m + (1 - beta2) * g

    Args:
        {params}
        lr: learning rate (default: 1e-4).
        betas: interpolation for the update and for the momentum (default: (0.9, 0.99)).
        weight_decay: decoupled weight decay (default: 0).
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
            lr = group["lr"]
            beta1, beta2 = group["betas"]
            for p, grad in self._params_with_grads(group):
                exp_avg = self.state[p]["exp_avg"]
                p.mul_(1 - lr * group["weight_decay"])
                update = exp_avg.clone().mul_(beta1).add(grad, alpha=1 - beta1).sign_()
                p.add_(-lr * update)
                exp_avg.mul_(beta2).add_(grad, alpha=1 - beta2)
        return loss


Lion.__doc__ = _docs.fill(Lion.__doc__)
