"""How a sparse weight's first mask is chosen (``init_method``), as ``cstorch.sparse.init`` names them."""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch

from cs_run.sparse.utils import make_mask_topk_sparsity

__all__ = ["from_zeros", "make_init_method", "random", "topk"]

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


_METHODS = {"random": random, "topk": topk, "from_zeros": from_zeros}


def make_init_method(init_method: Union[str, InitMethod]) -> InitMethod:
    """A built-in method by name, or the user's callable ``(param, sparsity, score_shaper, device) -> mask``."""
    if isinstance(init_method, str):
        if init_method not in _METHODS:
            raise ValueError(f"unknown init_method {init_method!r}; one of {', '.join(_METHODS)} or a callable")
        return _METHODS[init_method]
    if callable(init_method):
        return init_method
    raise ValueError(f"init_method must be one of {', '.join(_METHODS)} or a callable, got {init_method!r}")
