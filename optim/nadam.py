"""NAdam, as the vendor computes it (float32 momentum schedule, its ``mu_product`` bookkeeping)."""

from __future__ import annotations

from typing import Any

import torch

from cs_run.creation import ones, zeros_like

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _check_betas, _decayed, _run_closure

__all__ = ["NAdam"]


def _f32(value: float) -> float:
    """``value`` rounded to float32, as the vendor's ``torch.tensor(value)`` holds it."""
    return float(torch.tensor(value, dtype=torch.float32))


class NAdam(Optimizer):
    """NAdam (Dozat, 2016): Adam with Nesterov momentum and a momentum-decay schedule.

    .. code-block:: text

        step += 1;  g = -grad if maximize else grad;  g = g + weight_decay * p   (L2)
        mu = beta1 (1 - 0.5 * 0.96^(step * momentum_decay));  mu_next = the same at step + 1
        mu_product *= mu;  mu_product_next = mu_product * mu * mu_next
        m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g g
        denom = sqrt(v / (1 - beta2^step)) + eps
        p -= lr * (mu_next m / (1 - mu_product_next) + (1 - mu) g / (1 - mu_product)) / denom

    Args:
        {params}
        lr: learning rate (default: 2e-3).
        betas: coefficients of the running averages (default: (0.9, 0.999)).
        eps: term added to the denominator (default: 1e-8).
        {weight_decay}
        momentum_decay: momentum decay (default: 4e-3).
        decoupled_weight_decay: decay the parameter (``p *= 1 - lr * weight_decay``) instead of L2
            (default: False; a cs-run extra, the vendor has only L2).
        {maximize}

    {compliant}

    Note:
        Differs from torch.optim.NAdam as the vendor does: ``mu_product_next`` is
        ``mu_product * mu * mu_next`` where torch uses ``mu_product * mu_next`` (``mu`` counted twice),
        and the schedule is computed in float32 from the step tensor.
    """

    def __init__(self, params: ParamsT, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, maximize: bool = False) -> None:
        _check("learning rate", lr)
        _check_betas(betas)
        _check("epsilon value", eps)
        _check("weight_decay value", weight_decay)
        _check("momentum_decay value", momentum_decay)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "momentum_decay": momentum_decay, "decoupled_weight_decay": decoupled_weight_decay,
                    "maximize": maximize}
        super().__init__(params, defaults, enable_global_step=True)

    def preinitialize(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["mu_product"] = ones((), dtype=torch.get_default_dtype(), device=p.device)
                self.state[p]["exp_avg"] = zeros_like(p)
                self.state[p]["exp_avg_sq"] = zeros_like(p)

    def state_names_to_sparsify(self) -> list[str]:
        return ["exp_avg", "exp_avg_sq"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = _run_closure(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            beta2 = _f32(beta2)
            decay, eps, lr = group["momentum_decay"], group["eps"], group["lr"]
            for p, grad in self._params_with_grads(group):
                state = self.state[p]
                exp_avg, exp_avg_sq, mu_product = state["exp_avg"], state["exp_avg_sq"], state["mu_product"]
                step = self.increment_global_step(p)
                bias_correction2 = 1 - torch.pow(torch.full_like(step, beta2), step)
                if group["decoupled_weight_decay"]:
                    p.mul_(1 - lr * group["weight_decay"])
                else:
                    grad = _decayed(grad, p, group["weight_decay"])
                point_nine_six = torch.full_like(step, 0.96)
                mu = beta1 * (1.0 - 0.5 * torch.pow(point_nine_six, step * decay))
                mu_next = beta1 * (1.0 - 0.5 * torch.pow(point_nine_six, (step + 1) * decay))
                mu_product *= mu
                mu_product_next = mu_product * mu * mu_next
                exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                denom = exp_avg_sq.div(bias_correction2).sqrt().add_(eps)
                update = (mu_next * exp_avg) / (1.0 - mu_product_next) + (grad * (1.0 - mu)) / (1.0 - mu_product)
                update *= -lr
                p.addcdiv_(update, denom)
        return loss


NAdam.__doc__ = _docs.fill(NAdam.__doc__)
