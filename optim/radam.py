"""RAdam, as the vendor computes it (float32 rectification terms from the step tensor)."""

from __future__ import annotations

from typing import Any

import torch

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _check_betas, _decayed, _run_closure

__all__ = ["RAdam"]


class RAdam(Optimizer):
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
        _check("learning rate", lr)
        _check_betas(betas)
        _check("epsilon value", eps)
        _check("weight_decay value", weight_decay)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "decoupled_weight_decay": decoupled_weight_decay, "maximize": maximize}
        super().__init__(params, defaults, enable_global_step=True)

    def preinitialize(self) -> None:
        self._zeros_like_params("exp_avg", "exp_avg_sq")

    def state_names_to_sparsify(self) -> list[str]:
        return ["exp_avg", "exp_avg_sq"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = _run_closure(closure)
        for group in self.param_groups:
            for p, grad in self._params_with_grads(group):
                exp_avg, exp_avg_sq = self.state[p]["exp_avg"], self.state[p]["exp_avg_sq"]
                step = self.increment_global_step(p)
                beta1_f, beta2_f = (float(torch.tensor(b, dtype=torch.float32)) for b in group["betas"])
                beta1, beta2 = torch.full_like(step, beta1_f), torch.full_like(step, beta2_f)
                if group["decoupled_weight_decay"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                else:
                    grad = _decayed(grad, p, group["weight_decay"])
                beta2t = torch.pow(beta2, step)
                bias_correction1 = 1 - torch.pow(beta1, step)
                bias_correction2 = 1 - beta2t
                exp_avg.mul_(beta1_f).add_(grad, alpha=1.0 - beta1_f)  # exact: 1 - float32(beta)
                exp_avg_sq.mul_(beta2_f).addcmul_(grad, grad, value=1.0 - beta2_f)
                update = exp_avg / bias_correction1
                rho_inf = 2 / (1 - beta2) - 1
                rho_t = rho_inf - 2 * step * beta2t / bias_correction2
                one = torch.ones_like(step)
                rectified = rho_t > 5
                rect = torch.where(rectified, torch.sqrt(
                    (rho_t - 4.0) * (rho_t - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t)), one)
                adaptive_lr = torch.where(rectified, torch.sqrt(bias_correction2) / exp_avg_sq.sqrt().add_(group["eps"]),
                                          one)
                update *= rect
                update *= adaptive_lr
                update *= group["lr"]
                p.sub_(update)
        return loss


RAdam.__doc__ = _docs.fill(RAdam.__doc__)
