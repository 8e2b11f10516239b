"""Adadelta; the vendor's rule is torch's."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from . import _docs
from ._functional import decayed, ema_square_
from .optimizer import ParamsT, _checked_defaults, _CoreOptimizer

__all__ = ["Adadelta", "adadelta"]


class Adadelta(_CoreOptimizer):
    """Adadelta (Zeiler, 2012).

    .. code-block:: text

        g = -grad if maximize else grad;  g = g + weight_decay * p
        v = rho * v + (1 - rho) * g * g
        delta = sqrt(u + eps) / sqrt(v + eps) * g;  u = rho * u + (1 - rho) * delta * delta
        p -= lr * delta

    Args:
        {params}
        lr: coefficient that scales delta (default: 1.0).
        rho: coefficient of the running averages (default: 0.9).
        eps: term added inside the square roots (default: 1e-6).
        {weight_decay}
        {maximize}

    {compliant}
    """

    def __init__(self, params: ParamsT, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0.0, maximize: bool = False) -> None:
        super().__init__(params, _checked_defaults(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay,
                                                   maximize=maximize))

    def preinitialize(self) -> None:
        self._zeros_like_params("square_avg", "acc_delta")

    def state_names_to_sparsify(self) -> list[str]:
        return ["square_avg", "acc_delta"]

    def _step_group(self, group: dict[str, Any]) -> None:
        adadelta(*self._tensors(group, "square_avg", "acc_delta"), lr=group["lr"], rho=group["rho"],
                 eps=group["eps"], weight_decay=group["weight_decay"])


Adadelta.__doc__ = _docs.fill(Adadelta.__doc__)


def adadelta(params: list[Tensor], grads: list[Tensor], square_avgs: list[Tensor], acc_deltas: list[Tensor], *,
             lr: Tensor, rho: float, eps: float, weight_decay: Any) -> None:
    """Functional Adadelta; see :class:`Adadelta`. Mutates params and state in place."""
    for p, grad, square_avg, acc_delta in zip(params, grads, square_avgs, acc_deltas):
        grad = decayed(grad, p, weight_decay)
        ema_square_(square_avg, grad, rho)
        std = square_avg.add(eps).sqrt_()
        delta = acc_delta.add(eps).sqrt_().div_(std).mul_(grad)
        ema_square_(acc_delta, delta, rho)
        p.add_(-lr * delta)
