"""Adam and AdamW; numerically torch.optim.Adam / AdamW, with the vendor's defaults."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cs_run.creation import zeros_like

from . import _docs
from .optimizer import (
    Optimizer,
    ParamsT,
    _check,
    _check_betas,
    _foreach_ok,
    _run_closure,
    _scalar,
    _weight_decay,
)

__all__ = ["Adam", "AdamW", "adam"]


class Adam(Optimizer):
    """Adam (Kingma & Ba, 2014), with AMSGrad and decoupled weight decay as options.

    .. code-block:: text

        step += 1;  g = -grad if maximize else grad
        p *= 1 - lr * weight_decay            (decoupled, AdamW)   |  g += weight_decay * p   (Adam)
        m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
        v_max = max(v_max, v)                 (amsgrad)
        p -= lr / (1 - beta1^step) * m / (sqrt(v or v_max) / sqrt(1 - beta2^step) + eps)

    Args:
        {params}
        lr: learning rate (default: 1e-3).
        betas: coefficients of the running averages of the gradient and its square.
        eps: term added to the denominator (default: 1e-6, the vendor's; torch uses 1e-8).
        {weight_decay}
        amsgrad: use the AMSGrad variant (default: False).
        {maximize}
        correct_bias: apply the bias corrections (default: True; False is the BERT recipe).

    {compliant}

    Note:
        The per-step factors (bias corrections) are computed from the step tensor in float64, as
        torch computes them in Python doubles; the result matches torch.optim to rounding.
    """

    _decoupled = False

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        maximize: bool = False,
        correct_bias: bool = True,
    ) -> None:
        _check("learning rate", lr)
        _check_betas(betas)
        _check("epsilon value", eps)
        _check("weight_decay value", weight_decay)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "amsgrad": amsgrad,
                        "maximize": maximize, "correct_bias": correct_bias}
        super().__init__(params, defaults, enable_global_step=True)

    def preinitialize(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["exp_avg"] = zeros_like(p)
                self.state[p]["exp_avg_sq"] = zeros_like(p)
                if group["amsgrad"]:
                    self.state[p]["max_exp_avg_sq"] = zeros_like(p)

    def state_names_to_sparsify(self) -> list[str]:
        return ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = _run_closure(closure)
        for group in self.param_groups:
            names = ["step", "exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if group["amsgrad"] else [])
            params, grads, steps, exp_avgs, exp_avg_sqs, *maxes = self._group_tensors(group, *names)
            beta1, beta2 = group["betas"]
            adam(params, grads, exp_avgs, exp_avg_sqs, maxes[0] if maxes else [], steps,
                 lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                 weight_decay=group["weight_decay"], amsgrad=group["amsgrad"], maximize=group["maximize"],
                 decoupled=self._decoupled, correct_bias=group["correct_bias"])
        return loss


class AdamW(Adam):
    """AdamW (Loshchilov & Hutter, 2019): Adam with decoupled weight decay. Same arguments as Adam.

    Note:
        ``weight_decay`` defaults to 0.0 (the vendor's; torch.optim.AdamW uses 0.01). The decay is
        applied before the update as in torch (``p *= 1 - lr * weight_decay``).
    """

    _decoupled = True


Adam.__doc__ = _docs.fill(Adam.__doc__)


def adam(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
         max_exp_avg_sqs: list[Tensor], steps: list[Tensor], *, lr: Tensor, beta1: float, beta2: float,
         eps: float, weight_decay: float, amsgrad: bool, maximize: bool, decoupled: bool,
         correct_bias: bool = True, foreach: bool | None = None) -> None:
    """Functional Adam/AdamW; see :class:`Adam`. Mutates params, state and steps in place."""
    if not params:
        return
    use_foreach = _foreach_ok(params) if foreach is None else foreach
    impl = _foreach_adam if use_foreach else _single_tensor_adam
    impl(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr=lr, beta1=beta1, beta2=beta2,
         eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize, decoupled=decoupled,
         correct_bias=correct_bias)


def _denominator_factors(step: Tensor, lr: Tensor, beta1: float, beta2: float, eps: float,
                         correct_bias: bool, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(scale, shift) with ``p += m / (sqrt(v) / scale + shift)`` equal to Adam's update.

    Folding ``-lr / bias_correction1`` into the denominator keeps the update one pass with a tensor lr
    (torch's capturable path does the same).
    """
    lr64 = _scalar(lr)
    if correct_bias:
        step64 = _scalar(step)
        neg_step_size = lr64 / (1 - beta1**step64) * -1
        scale = (1 - beta2**step64).sqrt() * neg_step_size
    else:
        neg_step_size = -lr64
        scale = neg_step_size
    return scale.to(dtype), (eps / neg_step_size).to(dtype)


def _single_tensor_adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, *, lr, beta1,
                        beta2, eps, weight_decay, amsgrad, maximize, decoupled, correct_bias) -> None:
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        steps[i].add_(1)
        grad = _weight_decay(param, grad, lr=lr, weight_decay=weight_decay, decoupled=decoupled)
        exp_avgs[i].lerp_(grad, 1 - beta1)
        exp_avg_sqs[i].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        second = exp_avg_sqs[i]
        if amsgrad:
            torch.maximum(max_exp_avg_sqs[i], second, out=max_exp_avg_sqs[i])
            second = max_exp_avg_sqs[i]
        scale, shift = _denominator_factors(steps[i], lr, beta1, beta2, eps, correct_bias, param.dtype)
        param.addcdiv_(exp_avgs[i], second.sqrt().div_(scale).add_(shift))


def _foreach_adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, *, lr, beta1, beta2,
                  eps, weight_decay, amsgrad, maximize, decoupled, correct_bias) -> None:
    if maximize:
        grads = torch._foreach_neg(grads)
    torch._foreach_add_(steps, 1)
    if weight_decay != 0:
        if decoupled:
            torch._foreach_mul_(params, 1 - lr * weight_decay)
        else:
            grads = torch._foreach_add(grads, params, alpha=weight_decay)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    del grads
    second = exp_avg_sqs
    if amsgrad:
        torch._foreach_maximum_(max_exp_avg_sqs, exp_avg_sqs)
        second = max_exp_avg_sqs
    # all steps at once: a handful of ops on one vector instead of ~10 tiny ops per parameter
    factors = _denominator_factors(torch.stack(steps), lr, beta1, beta2, eps, correct_bias, params[0].dtype)
    scale, shift = (f.expand(len(params)) for f in factors)  # 0-d without bias correction
    denom = torch._foreach_sqrt(second)
    torch._foreach_div_(denom, scale.unbind(0))
    torch._foreach_add_(denom, shift.unbind(0))
    torch._foreach_addcdiv_(params, exp_avgs, denom)
