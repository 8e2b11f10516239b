"""Adadelta; the vendor's rule is torch's."""

from __future__ import annotations

from typing import Any

import torch

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _decayed, _run_closure

__all__ = ["Adadelta"]


class Adadelta(Optimizer):
    """Adadelta (Zeiler, 2012).

    .. code-block:: text

        g = -grad if maximize else grad;  g = g + weight_decay * p
        v = rho * v + (1 - rho) * g * g
        delta = sqrt(u + eps) / sqrt(v + eps) * g;  u = rho * u + (1 - rho) * delta * delta
        p -= lr * delta

    Args:
        {params}
        lr: coefficient that scales delta (default: 1.0).
        rho: coefficient of the running averages (default: 0.9).
        eps: term added inside the square roots (default: 1e-6).
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
        super().__init__(params, defaults)

    def preinitialize(self) -> None:
        self._zeros_like_params("square_avg", "acc_delta")

    def state_names_to_sparsify(self) -> list[str]:
        return ["square_avg", "acc_delta"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = _run_closure(closure)
        for group in self.param_groups:
            rho, eps = group["rho"], group["eps"]
            for p, grad in self._params_with_grads(group):
                square_avg, acc_delta = self.state[p]["square_avg"], self.state[p]["acc_delta"]
                grad = _decayed(grad, p, group["weight_decay"])
                square_avg.mul_(rho).addcmul_(grad, grad, value=1 - rho)
                std = square_avg.add(eps).sqrt_()
                delta = acc_delta.add(eps).sqrt_().div_(std).mul_(grad)
                acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)
                p.add_(-group["lr"] * delta)
        return loss


Adadelta.__doc__ = _docs.fill(Adadelta.__doc__)
