"""LAMB (layer-wise adaptive moments); checked against the paper's algorithm in the tests."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _check_betas, _run_closure, _scalar

__all__ = ["Lamb", "lamb"]


class Lamb(Optimizer):
    """LAMB (You et al., 2020, "Large Batch Optimization for Deep Learning", Algorithm 2).

    .. code-block:: text

        step += 1;  g = -grad if maximize else grad
        m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
        r = (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps) + weight_decay * p
        trust = ||p|| / ||r||   (1 when either norm is 0, or when adam=True)
        p -= lr * trust * r

    Args:
        {params}
        lr: learning rate (default: 1e-3).
        betas: coefficients of the running averages (default: (0.9, 0.999)).
        eps: term added to the denominator (default: 1e-6).
        weight_decay: decoupled weight decay, inside the trust ratio (default: 0).
        adam: always use trust ratio 1, i.e. Adam with the same decay, for comparison (default: False).
        {maximize}

    {compliant}

    Note:
        The paper's scaling function phi is the identity here; the moments are bias-corrected as in the
        paper's Algorithm 2 (some implementations, e.g. cybertronai's, skip that and clamp ||p|| to 10).
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, adam: bool = False, maximize: bool = False) -> None:
        _check("learning rate", lr)
        _check_betas(betas)
        _check("epsilon value", eps)
        _check("weight_decay value", weight_decay)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "adam": adam,
                        "maximize": maximize}
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
            lamb(params, grads, exp_avgs, exp_avg_sqs, steps, lr=group["lr"], beta1=beta1, beta2=beta2,
                 eps=group["eps"], weight_decay=group["weight_decay"], adam=group["adam"],
                 maximize=group["maximize"])
        return loss


Lamb.__doc__ = _docs.fill(Lamb.__doc__)


def lamb(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
         steps: list[Tensor], *, lr: Tensor, beta1: float, beta2: float, eps: float, weight_decay: float,
         adam: bool, maximize: bool) -> None:
    """Functional LAMB; see :class:`Lamb`. Single-tensor: the trust ratio is per tensor anyway."""
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        steps[i].add_(1)
        step = _scalar(steps[i])
        exp_avgs[i].mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sqs[i].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        m_hat = exp_avgs[i].div((1 - beta1**step).to(param.dtype))
        v_hat = exp_avg_sqs[i].div((1 - beta2**step).to(param.dtype))
        update = m_hat.div_(v_hat.sqrt_().add_(eps))
        if weight_decay != 0:
            update.add_(param, alpha=weight_decay)
        if adam:
            trust = torch.ones((), dtype=param.dtype, device=param.device)
        else:
            p_norm, u_norm = param.norm(), update.norm()
            # 1. both norms positive: ||p|| / ||r||; 2. otherwise 1 (fresh zero params, zero update)
            trust = torch.where((p_norm > 0) & (u_norm > 0), p_norm / u_norm, torch.ones_like(p_norm))
        param.sub_(update.mul_(trust * lr.to(param.dtype)))
