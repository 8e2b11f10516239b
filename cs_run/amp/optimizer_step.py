"""``cstorch.amp.optimizer_step``: the usual scale -> backward -> unscale -> clip -> step -> update."""

from __future__ import annotations

import torch

from cs_run.amp import _multi_tensor
from cs_run.amp.grad_scaler import GradScaler
from cs_run.errors import ParamsError

__all__ = ["apply_gradients", "check_clipping", "optimizer_step"]


def optimizer_step(
    loss: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    grad_scaler: GradScaler | None,
    max_gradient_norm: float | None = None,
    max_gradient_value: float | None = None,
    *,
    max_gradient_val: float | None = None,
) -> None:
    """One optimizer step from ``loss``, with optional loss scaling and gradient clipping.

    Runs ``scale(loss).backward()``, then :func:`apply_gradients` (``unscale_``, clipping, ``step``,
    ``update``, ``zero_grad``). Every part is tensor ops only, so it can sit inside a traced step.

    Args:
        loss: The loss of this step (a scalar tensor).
        optimizer: The optimizer to step.
        grad_scaler: A :class:`GradScaler`, or None for a plain backward and step.
        max_gradient_norm: Clip the global gradient norm of the optimizer's parameters to this.
        max_gradient_value: Clamp every gradient element to ``[-value, value]``.
        max_gradient_val: The seed docs' spelling of ``max_gradient_value``.

    Raises:
        ParamsError: both a norm and a value clip were given, or a clip bound is not > 0.
    """
    if max_gradient_val is not None:
        if max_gradient_value is not None and max_gradient_value != max_gradient_val:
            raise ParamsError("optimizer_step: pass max_gradient_value or max_gradient_val, not both")
        max_gradient_value = max_gradient_val
    check_clipping(max_gradient_norm, max_gradient_value, where="optimizer_step")
    if grad_scaler is not None:
        grad_scaler.scale(loss).backward()
    else:
        loss.backward()
    apply_gradients(optimizer, grad_scaler, max_gradient_norm, max_gradient_value)


def check_clipping(max_gradient_norm: float | None, max_gradient_value: float | None, where: str) -> None:
    """Clipping is by norm or by value, with a bound > 0.

    Raises:
        ParamsError: both were given, or a bound is not a number > 0 (``where`` heads the message).
    """
    if max_gradient_norm is not None and max_gradient_value is not None:
        raise ParamsError(f"{where}: gradient clipping by norm and by value are mutually exclusive; "
                          f"got max_gradient_norm={max_gradient_norm} and max_gradient_value={max_gradient_value}")
    for name, bound in (("max_gradient_norm", max_gradient_norm), ("max_gradient_value", max_gradient_value)):
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0):
            raise ParamsError(f"{where}: invalid {name}: {bound!r} (must be a number > 0)")


def apply_gradients(optimizer: torch.optim.Optimizer, grad_scaler: GradScaler | None = None,
                    max_gradient_norm: float | None = None, max_gradient_value: float | None = None) -> None:
    """The gradient step after the backward pass(es), one copy for the runners and :func:`optimizer_step`.

    Unscales the gradients (with a scaler, always: clipping and the optimizer see the true
    gradients, as in the vendor's ``optimizer_step``), clips them by norm or by value, steps the
    optimizer (through the scaler, which skips the step on an overflow, then updates its scale)
    and sets the gradients to None. Tensor ops only, so it can sit inside a traced step.
    """
    if grad_scaler is not None:
        grad_scaler.unscale_(optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    foreach = True if _multi_tensor.multi_tensor_kernels(params) else None  # None: torch's default
    if max_gradient_norm is not None:
        # error_if_nonfinite stays False: an overflow is handled by the scaler's skip, not an error.
        torch.nn.utils.clip_grad_norm_(params, float(max_gradient_norm), foreach=foreach)
    elif max_gradient_value is not None:
        torch.nn.utils.clip_grad_value_(params, float(max_gradient_value), foreach=foreach)
    if grad_scaler is not None:
        grad_scaler.step(optimizer)
        grad_scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
