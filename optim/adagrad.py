"""Adagrad, as the vendor computes it (eps 1e-6, eps added to ``sqrt(sum)``)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from cs_run.creation import full_like

from . import _docs
from ._functional import decayed
from .optimizer import ParamsT, _checked_defaults, _CoreOptimizer

__all__ = ["Adagrad", "adagrad"]


class Adagrad(_CoreOptimizer):
    """Adagrad (Duchi et al., 2011).

    .. code-block:: text

        step += 1;  g = -grad if maximize else grad;  g = g + weight_decay * p
        sum += g * g
        p -= lr * (g / (1 + (step - 1) * lr_decay)) / (sqrt(sum) + eps)

    Args:
        {params}
        lr: learning rate (default: 1e-2).
        lr_decay: learning-rate decay per step (default: 0).
        {weight_decay}
        initial_accumulator_value: starting value of ``sum`` (default: 0).
        eps: term added to the denominator (default: 1e-6, the vendor's; torch uses 1e-10).
        {maximize}

    {compliant}
    """

    def __init__(self, params: ParamsT, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-6, maximize: bool = False) -> None:
        defaults = _checked_defaults(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                                     initial_accumulator_value=initial_accumulator_value, maximize=maximize)
        super().__init__(params, defaults, enable_global_step=True)

    def preinitialize(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["sum"] = full_like(p, group["initial_accumulator_value"])

    def state_names_to_sparsify(self) -> list[str]:
        return ["sum"]

    def _step_group(self, group: dict[str, Any]) -> None:
        adagrad(*self._tensors(group, "sum", "step"), lr=group["lr"], lr_decay=group["lr_decay"], eps=group["eps"],
                weight_decay=group["weight_decay"])


Adagrad.__doc__ = _docs.fill(Adagrad.__doc__)


def adagrad(params: list[Tensor], grads: list[Tensor], state_sums: list[Tensor], steps: list[Tensor], *,
            lr: Tensor, lr_decay: float, eps: float, weight_decay: Any) -> None:
    """Functional Adagrad; see :class:`Adagrad`. Mutates params and state (``steps`` included) in place."""
    for p, grad, state_sum, step in zip(params, grads, state_sums, steps):
        step.add_(1)
        grad = decayed(grad, p, weight_decay)
        state_sum.addcmul_(grad, grad, value=1.0)
        std = state_sum.sqrt().add_(eps)
        grad = grad.div(1.0 + (step - 1.0) * lr_decay)
        p.addcdiv_(-lr * grad, std)
