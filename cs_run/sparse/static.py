"""``cstorch.sparse.Static``: masks fixed at their first value."""

from __future__ import annotations

from typing import Optional

import torch

from cs_run.sparse.base import SparsityAlgorithm

__all__ = ["Static"]


class Static(SparsityAlgorithm):
    """The same mask for the whole run: a ``sparsity`` fraction of each weight pruned at the start."""

    def __init__(self, sparsity: Optional[float] = None, **kwargs) -> None:
        if sparsity is not None:
            if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)):
                raise ValueError(f"Static sparsity is one number, got {sparsity!r} (per-weight levels: assign "
                                 f"static.sparsity = {{param: level}} after constructing it, as the vendor's setter, "
                                 f"or one Group entry per pattern)")
            if not 0.0 <= sparsity < 1.0:
                raise ValueError(f"Static sparsity must be >= 0 and < 1, got {sparsity}")
        self.sparsity_level = sparsity
        super().__init__(sparsity, **kwargs)

    def update(self, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        self._report_target("*", self.sparsity_level)  # the vendor's Static reports its level as both
        self._report_computed("*", self.sparsity_level)
