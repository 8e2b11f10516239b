"""RMSprop (centered and with momentum); numerically torch.optim.RMSprop."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cs_run.creation import zeros_like

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _run_closure, _weight_decay

__all__ = ["RMSprop", "rmsprop"]


class RMSprop(Optimizer):
    """RMSprop (Hinton, lecture 6e).

    .. code-block:: text

        g = -grad if maximize else grad;  g += weight_decay * p
        v = alpha * v + (1 - alpha) * g * g
        avg = sqrt(v - g_avg^2) + eps  with g_avg = lerp(g_avg, g, 1 - alpha)   (centered)
        avg = sqrt(v) + eps                                                      (otherwise)
        buf = momentum * buf + g / avg;  p -= lr * buf      (momentum > 0)
        p -= lr * g / avg                                   (otherwise)

    Args:
        {params}
        lr: learning rate (default: 1e-2).
        alpha: smoothing constant (default: 0.99).
        eps: term added to the denominator (default: 1e-8).
        {weight_decay}
        momentum: momentum factor (default: 0).
        centered: normalize by the estimated variance of the gradient (default: False).
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
        defaults = {"lr": lr, "alpha": alpha, "eps": eps, "weight_decay": weight_decay, "momentum": momentum,
                        "centered": centered, "maximize": maximize}
        super().__init__(params, defaults, enable_global_step=True)

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
            momentum, centered = group["momentum"] > 0, group["centered"]
            names = ["step", "square_avg"] + (["momentum_buffer"] if momentum else []) + (
                ["grad_avg"] if centered else [])
            params, grads, steps, square_avgs, *rest = self._group_tensors(group, *names)
            bufs = rest.pop(0) if momentum else []
            grad_avgs = rest.pop(0) if centered else []
            rmsprop(params, grads, square_avgs, grad_avgs, bufs, steps, lr=group["lr"], alpha=group["alpha"],
                    eps=group["eps"], weight_decay=group["weight_decay"], momentum=group["momentum"],
                    centered=centered, maximize=group["maximize"])
        return loss


RMSprop.__doc__ = _docs.fill(RMSprop.__doc__)


def rmsprop(params: list[Tensor], grads: list[Tensor], square_avgs: list[Tensor], grad_avgs: list[Tensor],
            bufs: list[Tensor], steps: list[Tensor], *, lr: Tensor, alpha: float, eps: float,
            weight_decay: float, momentum: float, centered: bool, maximize: bool) -> None:
    """Functional RMSprop; see :class:`RMSprop`. Single-tensor only (not on a hot path)."""
    neg_lr = lr.neg()
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        steps[i].add_(1)
        grad = _weight_decay(param, grad, lr=lr, weight_decay=weight_decay)
        square_avgs[i].mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
        if centered:
            grad_avgs[i].lerp_(grad, 1 - alpha)
            avg = square_avgs[i].addcmul(grad_avgs[i], grad_avgs[i], value=-1).sqrt_()
        else:
            avg = square_avgs[i].sqrt()
        avg = avg.add_(eps)
        if momentum > 0:
            bufs[i].mul_(momentum).addcdiv_(grad, avg)
            param.addcmul_(bufs[i], neg_lr)
        else:
            param.addcmul_(grad.div(avg), neg_lr)
