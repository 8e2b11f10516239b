"""SGD with momentum, dampening, Nesterov and weight decay, with the vendor's zero-started buffer."""

from __future__ import annotations

from typing import Any

import torch

from cs_run.creation import zeros_like

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _decayed, _run_closure

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
        loss = _run_closure(closure)
        for group in self.param_groups:
            momentum, lr = group["momentum"], group["lr"]
            for p, grad in self._params_with_grads(group):
                grad = _decayed(grad, p, group["weight_decay"])
                if momentum != 0:
                    buf = self.state[p]["momentum_buffer"]
                    buf.mul_(momentum).add_(grad, alpha=1.0 - group["dampening"])
                    if group["nesterov"]:
                        grad = grad.add(buf, alpha=momentum)
                    else:
                        grad = buf
                p.add_(-lr * grad)
        return loss


SGD.__doc__ = _docs.fill(SGD.__doc__)
