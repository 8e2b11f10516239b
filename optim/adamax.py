"""Adamax (the infinity-norm Adam), with the vendor's eps placement and ``beta1_power`` state."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cs_run.creation import zeros_like

from . import _docs
from ._functional import decayed, ema_
from .optimizer import ParamsT, _checked_defaults, _CoreOptimizer

__all__ = ["Adamax", "adamax"]


class Adamax(_CoreOptimizer):
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
        super().__init__(params, _checked_defaults(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                                   maximize=maximize))

    def preinitialize(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["exp_avg"] = zeros_like(p)
                self.state[p]["exp_inf"] = zeros_like(p)
                self.state[p]["beta1_power"] = torch.tensor(group["betas"][0], dtype=torch.get_default_dtype(),
                                                            device=p.device)

    def state_names_to_sparsify(self) -> list[str]:
        return ["exp_avg", "exp_inf"]

    def _step_group(self, group: dict[str, Any]) -> None:
        adamax(*self._tensors(group, "exp_avg", "exp_inf", "beta1_power"), lr=group["lr"], betas=group["betas"],
               eps=group["eps"], weight_decay=group["weight_decay"])


Adamax.__doc__ = _docs.fill(Adamax.__doc__)


def adamax(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_infs: list[Tensor],
           beta1_powers: list[Tensor], *, lr: Tensor, betas: tuple[float, float], eps: float,
           weight_decay: Any) -> None:
    """Functional Adamax; see :class:`Adamax`. Mutates params and state in place."""
    beta1, beta2 = betas
    for p, grad, exp_avg, exp_inf, beta1_power in zip(params, grads, exp_avgs, exp_infs, beta1_powers):
        grad = decayed(grad, p, weight_decay)
        ema_(exp_avg, grad, beta1)
        torch.maximum(exp_inf.mul(beta2), grad.abs().add_(eps), out=exp_inf)
        update = exp_avg / exp_inf
        update.div_(1.0 - beta1_power)
        beta1_power *= beta1
        update *= lr
        p.sub_(update)
