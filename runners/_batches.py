"""Batches as nested tensors and the loaders that yield them: device moves, sample and batch counts."""

from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = ["move_to_device", "batch_size", "loader_length"]


def move_to_device(batch: Any, device: torch.device) -> Any:
    """Every tensor of a nested tuple / list / dict batch, on ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        moved = [move_to_device(b, device) for b in batch]
        return moved if isinstance(batch, list) else tuple(moved)
    if isinstance(batch, dict):
        return {k: move_to_device(v, device) for k, v in batch.items()}
    return batch


def batch_size(batch: Any) -> int:
    """Samples in a batch: the leading size of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, (list, tuple)) and batch:
        return batch_size(batch[0])
    if isinstance(batch, dict) and batch:
        return batch_size(next(iter(batch.values())))
    return 0


def loader_length(loader: Any) -> Optional[int]:
    """Batches per pass, or None for loaders without a length (iterable datasets)."""
    try:
        return len(loader)
    except TypeError:
        return None
