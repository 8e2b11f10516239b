"""The encoder block (TransformerEncoderLayer, TransformerEncoder) of the Model Zoo's encoders (BERT):
bidirectional self-attention under a key padding mask, post-norm by default.

Rotary positions (``position_embedding_type: rotary``, ESM-2) rotate q and k inside each layer's attention.

Post-norm (``norm_first: false``, BERT): ``x = norm1(x + dropout1(attn(x)))`` then
``x = norm2(x + ffn(x))``; pre-norm: ``x + dropout1(attn(norm1(x)))`` then ``x + ffn(norm2(x))``. The
attention and FFN are the decoder's (:mod:`attention`, :mod:`ffn`); only the norm placement and the mask
differ. Module names are the Model Zoo's (``transformer_encoder.layers.0.self_attn.proj_q_dense_layer``,
``norm1``, ``norm2``, ``ffn.ffn.0.linear_layer``), so its checkpoints load key for key.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from cs_run.models.common.attention import MultiheadAttention
from cs_run.models.common.norms import reset_norm
from cs_run.models.common.rotary import RotaryEmbedding

__all__ = ["TransformerEncoderLayer", "TransformerEncoder", "key_padding_mask"]


def key_padding_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[batch, 1, 1, seq] additive mask of a [batch, seq] 1-keep / 0-pad mask: the dtype's lowest value on the
    padded keys (make_key_padding_mask_broadcastable's ``use_neg_inf``), 0 elsewhere."""
    keep = attention_mask.to(dtype)[:, None, None, :]
    return (1.0 - keep) * torch.finfo(dtype).min


class TransformerEncoderLayer(nn.Module):
    def __init__(self, hidden_size: int, attention: MultiheadAttention, ffn: nn.Module, dropout: float,
                 layer_norm_epsilon: float, norm_first: bool = False) -> None:
        super().__init__()
        self.self_attn = attention
        self.ffn = ffn
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(hidden_size, eps=layer_norm_epsilon)
        self.norm2 = nn.LayerNorm(hidden_size, eps=layer_norm_epsilon)
        self.dropout1 = nn.Dropout(dropout)
        reset_norm(self.norm1)
        reset_norm(self.norm2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, rotary: Optional[RotaryEmbedding] = None) -> torch.Tensor:
        if self.norm_first:
            x = x + self.dropout1(self.self_attn(self.norm1(x), mask, rotary))
            return x + self.ffn(self.norm2(x))
        x = self.norm1(x + self.dropout1(self.self_attn(x, mask, rotary)))
        return self.norm2(x + self.ffn(x))


class TransformerEncoder(nn.Module):
    """The layers, then the optional final norm (``use_final_layer_norm``)."""

    def __init__(self, layers: list[nn.Module], norm: Optional[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        if norm is not None:
            reset_norm(norm)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, rotary: Optional[RotaryEmbedding] = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mask, rotary)
        return self.norm(x) if self.norm is not None else x
