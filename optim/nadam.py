"""NAdam (Adam with Nesterov momentum); numerically torch.optim.NAdam."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cs_run.creation import ones, zeros_like

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _check_betas, _run_closure, _scalar, _weight_decay

__all__ = ["NAdam", "nadam"]


class NAdam(Optimizer):
    """NAdam (Dozat, 2016) with torch's momentum-decay schedule.

    .. code-block:: text

        step += 1;  g = -grad if maximize else grad
        p *= 1 - lr * weight_decay (decoupled)  |  g += weight_decay * p
        mu_t = beta1 * (1 - 0.5 * 0.96^(step * momentum_decay));  mu_product *= mu_t
        m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
        denom = sqrt(v / (1 - beta2^step)) + eps
        p -= lr * (1 - mu_t) / (1 - mu_product) * g / denom
        p -= lr * mu_{t+1} / (1 - mu_product * mu_{t+1}) * m / denom

    Args:
        {params}
        lr: learning rate (default: 2e-3).
        betas: coefficients of the running averages (default: (0.9, 0.999)).
        eps: term added to the denominator (default: 1e-8).
        {weight_decay}
        momentum_decay: momentum decay psi (default: 4e-3).
        decoupled_weight_decay: NAdamW-style decay (default: False).
        {maximize}

    {compliant}
    """

    def __init__(self, params: ParamsT, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, maximize: bool = False) -> None:
        _check("learning rate", lr)
        _check_betas(betas)
        _check("epsilon value", eps)
        _check("weight_decay value", weight_decay)
        _check("momentum_decay value", momentum_decay)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "maximize": maximize,
                        "momentum_decay": momentum_decay, "decoupled_weight_decay": decoupled_weight_decay}
        super().__init__(params, defaults, enable_global_step=True)

    def preinitialize(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                step = self.state[p]["step"]
                self.state[p]["mu_product"] = ones((), dtype=step.dtype, device=p.device)
                self.state[p]["exp_avg"] = zeros_like(p)
                self.state[p]["exp_avg_sq"] = zeros_like(p)

    def state_names_to_sparsify(self) -> list[str]:
        return ["exp_avg", "exp_avg_sq"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = _run_closure(closure)
        for group in self.param_groups:
            params, grads, steps, mu_products, exp_avgs, exp_avg_sqs = self._group_tensors(
                group, "step", "mu_product", "exp_avg", "exp_avg_sq")
            beta1, beta2 = group["betas"]
            nadam(params, grads, exp_avgs, exp_avg_sqs, mu_products, steps, lr=group["lr"], beta1=beta1,
                  beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"],
                  momentum_decay=group["momentum_decay"], maximize=group["maximize"],
                  decoupled_weight_decay=group["decoupled_weight_decay"])
        return loss


NAdam.__doc__ = _docs.fill(NAdam.__doc__)


def nadam(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
          mu_products: list[Tensor], steps: list[Tensor], *, lr: Tensor, beta1: float, beta2: float,
          eps: float, weight_decay: float, momentum_decay: float, maximize: bool,
          decoupled_weight_decay: bool) -> None:
    """Functional NAdam; see :class:`NAdam`. Single-tensor only (not on a hot path)."""
    lr64 = _scalar(lr)
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        steps[i].add_(1)
        step = _scalar(steps[i])
        grad = _weight_decay(param, grad, lr=lr, weight_decay=weight_decay, decoupled=decoupled_weight_decay)
        mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))
        mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * momentum_decay)))
        mu_products[i].mul_(mu.to(mu_products[i].dtype))  # rounded in the state's dtype, as torch
        mu_product = _scalar(mu_products[i])
        exp_avgs[i].lerp_(grad, 1 - beta1)
        exp_avg_sqs[i].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = exp_avg_sqs[i].div((1 - beta2**step).to(param.dtype)).sqrt_().add_(eps)
        grad_coef = (-lr64 * (1.0 - mu) / (1.0 - mu_product)).to(param.dtype)
        avg_coef = (-lr64 * mu_next / (1.0 - mu_product * mu_next)).to(param.dtype)
        param.addcdiv_(grad.mul(grad_coef), denom)
        param.addcdiv_(exp_avgs[i].mul(avg_coef), denom)
