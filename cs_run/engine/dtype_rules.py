"""Dtype rules of the traced CSX step: the ones eager torch enforces and fake tensors do not, and the
one cast the vendor's CSX stack makes.

Fake-tensor (meta) kernels accept dtype combinations that eager torch rejects, so a step could trace,
pass validate-only and then fail at replay inside the fx graph. Here the trace raises where eager
would, at the user's line:

* matrix products (``F.linear``, ``matmul``, ``mm``, ``bmm``, ``addmm``, ``baddbmm``) of two different
  floating dtypes outside autocast: eager's "must have the same dtype" error;
* class-index targets of ``nll_loss`` / ``cross_entropy`` in int32 (the vendor's CSX input dtype, which
  the vendor's fc_mnist data produces on CSX) are widened to int64, as the vendor's CSX compiler accepts
  them; other integer types raise eager's error.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch
import torch.nn.functional as F

from cs_run.engine.compliance import user_frame_location
from cs_run.errors import ComplianceError

__all__ = ["apply"]

logger = logging.getLogger(__name__)

_MATMULS = {F.linear: (0, 1), torch.matmul: (0, 1), torch.mm: (0, 1), torch.bmm: (0, 1),
            torch.Tensor.__matmul__: (0, 1), torch.Tensor.__rmatmul__: (0, 1), torch.Tensor.matmul: (0, 1),
            torch.Tensor.mm: (0, 1), torch.Tensor.bmm: (0, 1), torch.addmm: (1, 2), torch.baddbmm: (1, 2),
            torch.Tensor.addmm: (1, 2), torch.Tensor.baddbmm: (1, 2)}
_TARGETS = {F.nll_loss: 1, F.cross_entropy: 1}
_WIDENED: set[str] = set()


def _autocast_on(t: torch.Tensor) -> bool:
    try:
        return torch.is_autocast_enabled(t.device.type)
    except TypeError:  # older torch: no device argument
        return torch.is_autocast_enabled()


def _arg(args: tuple, kwargs: dict, index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


def apply(func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Check ``func(*args, **kwargs)`` as eager torch would; returns the (possibly cast) arguments."""
    if func in _MATMULS:
        i, j = _MATMULS[func]
        a, b = (args[i] if len(args) > i else None), (args[j] if len(args) > j else None)
        if func is F.linear:
            a, b = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "weight")
        if (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype != b.dtype
                and a.is_floating_point() and b.is_floating_point() and not _autocast_on(a)):
            where = user_frame_location(sys._getframe(2))
            raise ComplianceError(
                f"{where}: {getattr(func, '__name__', func)}: mat1 and mat2 must have the same dtype, but got "
                f"{_name(a.dtype)} and {_name(b.dtype)} (eager torch rejects this, so the CSX step would fail "
                "when it runs); cast one operand, e.g. inputs.float(), or enable mixed precision "
                "(model.mixed_precision: true)")
    elif func in _TARGETS:
        index = _TARGETS[func]
        target = _arg(args, kwargs, index, "target")
        if isinstance(target, torch.Tensor) and not target.is_floating_point() \
                and target.dtype not in (torch.int64, torch.uint8):
            if target.dtype != torch.int32:
                where = user_frame_location(sys._getframe(2))
                raise ComplianceError(f"{where}: {func.__name__}: expected target dtype to be Long or Byte, but "
                                      f"got {_name(target.dtype)}; cast the labels with .long()")
            if func.__name__ not in _WIDENED:
                _WIDENED.add(func.__name__)
                logger.info("CSX: int32 class indices of %s are widened to int64, as the vendor's CSX stack "
                            "accepts them", func.__name__)
            if len(args) > index:
                args = (*args[:index], target.long(), *args[index + 1:])
            else:
                kwargs = {**kwargs, "target": target.long()}
    return args, kwargs


def _name(dtype: torch.dtype) -> str:
    return {torch.float16: "Half", torch.float32: "Float", torch.bfloat16: "BFloat16",
            torch.float64: "Double", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char"}.get(dtype, str(dtype))
