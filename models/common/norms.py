"""The Model Zoo's sequence norms by their ``norm_type`` names (layers/norms.py): the ones a decoder uses.

``rmsnorm`` is the Model Zoo's (T5-style) RMSNorm: variance in float32, no mean, no bias, parameter
``weight``. The image norms of that table (batch, group, instance norms) make no sense over a
decoder's hidden states; naming one is a params error.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from torch import nn

from cs_run.optim.param_groups import register_norm_class

__all__ = ["RMSNorm", "NORMS", "get_norm"]


@register_norm_class  # a normalization layer: no weight decay (the Model Zoo's param groups name its RMSNorm)
class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight.to(dtype) * hidden_states.to(dtype)


NORMS: dict[str, Callable[..., nn.Module]] = {
    "layernorm": nn.LayerNorm,
    "rmsnorm": RMSNorm,
    "biasless-layernorm": partial(nn.LayerNorm, bias=False),
    "nonparametric-layernorm": partial(nn.LayerNorm, elementwise_affine=False, bias=False),
}


def get_norm(name: str) -> Callable[..., nn.Module]:
    """The norm class called ``name`` (case-insensitive). KeyError if not a decoder norm."""
    return NORMS[name.lower()]


def reset_norm(norm: nn.Module) -> None:
    """Unit weight, zero bias (the Model Zoo's reset_norm)."""
    with torch.no_grad():
        if getattr(norm, "weight", None) is not None:
            norm.weight.fill_(1.0)
        if getattr(norm, "bias", None) is not None:
            norm.bias.zero_()
