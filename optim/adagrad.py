"""Adagrad, as the vendor computes it (eps 1e-6, eps added to ``sqrt(sum)``)."""

from __future__ import annotations

from typing import Any

import torch

from cs_run.creation import full_like

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _decayed, _run_closure

__all__ = ["Adagrad"]


class Adagrad(Optimizer):
    """Adagrad (Duchi et al., 2011).

    .. code-block:: text

        step += 1;  g = -grad if maximize else grad;  g = g + weight_decay * p
        sum += g * g
        p -= lr * (g / (1 + (step - 1) * lr_decay)) / (sqrt(sum) + eps)

    Args:
        {params}
        lr: learning rate (default: 1e-2).
        lr_decay: learning-rate decay per step (default: 0).
        {weight_decay}
        initial_accumulator_value: starting value of ``sum`` (default: 0).
        eps: term added to the denominator (default: 1e-6, the vendor's; torch uses 1e-10).
        {maximize}

    {compliant}
    """

    def __init__(self, params: ParamsT, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-6, maximize: bool = False) -> None:
        _check("learning rate", lr)
        _check("lr_decay value", lr_decay)
        _check("weight_decay value", weight_decay)
        _check("initial_accumulator_value", initial_accumulator_value)
        _check("epsilon value", eps)
        defaults = {"lr": lr, "lr_decay": lr_decay, "eps": eps, "weight_decay": weight_decay,
                    "initial_accumulator_value": initial_accumulator_value, "maximize": maximize}
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
            for p, grad in self._params_with_grads(group):
                state_sum = self.state[p]["sum"]
                step = self.increment_global_step(p)
                grad = _decayed(grad, p, group["weight_decay"])
                state_sum.addcmul_(grad, grad, value=1.0)
                std = state_sum.sqrt().add_(group["eps"])
                grad = grad.div(1.0 + (step - 1.0) * group["lr_decay"])
                p.addcdiv_(-group["lr"] * grad, std)
        return loss


Adagrad.__doc__ = _docs.fill(Adagrad.__doc__)
