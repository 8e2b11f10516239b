"""Creation ops for optimizer state and other tensors made before the first step.

On the vendor stack these fill tensors lazily on the device. Here they are thin wrappers over torch's
creation ops with the vendor's 2.10 signatures (``zeros(shape, dtype)``, ``full(shape, value, dtype)``,
``zeros_like(other, dtype)``, ...), so compliant code written for cstorch runs unchanged. The torch
forms of seed 001 still work: ``zeros(2, 3)``, ``full(size=..., fill_value=...)``, ``zeros_like(tensor=...)``
and torch's keyword arguments (device, requires_grad, ...).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = ["zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "manual_seed"]


def _shape(shape: Any, dtype: Any, more: tuple, kwargs: dict) -> tuple[Any, Optional[torch.dtype]]:
    if shape is None:
        shape = kwargs.pop("size", None)
    if dtype is not None and not isinstance(dtype, torch.dtype):  # torch form: zeros(2, 3, ...)
        return (shape, dtype, *more), kwargs.pop("dtype", None)
    if more:
        raise TypeError(f"expected (shape, dtype=None), got extra positional arguments {more}")
    return shape, dtype


def zeros(shape: Any = None, dtype: Optional[torch.dtype] = None, *more: int, **kwargs: Any) -> torch.Tensor:
    size, dtype = _shape(shape, dtype, more, kwargs)
    return torch.zeros(size, dtype=dtype, **kwargs)


def ones(shape: Any = None, dtype: Optional[torch.dtype] = None, *more: int, **kwargs: Any) -> torch.Tensor:
    size, dtype = _shape(shape, dtype, more, kwargs)
    return torch.ones(size, dtype=dtype, **kwargs)


def full(shape: Any = None, value: Any = None, dtype: Optional[torch.dtype] = None, **kwargs: Any) -> torch.Tensor:
    shape = kwargs.pop("size") if shape is None and "size" in kwargs else shape
    value = kwargs.pop("fill_value") if value is None and "fill_value" in kwargs else value
    return torch.full(shape, value, dtype=dtype, **kwargs)


def _other(other: Any, kwargs: dict) -> torch.Tensor:
    return kwargs.pop("tensor") if other is None and "tensor" in kwargs else other


def zeros_like(other: Any = None, dtype: Optional[torch.dtype] = None, **kwargs: Any) -> torch.Tensor:
    return torch.zeros_like(_other(other, kwargs), dtype=dtype, **kwargs)


def ones_like(other: Any = None, dtype: Optional[torch.dtype] = None, **kwargs: Any) -> torch.Tensor:
    return torch.ones_like(_other(other, kwargs), dtype=dtype, **kwargs)


def full_like(other: Any = None, value: Any = None, dtype: Optional[torch.dtype] = None, **kwargs: Any
              ) -> torch.Tensor:
    value = kwargs.pop("fill_value") if value is None and "fill_value" in kwargs else value
    return torch.full_like(_other(other, kwargs), value, dtype=dtype, **kwargs)


def manual_seed(seed: int) -> None:
    """Seed every RNG a run draws from: torch (CPU and CUDA), numpy and Python's random."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
