"""RAdam, as the vendor computes it (float32 rectification terms from the step tensor)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import _docs
from ._functional import ema_, ema_square_, weight_decay_
from .optimizer import ParamsT, _checked_defaults, _CoreOptimizer

__all__ = ["RAdam", "radam"]


class RAdam(_CoreOptimizer):
    """RAdam (Liu et al., 2020, "On the Variance of the Adaptive Learning Rate and Beyond").

    .. code-block:: text

        step += 1;  g = -grad if maximize else grad;  g = g + weight_decay * p   (L2)
        m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g g
        rho_inf = 2 / (1 - beta2) - 1;  rho = rho_inf - 2 step beta2^step / (1 - beta2^step)
        p -= lr * m / (1 - beta1^step) * r * sqrt(1 - beta2^step) / (sqrt(v) + eps)   (rho > 5)
        p -= lr * m / (1 - beta1^step)                                                 (otherwise)
        with r = sqrt((rho - 4)(rho - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho))

    Args:
        {params}
        lr: learning rate (default: 1e-3).
        betas: coefficients of the running averages (default: (0.9, 0.999)).
        eps: term added to the denominator (default: 1e-6, the vendor's; torch uses 1e-8).
        {weight_decay}
        decoupled_weight_decay: ``p *= 1 - lr * weight_decay`` instead of L2 (default: False; a
            cs-run extra, the vendor has only L2).
        {maximize}

    {compliant}

    Note:
        The rule is torch's, with the vendor's eps placement (``sqrt(1 - beta2^t) / (sqrt(v) + eps)``,
        torch: ``sqrt(1 - beta2^t) / (sqrt(v) + eps)`` as well) and float32 rectification terms.
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, decoupled_weight_decay: bool = False,
                 maximize: bool = False) -> None:
        defaults = _checked_defaults(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                     decoupled_weight_decay=decoupled_weight_decay, maximize=maximize)
        super().__init__(params, defaults, enable_global_step=True)

    def preinitialize(self) -> None:
        self._zeros_like_params("exp_avg", "exp_avg_sq")

    def state_names_to_sparsify(self) -> list[str]:
        return ["exp_avg", "exp_avg_sq"]

    def _step_group(self, group: dict[str, Any]) -> None:
        radam(*self._tensors(group, "exp_avg", "exp_avg_sq", "step"), lr=group["lr"], betas=group["betas"],
              eps=group["eps"], weight_decay=group["weight_decay"],
              decoupled_weight_decay=group["decoupled_weight_decay"])


RAdam.__doc__ = _docs.fill(RAdam.__doc__)


def radam(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
          steps: list[Tensor], *, lr: Tensor, betas: tuple[float, float], eps: float, weight_decay: Any,
          decoupled_weight_decay: bool) -> None:
    """Functional RAdam; see :class:`RAdam`. Mutates params and state (``steps`` included) in place."""
    beta1_f, beta2_f = (float(torch.tensor(b, dtype=torch.float32)) for b in betas)
    for p, grad, exp_avg, exp_avg_sq, step in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        step.add_(1)
        beta1, beta2 = torch.full_like(step, beta1_f), torch.full_like(step, beta2_f)
        grad = weight_decay_(p, grad, lr=lr, weight_decay=weight_decay, decoupled=decoupled_weight_decay)
        beta2t = torch.pow(beta2, step)
        bias_correction1 = 1 - torch.pow(beta1, step)
        bias_correction2 = 1 - beta2t
        ema_(exp_avg, grad, beta1_f)  # exact: 1 - float32(beta)
        ema_square_(exp_avg_sq, grad, beta2_f)
        update = exp_avg / bias_correction1
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * beta2t / bias_correction2
        one = torch.ones_like(step)
        rectified = rho_t > 5
        rect = torch.where(rectified, torch.sqrt(
            (rho_t - 4.0) * (rho_t - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t)), one)
        adaptive_lr = torch.where(rectified, torch.sqrt(bias_correction2) / exp_avg_sq.sqrt().add_(eps), one)
        update *= rect
        update *= adaptive_lr
        update *= lr
        p.sub_(update)
