"""Batches as nested tensors and the loaders that yield them: device moves, sample and batch counts."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.utils._pytree as pytree

__all__ = ["move_to_device", "batch_size", "loader_length"]


def move_to_device(batch: Any, device: torch.device) -> Any:
    """Every tensor of a nested batch (tuples, lists, dicts, namedtuples), on ``device``."""
    return pytree.tree_map_only(torch.Tensor, lambda t: t.to(device, non_blocking=True), batch)


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
