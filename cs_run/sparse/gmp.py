"""``cstorch.sparse.GMP``: gradual magnitude pruning (https://arxiv.org/abs/1710.01878)."""

from __future__ import annotations

import torch

from cs_run.sparse.dynamic import DynamicSparsityAlgorithm
from cs_run.sparse.utils import Constant, make_mask_topk_sparsity

__all__ = ["GMP"]


class GMP(DynamicSparsityAlgorithm):
    """On each update step, keep the largest-magnitude weights at the scheduled (growing) sparsity."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        constant = next((s for s in self.sparsity.schedules() if isinstance(s, Constant)), None)
        if constant is not None:
            raise ValueError(f"GMP with a constant sparsity ({constant.value}) never changes the mask; "
                             "use Static, or a sparsity schedule")

    @torch.no_grad()
    def update_mask(self, p, mask, sparsity, sparse=None):
        return make_mask_topk_sparsity(p.abs(), sparsity)
