"""RMSprop, as the vendor computes it (eps outside the square root, torch's placement)."""

from __future__ import annotations

from typing import Any

import torch

from cs_run.creation import zeros_like

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _decayed, _run_closure

__all__ = ["RMSprop"]


class RMSprop(Optimizer):
    """RMSprop (Hinton's lecture 6e), optionally centered and with momentum.

    .. code-block:: text

        g = -grad if maximize else grad;  g = g + weight_decay * p
        v = alpha * v + (1 - alpha) * g * g
        avg = sqrt(v - a * a) + eps   with a = alpha * a + (1 - alpha) * g   (centered)
            | sqrt(v) + eps
        buf = momentum * buf + g / avg;  p -= lr * buf      (momentum > 0)
        p -= lr * g / avg                                   (otherwise)

    Args:
        {params}
        lr: learning rate (default: 1e-2).
        alpha: smoothing constant (default: 0.99).
        eps: term added to the denominator (default: 1e-8).
        {weight_decay}
        momentum: momentum factor (default: 0).
        centered: normalize by the variance estimate (default: False).
        {maximize}

    {compliant}
    """

    def __init__(self, params: ParamsT, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False,
                 maximize: bool = False) -> None:
        _check("learning rate", lr)
        _check("alpha value", alpha)
        _check("epsilon value", eps)
        _check("weight_decay value", weight_decay)
        _check("momentum value", momentum)
        defaults = {"lr": lr, "momentum": momentum, "alpha": alpha, "eps": eps, "centered": centered,
                    "weight_decay": weight_decay, "maximize": maximize}
        super().__init__(params, defaults)

    def preinitialize(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["square_avg"] = zeros_like(p)
                if group["momentum"] > 0:
                    self.state[p]["momentum_buffer"] = zeros_like(p)
                if group["centered"]:
                    self.state[p]["grad_avg"] = zeros_like(p)

    def state_names_to_sparsify(self) -> list[str]:
        return ["square_avg", "momentum_buffer", "grad_avg"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = _run_closure(closure)
        for group in self.param_groups:
            alpha, eps, lr = group["alpha"], group["eps"], group["lr"]
            for p, grad in self._params_with_grads(group):
                state = self.state[p]
                grad = _decayed(grad, p, group["weight_decay"])
                square_avg = state["square_avg"]
                square_avg.mul_(alpha).addcmul_(grad, grad, value=1.0 - alpha)
                if group["centered"]:
                    grad_avg = state["grad_avg"]
                    grad_avg.mul_(alpha).add_(grad, alpha=1 - alpha)
                    avg = square_avg.addcmul(grad_avg, grad_avg, value=-1.0).sqrt_().add_(eps)
                else:
                    avg = square_avg.sqrt().add_(eps)
                if group["momentum"] > 0.0:
                    buf = state["momentum_buffer"]
                    buf.mul_(group["momentum"]).addcdiv_(grad, avg)
                    p.add_(-lr * buf)
                else:
                    p.addcdiv_(-lr * grad, avg)
        return loss


RMSprop.__doc__ = _docs.fill(RMSprop.__doc__)
