"""SGD with momentum, dampening, Nesterov and weight decay; numerically torch.optim.SGD."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cs_run.creation import zeros, zeros_like

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _foreach_ok, _run_closure

__all__ = ["SGD", "sgd"]


class SGD(Optimizer):
    """Stochastic gradient descent (optionally with momentum).

    .. code-block:: text

        g = -grad if maximize else grad;  g += weight_decay * p
        buf = momentum * buf + (1 - dampening) * g      (buf = g on the first step)
        g = g + momentum * buf if nesterov else buf
        p -= lr * g

    Args:
        {params}
        lr: learning rate (default: 1e-3).
        momentum: momentum factor (default: 0).
        dampening: dampening for momentum (default: 0).
        {weight_decay}
        nesterov: Nesterov momentum (default: False).
        {maximize}

    {compliant}

    Note:
        torch creates the momentum buffer from the first gradient. Here it is preinitialized to zeros;
        with ``dampening == 0`` that is the same number. With ``dampening != 0`` a ``step`` state
        tensor picks the first-step formula with ``torch.where``.
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
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
            if group["momentum"] == 0:
                continue
            for p in group["params"]:
                self.state[p]["momentum_buffer"] = zeros_like(p)
                if group["dampening"] != 0:
                    self.state[p]["step"] = zeros((), dtype=torch.float32, device=p.device)

    def state_names_to_sparsify(self) -> list[str]:
        return ["momentum_buffer"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = _run_closure(closure)
        for group in self.param_groups:
            uses_buf = group["momentum"] != 0
            names = (["momentum_buffer"] if uses_buf else []) + (
                ["step"] if uses_buf and group["dampening"] != 0 else [])
            params, grads, *lists = self._group_tensors(group, *names)
            bufs = lists[0] if uses_buf else []
            steps = lists[1] if len(lists) > 1 else []
            sgd(params, grads, bufs, steps, lr=group["lr"], momentum=group["momentum"],
                dampening=group["dampening"], weight_decay=group["weight_decay"],
                nesterov=group["nesterov"], maximize=group["maximize"])
        return loss


SGD.__doc__ = _docs.fill(SGD.__doc__)


def sgd(params: list[Tensor], grads: list[Tensor], bufs: list[Tensor], steps: list[Tensor], *,
        lr: Tensor, momentum: float, dampening: float, weight_decay: float, nesterov: bool,
        maximize: bool, foreach: bool | None = None) -> None:
    """Functional SGD; see :class:`SGD`. Mutates params, bufs and steps in place."""
    if not params:
        return
    use_foreach = _foreach_ok(params) if foreach is None else foreach
    impl = _foreach_sgd if use_foreach else _single_tensor_sgd
    impl(params, grads, bufs, steps, lr=lr, momentum=momentum, dampening=dampening,
         weight_decay=weight_decay, nesterov=nesterov, maximize=maximize)


def _single_tensor_sgd(params: list[Tensor], grads: list[Tensor], bufs: list[Tensor], steps: list[Tensor],
                       *, lr: Tensor, momentum: float, dampening: float, weight_decay: float,
                       nesterov: bool, maximize: bool) -> None:
    neg_lr = lr.neg()
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        if momentum != 0:
            buf = bufs[i]
            buf.mul_(momentum).add_(grad, alpha=1 - dampening)
            if dampening != 0:  # torch's first step copies the gradient undamped
                steps[i].add_(1)
                buf.copy_(torch.where(steps[i] == 1, grad, buf))
            grad = grad.add(buf, alpha=momentum) if nesterov else buf
        param.addcmul_(grad, neg_lr)  # one pass, lr stays a tensor (add_(alpha=) needs a number)


def _foreach_sgd(params: list[Tensor], grads: list[Tensor], bufs: list[Tensor], steps: list[Tensor],
                 *, lr: Tensor, momentum: float, dampening: float, weight_decay: float,
                 nesterov: bool, maximize: bool) -> None:
    if maximize:
        grads = torch._foreach_neg(grads)
    if weight_decay != 0:
        grads = torch._foreach_add(grads, params, alpha=weight_decay)
    if momentum != 0:
        torch._foreach_mul_(bufs, momentum)
        torch._foreach_add_(bufs, grads, alpha=1 - dampening)
        if dampening != 0:
            torch._foreach_add_(steps, 1)
            for buf, grad, step in zip(bufs, grads, steps):
                buf.copy_(torch.where(step == 1, grad, buf))
        grads = torch._foreach_add(grads, bufs, alpha=momentum) if nesterov else bufs
    neg_lr = lr.neg()
    torch._foreach_addcmul_(params, grads, [neg_lr] * len(params))
