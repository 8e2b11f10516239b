"""``cstorch.sparse.RigL``: rigging the lottery (https://arxiv.org/abs/1911.11134)."""

from __future__ import annotations

from typing import Optional

import torch

from cs_run.sparse.dynamic import DropAndRegrow
from cs_run.sparse.utils import (
    InputGroupScoreShaper,
    OutputGroupScoreShaper,
    make_mask_drop_minimum,
    make_mask_grow_maximum,
)

__all__ = ["RigL"]


class RigL(DropAndRegrow):
    """On each update step, drop ``drop_fraction`` of each weight's connections (the smallest
    magnitudes) and regrow as many where the dense gradient (before masking, summed over the step's
    micro-batches) is largest in magnitude. ``balance_out_groups`` / ``balance_in_groups`` make groups
    of output rows / input columns keep equal shares."""

    def __init__(self, drop_fraction=0.3, balance_in_groups: Optional[int] = None,
                 balance_out_groups: Optional[int] = None, **kwargs) -> None:
        if balance_in_groups and balance_out_groups:
            raise ValueError("give balance_in_groups or balance_out_groups, not both")
        super().__init__(drop_fraction=drop_fraction, **kwargs)
        self.balance_in_groups, self.balance_out_groups = balance_in_groups, balance_out_groups
        self.score_shaper = (OutputGroupScoreShaper(balance_out_groups) if balance_out_groups
                             else InputGroupScoreShaper(balance_in_groups) if balance_in_groups else None)
        self._dense_grads: dict[str, torch.Tensor] = {}

    def sparsify_parameter(self, module, name, param) -> None:
        groups = self.balance_out_groups or self.balance_in_groups
        if groups and not any(size % groups == 0 for size in param.shape):
            raise ValueError(f"RigL balance groups {groups}: parameter {name} of shape {list(param.shape)} has no "
                             f"dimension divisible by {groups}")
        super().sparsify_parameter(module, name, param)

    def _initial_mask(self, param, level):
        if not self.starts_sparse:
            return torch.ones_like(param, dtype=torch.bool)
        return self.init_method(param, level, self.score_shaper)

    def _grad_hook(self, sparse, grad):
        held = self._dense_grads.get(sparse.name)
        self._dense_grads[sparse.name] = grad.clone() if held is None else held + grad
        return super()._grad_hook(sparse, grad)

    @torch.no_grad()
    def update_mask(self, p, mask, sparsity, sparse=None):
        dense = self._dense_grads.get(sparse.name) if sparse is not None else None
        if dense is None:
            raise RuntimeError(f"RigL needs the dense gradient of {sparse.name if sparse else 'the weight'}: run the "
                               "model's forward (which the sparsity hooks) and backward before the optimizer step")
        kept, count = make_mask_drop_minimum(p.abs(), mask, self.drop_fraction(self.step), self.score_shaper)
        return make_mask_grow_maximum(dense.abs(), kept, sparsity, count, self.score_shaper)

    def _end_update(self) -> None:
        self._dense_grads = {}
