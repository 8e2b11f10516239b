"""The pieces of math several optimizers' functional cores share, each written once.

Every helper is the exact op sequence the optimizers spelled out before (same ops, same order, same
Python scalars), so a core built from them rounds bit for bit as the vendor's rule does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["decayed", "ema_", "ema_square_", "foreach_mul", "weight_decay_"]


def ema_(avg: Tensor, value: Tensor, beta: float) -> Tensor:
    """``avg = beta * avg + (1 - beta) * value`` in place (a first moment, a momentum buffer)."""
    return avg.mul_(beta).add_(value, alpha=1 - beta)


def ema_square_(avg: Tensor, value: Tensor, beta: float) -> Tensor:
    """``avg = beta * avg + (1 - beta) * value * value`` in place (a second moment)."""
    return avg.mul_(beta).addcmul_(value, value, value=1 - beta)


def decayed(grad: Tensor, param: Tensor, weight_decay: Any) -> Tensor:
    """The vendor's L2 step ``grad + param * weight_decay``, skipped for a Python zero (it would add
    exact zeros in two extra passes). A scheduled weight decay is a tensor and always applied."""
    if not isinstance(weight_decay, Tensor) and weight_decay == 0:
        return grad
    return grad + param * weight_decay


def weight_decay_(param: Tensor, grad: Tensor, *, lr: Tensor, weight_decay: Any, decoupled: bool) -> Tensor:
    """Decoupled decay (``p *= 1 - lr * weight_decay``, in place) or L2 (:func:`decayed`); returns the grad
    the rule goes on with (the L2-decayed one, or ``grad`` itself)."""
    if decoupled:
        param.mul_(1 - lr * weight_decay)
        return grad
    return decayed(grad, param, weight_decay)


_WIDE = (torch.float32, torch.float64)


def foreach_mul(tensors: list[Tensor], scalar: Any, inplace: bool = False, scalar_first: bool = False) -> list[Tensor]:
    """``t * scalar`` (``t.mul_(scalar)``; ``scalar * t`` with ``scalar_first``) for every ``t``, rounded
    exactly as that per-tensor op rounds it.

    Two per-tensor ops round a float16/bfloat16 tensor's product differently from torch's multi-tensor
    multiply: by a Python number (foreach rounds the number to the tensor's dtype first, the per-tensor
    op keeps it in float32) and by a 0-d tensor written first (there the per-tensor op rounds the 0-d
    tensor). Those tensors take the per-tensor op; everything else is one foreach call.
    """
    narrow = (not isinstance(scalar, Tensor)) or scalar_first
    if not narrow or all(t.dtype in _WIDE for t in tensors):
        if inplace:
            torch._foreach_mul_(tensors, scalar)
            return tensors
        return list(torch._foreach_mul(tensors, scalar))
    wide = [t for t in tensors if t.dtype in _WIDE]
    done = iter(foreach_mul(wide, scalar, inplace) if wide else [])

    def one(t: Tensor) -> Tensor:
        if inplace:
            return t.mul_(scalar)
        return scalar * t if scalar_first else t * scalar

    return [next(done) if t.dtype in _WIDE else one(t) for t in tensors]
