"""RMSprop, as the vendor computes it (eps outside the square root, torch's placement)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from cs_run.creation import zeros_like

from . import _docs
from ._functional import decayed, ema_, ema_square_
from .optimizer import ParamsT, _checked_defaults, _CoreOptimizer

__all__ = ["RMSprop", "rmsprop"]


class RMSprop(_CoreOptimizer):
    """RMSprop (Hinton's lecture 6e), optionally centered and with momentum.

    .. code-block:: text

        g = -grad if maximize else grad;  g = g + weight_decay * p
        v = alpha * v + (1 - alpha) * g * g
        avg = sqrt(v - a * a) + eps   with a = alpha * a + (1 - alpha) * g   (centered)
            | sqrt(v) + eps
        buf = momentum * buf + g / avg;  p -= lr * buf      (momentum > 0)
        p -= lr * g / avg                                   (otherwise)

    Args:
        {params}
        lr: learning rate (default: 1e-2).
        alpha: smoothing constant (default: 0.99).
        eps: term added to the denominator (default: 1e-8).
        {weight_decay}
        momentum: momentum factor (default: 0).
        centered: normalize by the variance estimate (default: False).
        {maximize}

    {compliant}
    """

    def __init__(self, params: ParamsT, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False,
                 maximize: bool = False) -> None:
        super().__init__(params, _checked_defaults(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered,
                                                   weight_decay=weight_decay, maximize=maximize))

    def preinitialize(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["square_avg"] = zeros_like(p)
                if group["momentum"] > 0:
                    self.state[p]["momentum_buffer"] = zeros_like(p)
                if group["centered"]:
                    self.state[p]["grad_avg"] = zeros_like(p)

    def state_names_to_sparsify(self) -> list[str]:
        return ["square_avg", "momentum_buffer", "grad_avg"]

    def _step_group(self, group: dict[str, Any]) -> None:
        names = ["square_avg"] + (["momentum_buffer"] if group["momentum"] > 0 else [])
        names += ["grad_avg"] if group["centered"] else []
        params, grads, *lists = self._tensors(group, *names)
        state = dict(zip(names, lists))
        rmsprop(params, grads, state["square_avg"], state.get("momentum_buffer"), state.get("grad_avg"),
                lr=group["lr"], alpha=group["alpha"], eps=group["eps"], weight_decay=group["weight_decay"],
                momentum=group["momentum"])


RMSprop.__doc__ = _docs.fill(RMSprop.__doc__)


def rmsprop(params: list[Tensor], grads: list[Tensor], square_avgs: list[Tensor], bufs: list[Tensor] | None,
            grad_avgs: list[Tensor] | None, *, lr: Tensor, alpha: float, eps: float, weight_decay: Any,
            momentum: float) -> None:
    """Functional RMSprop; see :class:`RMSprop`. ``bufs`` is None without momentum, ``grad_avgs`` None
    unless centered. Mutates params and state in place."""
    for index, (p, grad, square_avg) in enumerate(zip(params, grads, square_avgs)):
        grad = decayed(grad, p, weight_decay)
        ema_square_(square_avg, grad, alpha)
        if grad_avgs is not None:
            grad_avg = ema_(grad_avgs[index], grad, alpha)
            avg = square_avg.addcmul(grad_avg, grad_avg, value=-1.0).sqrt_().add_(eps)
        else:
            avg = square_avg.sqrt().add_(eps)
        if bufs is not None:
            buf = bufs[index]
            buf.mul_(momentum).addcdiv_(grad, avg)
            p.add_(-lr * buf)
        else:
            p.addcdiv_(-lr * grad, avg)
