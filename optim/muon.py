"""Muon (momentum orthogonalized by Newton-Schulz), the vendor's 2.10 definition, working."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from cs_run.creation import zeros_like

from . import _docs
from ._functional import ema_
from .optimizer import ParamsT, _check, _CoreOptimizer

__all__ = ["Muon", "muon", "zeropower_via_newtonschulz5"]

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


class Muon(_CoreOptimizer):
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

    def _step_group(self, group: dict[str, Any]) -> None:
        momentum = group["momentum"]
        params, grads, *bufs = self._tensors(group, *(["momentum_buffer"] if momentum != 0 else []))
        muon(params, grads, bufs[0] if bufs else None, lr=group["lr"], weight_decay=group["weight_decay"],
             momentum=momentum, nesterov=group["nesterov"], ns_steps=group["ns_steps"])


Muon.__doc__ = _docs.fill(Muon.__doc__)


def muon(params: list[Tensor], grads: list[Tensor], bufs: list[Tensor] | None, *, lr: Tensor, weight_decay: float,
         momentum: float, nesterov: bool, ns_steps: int) -> None:
    """Functional Muon; see :class:`Muon`. ``bufs`` is None without momentum. Mutates params and bufs in place."""
    for index, (p, grad) in enumerate(zip(params, grads)):
        update = grad
        if momentum != 0:
            buf = ema_(bufs[index], grad, momentum)
            update = grad + buf * momentum if nesterov else buf
        if update.dim() == 4:
            update = update.reshape(len(update), -1)
        update = zeropower_via_newtonschulz5(update, ns_steps).reshape(p.shape)
        rows, cols = p.shape[:2]
        scaled_lr = lr * (0.2 * max(rows, cols) ** 0.5)
        p.mul_(1 - scaled_lr * weight_decay)
        p.add_(-scaled_lr * update.to(p.dtype))
