"""The Model Zoo's transformer encoder (layers/TransformerEncoderLayer.py, TransformerEncoder.py) as its
vision models use it: self-attention and a two-layer FFN, each in a residual branch, pre-norm
(``norm_first``, ViT) or post-norm (BERT), with the optional layer scale and stochastic depth of
DINOv2-style trunks.

Module names are the vendor's (``self_attn``, ``ffn``, ``norm1``, ``norm2``, ``layer_scale1/2``; the stack
``layers`` and ``norm``), so its checkpoints load by key. The attention and FFN are the decoders' own
(:mod:`cs_run.models.common.attention`, :mod:`cs_run.models.common.ffn`): no mask, every token sees every
token.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from cs_run.models.common.attention import MultiheadAttention
from cs_run.models.common.ffn import FeedForwardNetwork

__all__ = ["StochasticDepth", "TransformerEncoderLayer", "TransformerEncoder"]


class StochasticDepth(nn.Module):
    """Drops a residual branch with probability ``p`` while training and scales the kept ones by 1 / (1 - p):
    ``batch`` mode draws once for the whole batch, ``row`` once per sample (torchvision's stochastic_depth)."""

    def __init__(self, p: float, mode: str) -> None:
        super().__init__()
        if mode not in ("batch", "row"):
            raise ValueError(f"stochastic_depth_mode: {mode!r} is not one of batch, row")
        self.p, self.mode = p, mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        shape = [1] * x.dim() if self.mode == "batch" else [x.shape[0]] + [1] * (x.dim() - 1)
        keep = torch.empty(shape, dtype=x.dtype, device=x.device).bernoulli_(1.0 - self.p)
        return x * keep / (1.0 - self.p)


class TransformerEncoderLayer(nn.Module):
    """One encoder block. ``dropout`` follows the attention output and the FFN's second layer (the vendor's
    ViT sets use_ff_layer1_dropout off); ``attention_dropout_rate`` drops attention probabilities."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, *, dropout: float, activation: str,
                 layer_norm_eps: float, norm_first: bool, attention_dropout_rate: float, attention_type: str,
                 attention_softmax_fp32: bool, use_projection_bias_in_attention: bool,
                 use_ffn_bias_in_attention: bool, use_ffn_bias: bool, attention_initializer: dict,
                 ffn_initializer: dict, num_kv_groups: Optional[int] = None, layerscale_value: Optional[float] = None,
                 stochastic_depth_drop_prob: float = 0.0, stochastic_depth_mode: str = "batch") -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(
            d_model, nhead, num_kv_groups=num_kv_groups, dropout=attention_dropout_rate,
            use_projection_bias=use_projection_bias_in_attention, use_ffn_bias=use_ffn_bias_in_attention,
            attention_type=attention_type, softmax_fp32=attention_softmax_fp32, initializer=attention_initializer)
        self.layerscale_value = layerscale_value
        if layerscale_value is not None:
            self.layer_scale1 = nn.Parameter(torch.full((d_model,), float(layerscale_value)))
            self.layer_scale2 = nn.Parameter(torch.full((d_model,), float(layerscale_value)))
        self.drop_path = StochasticDepth(stochastic_depth_drop_prob, stochastic_depth_mode) \
            if stochastic_depth_drop_prob > 0.0 else nn.Identity()
        self.ffn = FeedForwardNetwork(d_model, dim_feedforward, activation, dropout, use_ffn_bias, ffn_initializer,
                                      ffn_initializer)
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout1 = nn.Dropout(dropout)

    def _branch(self, x: torch.Tensor, scale: Optional[nn.Parameter]) -> torch.Tensor:
        if scale is not None:
            x = scale.to(x.dtype) * x
        return self.drop_path(x)

    def _sa_block(self, x: torch.Tensor) -> torch.Tensor:
        s = x.shape[1]
        mask = x.new_zeros(s, s)  # no mask: every patch attends to every patch
        out = self.dropout1(self.self_attn(x, mask))
        return self._branch(out, self.layer_scale1 if self.layerscale_value is not None else None)

    def _ffn_block(self, x: torch.Tensor) -> torch.Tensor:
        return self._branch(self.ffn(x), self.layer_scale2 if self.layerscale_value is not None else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x))
            return x + self._ffn_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x))
        return self.norm2(x + self._ffn_block(x))


class TransformerEncoder(nn.Module):
    """``layers`` blocks and the optional final ``norm``. ``extract_layer_idx`` stops after that block
    (inclusive) and skips the final norm, as the vendor's feature extraction (dino, llava) does."""

    def __init__(self, layers: list[TransformerEncoderLayer], norm: Optional[nn.LayerNorm]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm

    def forward(self, x: torch.Tensor, extract_layer_idx: Optional[int] = None) -> torch.Tensor:
        last = len(self.layers) - 1 if extract_layer_idx is None else extract_layer_idx
        for layer in self.layers[:last + 1]:
            x = layer(x)
        if self.norm is not None and extract_layer_idx is None:
            x = self.norm(x)
        return x
