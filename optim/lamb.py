"""LAMB (layer-wise adaptive moments), as the vendor computes it."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import _docs
from ._functional import decayed, ema_, ema_square_
from .optimizer import ParamsT, _checked_defaults, _CoreOptimizer

__all__ = ["Lamb", "lamb"]


class Lamb(_CoreOptimizer):
    """LAMB (You et al., 2020, "Large Batch Optimization for Deep Learning").

    .. code-block:: text

        g = -grad if maximize else grad
        m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
        r = m / (sqrt(v) + eps) + weight_decay * p
        trust = min(||p||, 10) / ||r||   (1 when either norm is 0, or when adam=True)
        p -= lr * trust * r

    Args:
        {params}
        lr: learning rate (default: 1e-3).
        betas: coefficients of the running averages (default: (0.9, 0.999)).
        eps: term added to the denominator (default: 1e-6).
        weight_decay: decoupled weight decay, inside the trust ratio (default: 0).
        adam: always use trust ratio 1, for comparison (default: False).
        {maximize}

    {compliant}

    Note:
        This is the vendor's LAMB (cybertronai's pytorch-lamb): the moments are **not** bias-corrected
        and ``||p||`` is clamped to 10, unlike the paper's Algorithm 2. Kept so vendor runs continue
        here identically.
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, adam: bool = False, maximize: bool = False) -> None:
        super().__init__(params, _checked_defaults(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                                   adam=adam, maximize=maximize))

    def preinitialize(self) -> None:
        self._zeros_like_params("exp_avg", "exp_avg_sq")

    def state_names_to_sparsify(self) -> list[str]:
        return ["exp_avg", "exp_avg_sq"]

    def _step_group(self, group: dict[str, Any]) -> None:
        lamb(*self._tensors(group, "exp_avg", "exp_avg_sq"), lr=group["lr"], betas=group["betas"], eps=group["eps"],
             weight_decay=group["weight_decay"], adam=group["adam"])


Lamb.__doc__ = _docs.fill(Lamb.__doc__)


def lamb(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor], *,
         lr: Tensor, betas: tuple[float, float], eps: float, weight_decay: Any, adam: bool) -> None:
    """Functional LAMB; see :class:`Lamb`. Mutates params and state in place."""
    beta1, beta2 = betas
    for p, grad, exp_avg, exp_avg_sq in zip(params, grads, exp_avgs, exp_avg_sqs):
        ema_(exp_avg, grad, beta1)
        ema_square_(exp_avg_sq, grad, beta2)
        adam_step = exp_avg / exp_avg_sq.sqrt().add(eps)
        adam_step = decayed(adam_step, p, weight_decay)
        if adam:
            update = adam_step
        else:
            weight_norm = p.pow(2).sum().sqrt().clamp(0, 10).to(torch.float)
            adam_norm = adam_step.pow(2).sum().sqrt().to(torch.float)
            # 1. both norms positive: ||p|| / ||r||; 2. otherwise 1 (fresh zero params, zero update)
            ok = (weight_norm > 0) & (adam_norm > 0)
            trust = torch.where(ok, weight_norm / adam_norm, torch.ones_like(weight_norm))
            update = adam_step.mul(trust)
        p.sub_(update * lr)
