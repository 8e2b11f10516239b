"""SGD with momentum, dampening, Nesterov and weight decay, with the vendor's zero-started buffer."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cs_run.creation import zeros_like

from . import _docs
from ._functional import foreach_mul
from .optimizer import ParamsT, _checked_defaults, _CoreOptimizer

__all__ = ["SGD", "sgd"]


class SGD(_CoreOptimizer):
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
        defaults = _checked_defaults(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                     nesterov=nesterov, maximize=maximize)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Invalid nesterov: True (requires momentum > 0 and dampening == 0)")
        super().__init__(params, defaults)

    def preinitialize(self) -> None:
        for group in self.param_groups:
            if group["momentum"] != 0:
                for p in group["params"]:
                    self.state[p]["momentum_buffer"] = zeros_like(p)

    def state_names_to_sparsify(self) -> list[str]:
        return ["momentum_buffer"]

    def _step_group(self, group: dict[str, Any]) -> None:
        """The rule above with multi-tensor ops, bit-identical to a per-parameter loop (see ``AdamBase._step_group``)."""
        momentum = group["momentum"]
        for params, grads, *bufs in self._foreach_chunks(group, *(["momentum_buffer"] if momentum != 0 else [])):
            sgd(params, grads, bufs[0] if bufs else None, lr=group["lr"], momentum=momentum,
                dampening=group["dampening"], weight_decay=group["weight_decay"], nesterov=group["nesterov"])


SGD.__doc__ = _docs.fill(SGD.__doc__)


def sgd(params: list[Tensor], grads: list[Tensor], bufs: list[Tensor] | None, *, lr: Tensor, momentum: float,
        dampening: float, weight_decay: Any, nesterov: bool) -> None:
    """Functional SGD over one chunk of params (multi-tensor ops); see :class:`SGD`. ``bufs`` is None
    without momentum. Mutates params and bufs in place."""
    if isinstance(weight_decay, Tensor) or weight_decay != 0:  # the vendor's L2: g + p * wd
        grads = torch._foreach_add(grads, foreach_mul(params, weight_decay))
    if momentum != 0:
        foreach_mul(bufs, momentum, inplace=True)
        torch._foreach_add_(bufs, grads, alpha=1.0 - dampening)
        grads = torch._foreach_add(grads, bufs, alpha=momentum) if nesterov else bufs
    torch._foreach_add_(params, foreach_mul(grads, -lr, scalar_first=True))  # p += -lr * g
