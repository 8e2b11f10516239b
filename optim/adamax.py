"""Adamax (the infinity-norm Adam), with the vendor's eps placement and ``beta1_power`` state."""

from __future__ import annotations

from typing import Any

import torch

from cs_run.creation import zeros_like

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _check_betas, _decayed, _run_closure

__all__ = ["Adamax"]


class Adamax(Optimizer):
    """Adamax (Kingma & Ba, 2014, section 7.1), as the vendor computes it.

    .. code-block:: text

        g = -grad if maximize else grad;  g = g + weight_decay * p
        m = beta1 * m + (1 - beta1) * g;  u = max(beta2 * u, |g| + eps)
        p -= lr * m / u / (1 - beta1_power);  beta1_power *= beta1

    Args:
        {params}
        lr: learning rate (default: 1e-3, the vendor's; torch uses 2e-3).
        betas: coefficients of the running average and the infinity norm (default: (0.9, 0.999)).
        eps: term added to ``|g|`` (default: 1e-6, the vendor's; torch uses 1e-8).
        {weight_decay}
        {maximize}

    {compliant}

    Note:
        The rule is torch's; the state is the vendor's (``exp_avg``, ``exp_inf``, and the float32
        ``beta1_power`` instead of a ``step``), so the bias correction is rounded as the vendor's.
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, maximize: bool = False) -> None:
        _check("learning rate", lr)
        _check_betas(betas)
        _check("epsilon value", eps)
        _check("weight_decay value", weight_decay)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "maximize": maximize}
        super().__init__(params, defaults)

    def preinitialize(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["exp_avg"] = zeros_like(p)
                self.state[p]["exp_inf"] = zeros_like(p)
                self.state[p]["beta1_power"] = torch.tensor(group["betas"][0], dtype=torch.get_default_dtype(),
                                                            device=p.device)

    def state_names_to_sparsify(self) -> list[str]:
        return ["exp_avg", "exp_inf"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = _run_closure(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p, grad in self._params_with_grads(group):
                grad = _decayed(grad, p, group["weight_decay"])
                state = self.state[p]
                exp_avg, exp_inf = state["exp_avg"], state["exp_inf"]
                exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                torch.maximum(exp_inf.mul(beta2), grad.abs().add_(group["eps"]), out=exp_inf)
                update = exp_avg / exp_inf
                update.div_(1.0 - state["beta1_power"])
                state["beta1_power"] *= beta1
                update *= group["lr"]
                p.sub_(update)
        return loss


Adamax.__doc__ = _docs.fill(Adamax.__doc__)
