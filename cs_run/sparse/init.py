"""How a sparse weight's first mask is chosen (``init_method``), as ``cstorch.sparse.init`` names them."""

from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch

from cs_run.sparse.utils import make_mask_topk_sparsity

__all__ = ["checkerboard", "from_zeros", "make_init_method", "random", "topk"]

InitMethod = Callable[..., torch.Tensor]


def random(p: torch.Tensor, sparsity: torch.Tensor, score_shaper=None,
           device: Optional[torch.device] = None) -> torch.Tensor:
    """Keep a uniformly random ``1 - sparsity`` of the weight (the top-k of a ``rand_like`` score)."""
    score = torch.rand_like(p, device=device or p.device)
    return make_mask_topk_sparsity(score, sparsity.to(score.device), score_shaper)


def topk(p: torch.Tensor, sparsity: torch.Tensor, score_shaper=None,
         device: Optional[torch.device] = None) -> torch.Tensor:
    """Keep the largest-magnitude ``1 - sparsity`` of the weight."""
    score = p.detach().to(device or p.device).abs()
    return make_mask_topk_sparsity(score, sparsity.to(score.device), score_shaper)


def from_zeros(p: torch.Tensor, sparsity: torch.Tensor, score_shaper=None,
               device: Optional[torch.device] = None) -> torch.Tensor:
    """The weight's zeros are the pruned connections (the sparsity level is not used)."""
    return p.detach().to(device or p.device) != 0


def checkerboard(p: torch.Tensor, sparsity: torch.Tensor, score_shaper=None,
                 device: Optional[torch.device] = None) -> torch.Tensor:
    """The vendor's stress-test pattern: kept entries spread evenly along each row, rows shifted so the
    columns are spread too (the weight's values and ``score_shaper`` are not used).

    With density ``d = 1 - sparsity``, column ``j`` of a row is kept where ``floor(j d + 1e-5)`` steps up
    at ``j + 1`` (float32, as the vendor computes it), over a row padded to ``L = cols - 1 +
    ceil(cols / d + 1e-5)`` entries; row ``r`` reads that padded row from ``r * floor(1 / d - 1e-5)``
    on, wrapping at ``L``. A 1-D weight is the unshifted row. The level is read on the host: masks
    are made once, eagerly, at ``model.apply``.
    """
    if p.dim() not in (1, 2):
        raise ValueError(f"init_method checkerboard makes masks of 1-D and 2-D weights, got shape {list(p.shape)}; "
                         f"give this weight another init_method (a param_filter entry of its own)")
    density = 1.0 - float(sparsity)
    if density <= 0.0:
        raise ValueError("init_method checkerboard needs a sparsity below 1 (no entry would be kept)")
    cols = p.shape[-1]
    length = cols - 1 + math.ceil(cols / density + 1e-5)
    level = torch.floor(torch.arange(length + 1, dtype=torch.float32) * density + 1e-5)
    row = level[1:] != level[:-1]  # True where the count of kept entries steps up
    if p.dim() == 1:
        mask = row[:cols]
    else:
        shift = math.floor(1.0 / density - 1e-5)  # each row starts this many entries further along
        start = torch.arange(p.shape[0]).unsqueeze(1) * shift
        mask = row[torch.remainder(start + torch.arange(cols), length)]
    return mask.to(device or p.device)


_METHODS = {"random": random, "topk": topk, "from_zeros": from_zeros, "checkerboard": checkerboard}


def make_init_method(init_method: Union[str, InitMethod]) -> InitMethod:
    """A built-in method by name, or the user's callable ``(param, sparsity, score_shaper, device) -> mask``."""
    if isinstance(init_method, str):
        if init_method not in _METHODS:
            raise ValueError(f"unknown init_method {init_method!r}; one of {', '.join(_METHODS)} or a callable")
        return _METHODS[init_method]
    if callable(init_method):
        return init_method
    raise ValueError(f"init_method must be one of {', '.join(_METHODS)} or a callable, got {init_method!r}")
