"""Muon (momentum orthogonalized by Newton-Schulz), the vendor's 2.10 definition, working."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cs_run.creation import zeros_like

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _run_closure

__all__ = ["Muon"]

_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # the quintic of Keller Jordan's Muon


def zeropower_via_newtonschulz5(grad: Tensor, steps: int = 5) -> Tensor:
    """The nearest semi-orthogonal matrix to ``grad`` (``U V^T`` of its SVD), approximately, in bfloat16."""
    a, b, c = _NS_COEFFICIENTS
    x = grad.bfloat16()
    transpose = grad.size(-2) > grad.size(-1)
    if transpose:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if transpose else x


class Muon(Optimizer):
    """Muon (Jordan et al., 2024): SGD momentum whose update is orthogonalized by Newton-Schulz.

    .. code-block:: text

        buf = momentum * buf + (1 - momentum) * g
        u = g + momentum * buf if nesterov else buf        (4-d: viewed as (out, -1))
        u = NewtonSchulz5(u, ns_steps)                     (bfloat16, as the vendor)
        lr' = lr * 0.2 * sqrt(max(rows, cols))
        p *= 1 - lr' * weight_decay;  p -= lr' * u

    Args:
        {params}
        lr: learning rate (default: 0.02).
        weight_decay: decoupled weight decay (default: 0.01).
        momentum: momentum factor (default: 0.95).
        nesterov: Nesterov momentum (default: True).
        ns_steps: Newton-Schulz iterations (default: 5).

    {compliant}

    Note:
        Only matrices (and 4-d convolution kernels) can be orthogonalized: a parameter with fewer
        than 2 dimensions is refused at construction (put it in another optimizer's group). The
        vendor's 2.10 Muon cannot step (its Newton-Schulz helper is called as a method and fails,
        and its momentum buffer is never written back); this class does what its docstring says,
        with the buffer updated in place.
    """

    def __init__(self, params: ParamsT, lr: float = 0.02, weight_decay: float = 0.01, momentum: float = 0.95,
                 nesterov: bool = True, ns_steps: int = 5) -> None:
        _check("learning rate", lr)
        _check("weight_decay value", weight_decay, 0.0, 1.0)
        _check("momentum value", momentum, 0.0, 1.0)
        _check("ns_steps", ns_steps)
        defaults = {"lr": lr, "weight_decay": weight_decay, "momentum": momentum, "nesterov": nesterov,
                    "ns_steps": int(ns_steps)}
        super().__init__(params, defaults)

    def preinitialize(self) -> None:
        for group in self.param_groups:
            for index, p in enumerate(group["params"]):
                if p.dim() < 2:
                    raise ValueError(f"Invalid parameter {index} of shape {tuple(p.shape)} for Muon (needs 2 or "
                                     "more dimensions); optimize it with another optimizer's param group")
                if group["momentum"] != 0:
                    self.state[p]["momentum_buffer"] = zeros_like(p)

    def state_names_to_sparsify(self) -> list[str]:
        return ["momentum_buffer"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = _run_closure(closure)
        for group in self.param_groups:
            momentum = group["momentum"]
            for p, grad in self._params_with_grads(group):
                update = grad
                if momentum != 0:
                    buf = self.state[p]["momentum_buffer"]
                    buf.mul_(momentum).add_(grad, alpha=1 - momentum)
                    update = grad + buf * momentum if group["nesterov"] else buf
                if update.dim() == 4:
                    update = update.reshape(len(update), -1)
                update = zeropower_via_newtonschulz5(update, group["ns_steps"]).reshape(p.shape)
                rows, cols = p.shape[:2]
                lr = group["lr"] * (0.2 * max(rows, cols) ** 0.5)
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(-lr * update.to(p.dtype))
        return loss


Muon.__doc__ = _docs.fill(Muon.__doc__)
