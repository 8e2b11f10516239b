"""``cstorch.sparse.SET``: sparse evolutionary training (https://arxiv.org/abs/1707.04780)."""

from __future__ import annotations

import torch

from cs_run.sparse.dynamic import DropAndRegrow
from cs_run.sparse.utils import make_mask_drop_minimum, make_mask_grow_maximum

__all__ = ["SET"]


class SET(DropAndRegrow):
    """On each update step, drop ``drop_fraction`` of each weight's connections (the smallest
    magnitudes) and regrow as many at random pruned positions (regrown weights start at zero)."""

    def __init__(self, drop_fraction=0.3, **kwargs) -> None:
        super().__init__(drop_fraction=drop_fraction, **kwargs)

    @torch.no_grad()
    def update_mask(self, p, mask, sparsity, sparse=None):
        kept, count = make_mask_drop_minimum(p.abs(), mask, self.drop_fraction(self.step))
        return make_mask_grow_maximum(torch.rand_like(p), kept, sparsity, count)
