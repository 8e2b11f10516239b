"""ALiBi (Press et al.): a per-head linear distance penalty added to the attention logits
(AlibiPositionEmbeddingLayer). Slopes are the paper's geometric series, or trainable parameters
(``alibi_trainable_slopes``, initialized with the model's ``initializer`` as the Model Zoo does);
``pos_scaling_factor`` divides them. State-dict key: ``slopes`` of shape [num_heads, 1].
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["AlibiPositionEmbeddingLayer", "alibi_slopes"]


def alibi_slopes(n: int) -> list[float]:
    """The paper's slopes; for a head count not a power of two, the next power's odd-indexed ones fill in."""
    def power_of_2(k: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(k) - 3)))
        return [start * start ** i for i in range(k)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: n - closest]


class AlibiPositionEmbeddingLayer(nn.Module):
    def __init__(self, num_heads: int, trainable_slopes: bool = False, scaling_factor: float = 1.0) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.trainable_slopes = trainable_slopes
        self.scaling_factor = scaling_factor
        if trainable_slopes:
            self.slopes = nn.Parameter(torch.zeros(num_heads, 1))
        else:
            self.register_buffer("slopes", torch.tensor(alibi_slopes(num_heads)).unsqueeze(-1))

    def forward(self, seq_length: int, key_length: int) -> torch.Tensor:
        """The bias, [num_heads, seq_length, key_length]: -slope / factor * |k - q|."""
        q = torch.arange(seq_length, device=self.slopes.device, dtype=torch.float32)[:, None]
        k = torch.arange(key_length, device=self.slopes.device, dtype=torch.float32)[None, :]
        distance = torch.abs(k - q)
        return (self.slopes / -self.scaling_factor).unsqueeze(1) * distance.unsqueeze(0)

    def bias_at(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """The bias at each sequence's own positions ([batch, q], [batch, k]): [batch, num_heads, q, k]."""
        distance = torch.abs(k_positions[:, None, :].to(torch.float32) - q_positions[:, :, None].to(torch.float32))
        return (self.slopes / -self.scaling_factor).unsqueeze(1)[None] * distance[:, None]
