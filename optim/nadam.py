"""NAdam, as the vendor computes it (float32 momentum schedule, its ``mu_product`` bookkeeping)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cs_run.creation import ones, zeros_like

from . import _docs
from ._functional import ema_, ema_square_, weight_decay_
from .optimizer import ParamsT, _checked_defaults, _CoreOptimizer

__all__ = ["NAdam", "nadam"]


def _f32(value: float) -> float:
    """``value`` rounded to float32, as the vendor's ``torch.tensor(value)`` holds it."""
    return float(torch.tensor(value, dtype=torch.float32))


class NAdam(_CoreOptimizer):
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
        defaults = _checked_defaults(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                     momentum_decay=momentum_decay, decoupled_weight_decay=decoupled_weight_decay,
                                     maximize=maximize)
        super().__init__(params, defaults, enable_global_step=True)

    def preinitialize(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["mu_product"] = ones((), dtype=torch.get_default_dtype(), device=p.device)
                self.state[p]["exp_avg"] = zeros_like(p)
                self.state[p]["exp_avg_sq"] = zeros_like(p)

    def state_names_to_sparsify(self) -> list[str]:
        return ["exp_avg", "exp_avg_sq"]

    def _step_group(self, group: dict[str, Any]) -> None:
        nadam(*self._tensors(group, "exp_avg", "exp_avg_sq", "mu_product", "step"), lr=group["lr"],
              betas=group["betas"], eps=group["eps"], weight_decay=group["weight_decay"],
              momentum_decay=group["momentum_decay"], decoupled_weight_decay=group["decoupled_weight_decay"])


NAdam.__doc__ = _docs.fill(NAdam.__doc__)


def nadam(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
          mu_products: list[Tensor], steps: list[Tensor], *, lr: Tensor, betas: tuple[float, float], eps: float,
          weight_decay: Any, momentum_decay: float, decoupled_weight_decay: bool) -> None:
    """Functional NAdam; see :class:`NAdam`. Mutates params and state (``steps`` included) in place."""
    beta1, beta2 = betas
    beta2 = _f32(beta2)
    for p, grad, exp_avg, exp_avg_sq, mu_product, step in zip(params, grads, exp_avgs, exp_avg_sqs, mu_products,
                                                             steps):
        step.add_(1)
        bias_correction2 = 1 - torch.pow(torch.full_like(step, beta2), step)
        grad = weight_decay_(p, grad, lr=lr, weight_decay=weight_decay, decoupled=decoupled_weight_decay)
        point_nine_six = torch.full_like(step, 0.96)
        mu = beta1 * (1.0 - 0.5 * torch.pow(point_nine_six, step * momentum_decay))
        mu_next = beta1 * (1.0 - 0.5 * torch.pow(point_nine_six, (step + 1) * momentum_decay))
        mu_product *= mu
        mu_product_next = mu_product * mu * mu_next
        ema_(exp_avg, grad, beta1)
        ema_square_(exp_avg_sq, grad, beta2)
        denom = exp_avg_sq.div(bias_correction2).sqrt().add_(eps)
        update = (mu_next * exp_avg) / (1.0 - mu_product_next) + (grad * (1.0 - mu)) / (1.0 - mu_product)
        update *= -lr
        p.addcdiv_(update, denom)
