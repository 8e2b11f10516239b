"""Lion (evolved sign momentum), as the vendor computes it."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from . import _docs
from ._functional import ema_
from .optimizer import ParamsT, _checked_defaults, _CoreOptimizer

__all__ = ["Lion", "lion"]


class Lion(_CoreOptimizer):
    """Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2).

    .. code-block:: text

        g = -grad if maximize else grad
        p *= 1 - lr * weight_decay
        p -= lr * sign(beta1 * m + (1 - beta1) * g)
        m = beta2 * m + (1 - beta2) * g

    Args:
        {params}
        lr: learning rate (default: 1e-4).
        betas: interpolation for the update and for the momentum (default: (0.9, 0.99)).
        weight_decay: decoupled weight decay (default: 0).
        {maximize}

    {compliant}
    """

    def __init__(self, params: ParamsT, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, maximize: bool = False) -> None:
        super().__init__(params, _checked_defaults(lr=lr, betas=betas, weight_decay=weight_decay,
                                                   maximize=maximize))

    def preinitialize(self) -> None:
        self._zeros_like_params("exp_avg")

    def state_names_to_sparsify(self) -> list[str]:
        return ["exp_avg"]

    def _step_group(self, group: dict[str, Any]) -> None:
        lion(*self._tensors(group, "exp_avg"), lr=group["lr"], betas=group["betas"], weight_decay=group["weight_decay"])


Lion.__doc__ = _docs.fill(Lion.__doc__)


def lion(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], *, lr: Tensor,
         betas: tuple[float, float], weight_decay: Any) -> None:
    """Functional Lion; see :class:`Lion`. Mutates params and state in place."""
    beta1, beta2 = betas
    for p, grad, exp_avg in zip(params, grads, exp_avgs):
        p.mul_(1 - lr * weight_decay)
        update = exp_avg.clone().mul_(beta1).add(grad, alpha=1 - beta1).sign_()
        p.add_(-lr * update)
        ema_(exp_avg, grad, beta2)
