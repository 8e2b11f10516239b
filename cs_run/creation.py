"""Creation ops for optimizer state and other tensors made before the first step.

On the vendor stack these fill tensors lazily on the device. Here they are thin wrappers over torch's
creation ops with the vendor's 2.10 signatures (``zeros(shape, dtype)``, ``full(shape, value, dtype)``,
``zeros_like(other, dtype)``, ...), so compliant code written for cstorch runs unchanged. The torch
forms of the vendor's porting guide still work: ``zeros(2, 3)`` and torch's keyword arguments (device, requires_grad, ...).
"""

from __future__ import annotations

import random
from typing import Any, Optional

import numpy as np
import torch

__all__ = ["zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "manual_seed", "from_numpy", "to_numpy"]


def _shape(shape: Any, dtype: Any, more: tuple, kwargs: dict) -> tuple[Any, Optional[torch.dtype]]:
    if dtype is not None and not isinstance(dtype, torch.dtype):  # torch form: zeros(2, 3, ...)
        return (shape, dtype, *more), kwargs.pop("dtype", None)
    if more:
        raise TypeError(f"expected (shape, dtype=None), got extra positional arguments {more}")
    return shape, dtype


def zeros(shape: Any, dtype: Optional[torch.dtype] = None, *more: int, **kwargs: Any) -> torch.Tensor:
    size, dtype = _shape(shape, dtype, more, kwargs)
    return torch.zeros(size, dtype=dtype, **kwargs)


def ones(shape: Any, dtype: Optional[torch.dtype] = None, *more: int, **kwargs: Any) -> torch.Tensor:
    size, dtype = _shape(shape, dtype, more, kwargs)
    return torch.ones(size, dtype=dtype, **kwargs)


def full(shape: Any, value: Any, dtype: Optional[torch.dtype] = None, **kwargs: Any) -> torch.Tensor:
    return torch.full(shape, value, dtype=dtype, **kwargs)


def zeros_like(other: torch.Tensor, dtype: Optional[torch.dtype] = None, **kwargs: Any) -> torch.Tensor:
    return torch.zeros_like(other, dtype=dtype, **kwargs)


def ones_like(other: torch.Tensor, dtype: Optional[torch.dtype] = None, **kwargs: Any) -> torch.Tensor:
    return torch.ones_like(other, dtype=dtype, **kwargs)


def full_like(other: torch.Tensor, value: Any, dtype: Optional[torch.dtype] = None, **kwargs: Any) -> torch.Tensor:
    return torch.full_like(other, value, dtype=dtype, **kwargs)


def from_numpy(array: Any) -> torch.Tensor:
    """A tensor sharing the numpy array's memory (``torch.from_numpy``)."""
    return torch.from_numpy(array)


def to_numpy(tensor: torch.Tensor) -> Any:
    """The tensor's values as a numpy array (detached, on the CPU)."""
    return tensor.detach().cpu().numpy()


def manual_seed(seed: int) -> None:
    """Seed every RNG a run draws from: torch (CPU and CUDA), numpy and Python's random."""

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
