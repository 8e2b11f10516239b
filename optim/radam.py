"""RAdam (rectified Adam); numerically torch.optim.RAdam."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _check_betas, _run_closure, _scalar, _weight_decay

__all__ = ["RAdam", "radam"]


class RAdam(Optimizer):
    """RAdam (Liu et al., 2019).

    .. code-block:: text

        step += 1;  g = -grad if maximize else grad
        p *= 1 - lr * weight_decay (decoupled)  |  g += weight_decay * p
        m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
        rho_inf = 2 / (1 - beta2) - 1;  rho_t = rho_inf - 2 step beta2^step / (1 - beta2^step)
        1. rho_t > 5: p -= lr * m_hat * r_t * sqrt(1 - beta2^step) / (sqrt(v) + eps)
        2. otherwise: p -= lr * m_hat                      (m_hat = m / (1 - beta1^step))

    The two cases are one ``torch.where`` on the step, not a Python branch.

    Args:
        {params}
        lr: learning rate (default: 1e-3).
        betas: coefficients of the running averages (default: (0.9, 0.999)).
        eps: term added to the denominator (default: 1e-8).
        {weight_decay}
        decoupled_weight_decay: AdamW-style decay (default: False).
        {maximize}

    {compliant}
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, decoupled_weight_decay: bool = False,
                 maximize: bool = False) -> None:
        _check("learning rate", lr)
        _check_betas(betas)
        _check("epsilon value", eps)
        _check("weight_decay value", weight_decay)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "maximize": maximize,
                        "decoupled_weight_decay": decoupled_weight_decay}
        super().__init__(params, defaults, enable_global_step=True)

    def preinitialize(self) -> None:
        self._zeros_like_params("exp_avg", "exp_avg_sq")

    def state_names_to_sparsify(self) -> list[str]:
        return ["exp_avg", "exp_avg_sq"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = _run_closure(closure)
        for group in self.param_groups:
            params, grads, steps, exp_avgs, exp_avg_sqs = self._group_tensors(
                group, "step", "exp_avg", "exp_avg_sq")
            beta1, beta2 = group["betas"]
            radam(params, grads, exp_avgs, exp_avg_sqs, steps, lr=group["lr"], beta1=beta1, beta2=beta2,
                  eps=group["eps"], weight_decay=group["weight_decay"], maximize=group["maximize"],
                  decoupled_weight_decay=group["decoupled_weight_decay"])
        return loss


RAdam.__doc__ = _docs.fill(RAdam.__doc__)


def radam(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
          steps: list[Tensor], *, lr: Tensor, beta1: float, beta2: float, eps: float, weight_decay: float,
          maximize: bool, decoupled_weight_decay: bool) -> None:
    """Functional RAdam; see :class:`RAdam`. Single-tensor only (not on a hot path)."""
    lr64 = _scalar(lr)
    rho_inf = 2 / (1 - beta2) - 1
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        steps[i].add_(1)
        step = _scalar(steps[i])
        grad = _weight_decay(param, grad, lr=lr, weight_decay=weight_decay, decoupled=decoupled_weight_decay)
        exp_avgs[i].lerp_(grad, 1 - beta1)
        exp_avg_sqs[i].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        rho_t = rho_inf - 2 * step * (beta2**step) / bias_correction2
        # clamp keeps the unused branch finite (rho_t <= 4 gives a negative root)
        rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)).clamp(min=0).sqrt()
        rectified = rho_t > 5.0
        # 1. rectified: m_hat * lr * sqrt(bc2) / (sqrt(v) + eps) * rect; 2. plain: m_hat * lr
        adaptive = exp_avg_sqs[i].sqrt().add_(eps).reciprocal_().mul_(bias_correction2.sqrt().to(param.dtype))
        update = torch.where(rectified, adaptive * rect.to(param.dtype), torch.ones_like(adaptive))
        step_size = (lr64 / bias_correction1).to(param.dtype)
        param.sub_(exp_avgs[i].mul(step_size).mul_(update))
