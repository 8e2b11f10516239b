"""Creation ops for optimizer state and other tensors made before the first step.

On the vendor stack these fill tensors lazily on the device. Here they are thin wrappers over torch's
creation ops, kept as their own names so compliant code written for cstorch runs unchanged, and so
there is one place to make them lazy (e.g. meta / deferred init) later.
"""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "manual_seed"]


def zeros(*size, **kwargs) -> torch.Tensor:
    return torch.zeros(*size, **kwargs)


def ones(*size, **kwargs) -> torch.Tensor:
    return torch.ones(*size, **kwargs)


def full(size, fill_value, **kwargs) -> torch.Tensor:
    return torch.full(size, fill_value, **kwargs)


def zeros_like(tensor: torch.Tensor, **kwargs) -> torch.Tensor:
    return torch.zeros_like(tensor, **kwargs)


def ones_like(tensor: torch.Tensor, **kwargs) -> torch.Tensor:
    return torch.ones_like(tensor, **kwargs)


def full_like(tensor: torch.Tensor, fill_value, **kwargs) -> torch.Tensor:
    return torch.full_like(tensor, fill_value, **kwargs)


def manual_seed(seed: int) -> None:
    """Seed every RNG a run draws from: torch (CPU and CUDA), numpy and Python's random."""

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
