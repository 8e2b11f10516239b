"""SGD with momentum, dampening, Nesterov and weight decay, with the vendor's zero-started buffer."""

from __future__ import annotations

from typing import Any

import torch

from cs_run.creation import zeros_like

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _foreach_mul, _run_closure

__all__ = ["SGD"]


class SGD(Optimizer):
    """Stochastic gradient descent (optionally with momentum), as the vendor computes it.

    .. code-block:: text

        g = -grad if maximize else grad;  g = g + weight_decay * p
        buf = momentum * buf + (1 - dampening) * g       (buf starts at zero)
        g = g + momentum * buf if nesterov else buf
        p -= lr * g

    Args:
        {params}
        lr: learning rate (required, as in the vendor's SGD).
        momentum: momentum factor (default: 0).
        dampening: dampening for momentum (default: 0).
        {weight_decay}
        nesterov: Nesterov momentum (default: False).
        {maximize}

    {compliant}

    Note:
        torch.optim.SGD starts the buffer at the first gradient, undamped; the vendor (and this class)
        starts it at zero, so the first step is ``(1 - dampening) * g``. With ``dampening == 0`` both
        agree; with dampening they differ (the vendor's rule is kept so its runs continue here).
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        maximize: bool = False,
    ) -> None:
        _check("learning rate", lr)
        _check("momentum value", momentum)
        _check("dampening value", dampening)
        _check("weight_decay value", weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Invalid nesterov: True (requires momentum > 0 and dampening == 0)")
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening, "weight_decay": weight_decay,
                    "nesterov": nesterov, "maximize": maximize}
        super().__init__(params, defaults)

    def preinitialize(self) -> None:
        for group in self.param_groups:
            if group["momentum"] != 0:
                for p in group["params"]:
                    self.state[p]["momentum_buffer"] = zeros_like(p)

    def state_names_to_sparsify(self) -> list[str]:
        return ["momentum_buffer"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """The rule above with multi-tensor ops, bit-identical to a per-parameter loop (see ``AdamBase.step``)."""
        loss = _run_closure(closure)
        for group in self.param_groups:
            momentum = group["momentum"]
            for params, grads, *bufs in self._foreach_chunks(group, *(["momentum_buffer"] if momentum != 0 else [])):
                weight_decay = group["weight_decay"]
                if isinstance(weight_decay, torch.Tensor) or weight_decay != 0:  # the vendor's L2: g + p * wd
                    grads = torch._foreach_add(grads, _foreach_mul(params, weight_decay))
                if momentum != 0:
                    _foreach_mul(bufs[0], momentum, inplace=True)
                    torch._foreach_add_(bufs[0], grads, alpha=1.0 - group["dampening"])
                    grads = torch._foreach_add(grads, bufs[0], alpha=momentum) if group["nesterov"] else bufs[0]
                torch._foreach_add_(params, _foreach_mul(grads, -group["lr"], scalar_first=True))  # p += -lr * g
        return loss


SGD.__doc__ = _docs.fill(SGD.__doc__)
