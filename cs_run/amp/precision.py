"""Mixed precision: ``autocast`` and the params helpers the runners use to configure it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from cs_run.amp.grad_scaler import (
    DEFAULT_INIT_SCALE,
    DEFAULT_MAX_LOSS_SCALE,
    DEFAULT_MIN_LOSS_SCALE,
    DEFAULT_OVERFLOW_TOLERANCE,
    DEFAULT_STEPS_PER_INCREASE,
    GradScaler,
)
from cs_run.backend import current_backend
from cs_run.errors import ParamsError

__all__ = ["autocast", "build_grad_scaler", "resolve_mixed_precision"]

logger = logging.getLogger(__name__)

_HALF_TYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "cbfloat16": torch.bfloat16,
}


def _default_device_type() -> str:
    """The current backend's device ("cpu" for a CPU backend even where CUDA exists), else CUDA when present."""
    current = current_backend(raise_exception=False, raise_warning=False)
    if current is not None:
        return current.torch_device.type
    return "cuda" if torch.cuda.is_available() else "cpu"


class autocast(torch.autocast):  # lower-case name mirrors torch.autocast
    """``torch.autocast`` whose device type defaults to the current backend's device (no backend yet:
    CUDA when present, else CPU).

    Use bfloat16 on CPU and GPU, float16 on GPU::

        with cstorch.amp.autocast(dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)

    Args:
        dtype: The half type; None takes torch's default for the device (bf16 on CPU, fp16 on CUDA).
            First, as in the vendor's ``autocast(dtype=None)``.
        device_type: "cpu" or "cuda"; None: the current backend's device, else "cuda" when available.
        enabled: False makes the context a no-op (convenient when precision comes from params).
        cache_enabled: As in ``torch.autocast``.
    """

    def __init__(
        self,
        dtype: torch.dtype | None = None,
        device_type: str | None = None,
        enabled: bool = True,
        cache_enabled: bool | None = None,
    ) -> None:
        device_type = device_type or _default_device_type()
        if dtype is not None and dtype not in (torch.bfloat16, torch.float16):
            raise ParamsError(
                f"autocast: invalid dtype {dtype} (must be torch.bfloat16 or torch.float16)"
            )
        super().__init__(
            device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled
        )


def _get(params: Any, key: str, default: Any = None) -> Any:
    if isinstance(params, Mapping):
        return params.get(key, default)
    return getattr(params, key, default)


def resolve_mixed_precision(
    model_params: Any, device_type: str | None = None
) -> torch.dtype | None:
    """The autocast dtype that the ``model`` params section asks for, or None for full precision.

    Model Zoo keys: ``mixed_precision`` (bool) turns it on; ``use_bfloat16: true`` or
    ``fp16_type: bfloat16|cbfloat16`` pick bfloat16, otherwise float16. float16 autocast is for CUDA:
    on a CPU device it falls back to bfloat16 (logged), since CPU kernels for float16 are slow and
    incomplete and bfloat16 needs no loss scaling.

    Args:
        model_params: The ``model`` section (a dict or an object with these attributes).
        device_type: "cpu" or "cuda" where the model runs; None picks "cuda" when available.
    """
    if not _get(model_params, "mixed_precision", False):
        if _get(model_params, "use_bfloat16", False):
            logger.warning(
                "model.use_bfloat16 is set but model.mixed_precision is not: running in float32"
            )
        return None
    fp16_type = _get(model_params, "fp16_type")
    if fp16_type is not None:
        if fp16_type not in _HALF_TYPES:
            raise ParamsError(
                f"params: model.fp16_type: unknown {fp16_type!r}; expected one of {', '.join(_HALF_TYPES)}"
            )
        dtype = _HALF_TYPES[fp16_type]
    else:
        dtype = (
            torch.bfloat16
            if _get(model_params, "use_bfloat16", False)
            else torch.float16
        )
    if dtype == torch.float16 and (device_type or _default_device_type()) != "cuda":
        logger.info(
            "mixed_precision float16 is for GPUs; using bfloat16 autocast on the CPU instead"
        )
        dtype = torch.bfloat16
    return dtype


def build_grad_scaler(optimizer_params: Any) -> GradScaler | None:
    """A :class:`GradScaler` from the ``optimizer`` params section, or None when no scaling is asked.

    Model Zoo keys: ``loss_scaling_factor`` ("dynamic" or a number; 1.0 or absent means none),
    ``initial_loss_scale``, ``steps_per_increase``, ``min_loss_scale``, ``max_loss_scale``,
    ``overflow_tolerance``.
    """
    factor = _get(optimizer_params, "loss_scaling_factor", 1.0)
    if factor is None or (not isinstance(factor, str) and factor in (0, 1)):
        return None
    return GradScaler(
        loss_scale=factor,
        init_scale=_get(optimizer_params, "initial_loss_scale", DEFAULT_INIT_SCALE),
        steps_per_increase=_get(
            optimizer_params, "steps_per_increase", DEFAULT_STEPS_PER_INCREASE
        ),
        min_loss_scale=_get(optimizer_params, "min_loss_scale", DEFAULT_MIN_LOSS_SCALE),
        max_loss_scale=_get(optimizer_params, "max_loss_scale", DEFAULT_MAX_LOSS_SCALE),
        overflow_tolerance=_get(optimizer_params, "overflow_tolerance", DEFAULT_OVERFLOW_TOLERANCE),
    )
