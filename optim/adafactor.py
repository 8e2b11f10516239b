"""Adafactor (factored second moments); checked against the paper's algorithm in the tests."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cs_run.creation import zeros, zeros_like

from . import _docs
from .optimizer import ParamsT, _check, _CoreOptimizer

__all__ = ["Adafactor", "adafactor"]


class Adafactor(_CoreOptimizer):
    """Adafactor (Shazeer & Stern, 2018), the Model Zoo / Hugging Face parameterization.

    .. code-block:: text

        step += 1;  beta2_t = 1 - step^decay_rate;  g2 = g * g + eps[0]
        rho = min(1e-2 or 1e-6 * step (warmup_init), 1 / sqrt(step))  if relative_step else lr
        alpha = max(eps[1], RMS(p)) * rho                              if scale_parameter else rho
        factored (ndim >= 2): R = beta2_t R + (1 - beta2_t) mean(g2, -1);  C likewise with mean(g2, -2)
                              u = g / sqrt(R C / mean(R))
        otherwise:            v = beta2_t v + (1 - beta2_t) g2;  u = g / sqrt(v)
        u = alpha * u / max(1, RMS(u) / clip_threshold)
        m = beta1 * m + (1 - beta1) * u;  u = m                        (beta1 given)
        p -= weight_decay * alpha * p + u

    Args:
        {params}
        lr: external learning rate (required, as in the vendor's; None with ``relative_step``).
        eps: (eps1 added to the squared gradient, eps2 lower bound of the parameter scale).
        clip_threshold: threshold of the update's RMS (default: 1.0).
        decay_rate: exponent of the second-moment decay (default: -0.8).
        beta1: first-moment coefficient, or None for no first moment (default: None).
        weight_decay: decoupled weight decay, scaled by alpha (default: 0).
        scale_parameter: scale the step by the parameter's RMS (default: True).
        relative_step: use the time-dependent step instead of ``lr`` (default: False).
        warmup_init: warm the relative step up linearly (needs ``relative_step``; default: False).

    {compliant}

    Note:
        With the vendor's supported options (``beta1=None``, ``clip_threshold=1.0``,
        ``relative_step=False``) this is the vendor's Adafactor, operation for operation (checked
        against its golden trajectories). ``beta1``, other clip thresholds and ``relative_step``
        are cs-run extras the vendor refuses. torch.optim.Adafactor is a different parameterization.
    """

    def __init__(self, params: ParamsT, lr: float | None, eps: tuple[float, float] = (1e-30, 1e-3),
                 clip_threshold: float = 1.0, decay_rate: float = -0.8, beta1: float | None = None,
                 weight_decay: float = 0.0, scale_parameter: bool = True, relative_step: bool = False,
                 warmup_init: bool = False) -> None:
        if lr is None and not relative_step:
            raise ValueError("Invalid learning rate: None (required unless relative_step=True)")
        lr = 0.0 if lr is None else lr  # relative_step computes its own step size
        _check("learning rate", lr)
        if warmup_init and not relative_step:
            raise ValueError("Invalid warmup_init: True (requires relative_step=True)")
        if beta1 is not None:
            _check("beta1 value", beta1, 0.0, 1.0)
        _check("weight_decay value", weight_decay)
        _check("clip_threshold value", clip_threshold)
        if decay_rate > 0:
            raise ValueError(f"Invalid decay_rate: {decay_rate} (must be <= 0)")
        defaults = {"lr": lr, "eps": tuple(eps), "clip_threshold": clip_threshold, "decay_rate": decay_rate,
                        "beta1": beta1, "weight_decay": weight_decay, "scale_parameter": scale_parameter,
                        "relative_step": relative_step, "warmup_init": warmup_init}
        super().__init__(params, defaults, enable_global_step=True)

    def preinitialize(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if group["beta1"] is not None:
                    state["exp_avg"] = zeros_like(p)
                if p.dim() >= 2:
                    state["exp_avg_sq_row"] = zeros(p.shape[:-1], dtype=p.dtype, device=p.device)
                    state["exp_avg_sq_col"] = zeros(p.shape[:-2] + p.shape[-1:], dtype=p.dtype,
                                                           device=p.device)
                else:
                    state["exp_avg_sq"] = zeros_like(p)

    def state_names_to_sparsify(self) -> list[str]:
        return ["exp_avg", "exp_avg_sq"]

    def _step_group(self, group: dict[str, Any]) -> None:
        for p, grad, step in zip(*self._group_tensors(group, "step")):
            state = self.state[p]
            second = (state["exp_avg_sq_row"], state["exp_avg_sq_col"]) if p.dim() >= 2 else (state["exp_avg_sq"],)
            adafactor(p, grad, second, state.get("exp_avg"), step, lr=group["lr"], eps=group["eps"],
                      clip_threshold=group["clip_threshold"], decay_rate=group["decay_rate"], beta1=group["beta1"],
                      weight_decay=group["weight_decay"], scale_parameter=group["scale_parameter"],
                      relative_step=group["relative_step"], warmup_init=group["warmup_init"])


Adafactor.__doc__ = _docs.fill(Adafactor.__doc__)


def _rms(t: Tensor) -> Tensor:
    return t.square().mean().sqrt()


def adafactor(param: Tensor, grad: Tensor, second: tuple[Tensor, ...], exp_avg: Tensor | None, step: Tensor,
              *, lr: Tensor, eps: tuple[float, float], clip_threshold: float, decay_rate: float,
              beta1: float | None, weight_decay: float, scale_parameter: bool, relative_step: bool,
              warmup_init: bool) -> None:
    """Functional Adafactor for one parameter, in the vendor's order of operations; see :class:`Adafactor`."""
    step.add_(1)
    if relative_step:  # a cs-run extra (the vendor refuses relative_step)
        start = 1e-6 * step if warmup_init else torch.full_like(step, 1e-2)
        rho = torch.minimum(start, step.rsqrt())
    else:
        rho = lr
    alpha = torch.maximum(_rms(param), torch.full_like(step, eps[1])) * rho if scale_parameter else rho
    beta2t = 1.0 - torch.pow(step, torch.full_like(step, decay_rate))
    update = grad**2 + eps[0]
    if len(second) == 2:
        row, col = second
        row.mul_(beta2t).add_(update.mean(dim=-1).mul(1.0 - beta2t))
        col.mul_(beta2t).add_(update.mean(dim=-2).mul(1.0 - beta2t))
        row_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt().unsqueeze(-1)
        update = torch.mul(row_factor, col.rsqrt().unsqueeze(-2)).mul_(grad)
    else:
        second[0].mul_(beta2t).add_(update.mul(1.0 - beta2t))
        update = second[0].rsqrt().mul_(grad)
    update.div_(torch.clamp(_rms(update) / clip_threshold, min=1.0))
    update.mul_(alpha)
    if exp_avg is not None:
        exp_avg.mul_(beta1).add_(update.mul(1 - beta1))
        update = exp_avg
    param.sub_(param.mul(weight_decay * alpha))
    param.sub_(update)
