"""Self-attention as the Model Zoo computes it (AttentionLayer.MultiheadAttention and
MultiQueryAttentionLayer.MultiQueryAttention), in one module.

Projections ``proj_q/k/v_dense_layer`` and ``proj_output_dense_layer``; with ``num_kv_groups`` (the
``multiquery_attention`` module) k and v have ``num_kv_groups`` heads, each shared by
``num_heads / num_kv_groups`` query heads (1: multi-query, between: grouped-query).

Logits, in the Model Zoo's order: ``scale_qk_dot_by_d`` divides k by sqrt(d) (so scaled_dot_product
becomes 1/d, muP); ``attention_type: scaled_dot_product`` divides q by sqrt(d);
``scale_qk_dot_by_layer_idx`` divides q by layer index + 1 (SantaCoder); ``attention_logits_alpha``
multiplies the product; ``logit_softcapping`` is ``cap * tanh(logits / cap)`` (Gemma 2). Then ALiBi
bias and the causal / sliding-window mask are added; ``use_sink_token`` appends a learned per-head
logit column (``sinks``) that takes softmax mass and is dropped after (GPT-OSS). The softmax runs in
float32 when ``softmax_fp32`` and the logits are lower precision.

Without softcapping or sinks, torch's ``scaled_dot_product_attention`` computes it. On CUDA that holds
for bf16/fp16 under ``softmax_fp32`` too (its fused kernels keep the softmax max and sum in float32),
and a layer whose mask is the plain causal one asks for ``is_causal`` instead of passing the mask, so
FlashAttention can run (an explicit mask rules it out). On CPU the mask is always passed and a
low-precision ``softmax_fp32`` keeps the explicit float32 softmax.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from cs_run.models.common.initializers import make_initializer
from cs_run.models.common.kv_cache import KVCache
from cs_run.models.common.rotary import RotaryEmbedding

__all__ = ["MultiheadAttention"]


class MultiheadAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, *, inner_dim: Optional[int] = None,
                 num_kv_groups: Optional[int] = None, dropout: float = 0.0, use_projection_bias: bool = False,
                 use_ffn_bias: bool = False, attention_type: str = "scaled_dot_product",
                 scale_qk_dot_by_d: bool = False, attention_logits_alpha: float = 1.0,
                 scale_qk_dot_by_layer_idx: bool = False, logit_softcapping: Optional[float] = None,
                 softmax_fp32: bool = True, use_sink_token: bool = False, initializer: dict,
                 output_initializer: Optional[dict] = None) -> None:
        super().__init__()
        inner_dim = inner_dim or hidden_size
        self.num_heads = num_heads
        self.head_dim = inner_dim // num_heads
        self.num_kv_groups = num_kv_groups or num_heads
        kv_dim = self.num_kv_groups * self.head_dim
        self.dropout = dropout
        self.scaled = attention_type == "scaled_dot_product"
        self.scale_qk_dot_by_d = scale_qk_dot_by_d
        self.attention_logits_alpha = attention_logits_alpha
        self.scale_qk_dot_by_layer_idx = scale_qk_dot_by_layer_idx
        self.logit_softcapping = logit_softcapping
        self.softmax_fp32 = softmax_fp32
        self.proj_q_dense_layer = nn.Linear(hidden_size, inner_dim, bias=use_projection_bias)
        self.proj_k_dense_layer = nn.Linear(hidden_size, kv_dim, bias=use_projection_bias)
        self.proj_v_dense_layer = nn.Linear(hidden_size, kv_dim, bias=use_projection_bias)
        self.proj_output_dense_layer = nn.Linear(inner_dim, hidden_size, bias=use_ffn_bias)
        # the Model Zoo leaves sinks uninitialized (torch.empty); zero is the neutral start
        self.sinks = nn.Parameter(torch.zeros(num_heads)) if use_sink_token else None
        with torch.no_grad():
            for layer in (self.proj_q_dense_layer, self.proj_k_dense_layer, self.proj_v_dense_layer):
                make_initializer(initializer)(layer.weight)
            make_initializer(output_initializer or initializer)(self.proj_output_dense_layer.weight)
            for layer in (self.proj_q_dense_layer, self.proj_k_dense_layer, self.proj_v_dense_layer,
                          self.proj_output_dense_layer):
                if layer.bias is not None:
                    layer.bias.zero_()

    def _sdpa_computes_it(self, q: torch.Tensor) -> bool:
        if self.logit_softcapping is not None or self.sinks is not None:
            return False
        return q.dtype == torch.float32 or not self.softmax_fp32 or q.is_cuda

    def _scale(self, layer_idx: int) -> float:
        scale = self.attention_logits_alpha
        if self.scaled:
            scale /= math.sqrt(self.head_dim) * (math.sqrt(self.head_dim) if self.scale_qk_dot_by_d else 1.0)
        if self.scale_qk_dot_by_layer_idx:
            scale /= layer_idx + 1
        return scale

    def forward(self, x: torch.Tensor, mask: torch.Tensor, rotary: Optional[RotaryEmbedding] = None,
                position_bias: Optional[torch.Tensor] = None, layer_idx: int = 0,
                causal: bool = False, cache: Optional[KVCache] = None) -> torch.Tensor:
        """``causal``: ``mask`` is the plain causal mask (no window), so a fused kernel may apply it itself.
        ``cache``: incremental decoding; ``x`` is the new tokens, which attend to the cached ones too."""
        b, s, _ = x.shape
        q = self.proj_q_dense_layer(x).view(b, s, self.num_heads, self.head_dim)
        k = self.proj_k_dense_layer(x).view(b, s, self.num_kv_groups, self.head_dim)
        v = self.proj_v_dense_layer(x).view(b, s, self.num_kv_groups, self.head_dim)
        if rotary is not None:
            q, k = rotary.rotate(q), rotary.rotate(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:  # the grouped heads are cached as they are, repeated below
            k, v = cache.update(layer_idx, k, v)
        if self.num_kv_groups != self.num_heads:  # each group serves num_heads / groups consecutive heads
            repeat = self.num_heads // self.num_kv_groups
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        bias = mask if position_bias is None else mask + position_bias.to(mask.dtype)
        scale = self._scale(layer_idx)
        dropout = self.dropout if self.training else 0.0
        if self._sdpa_computes_it(q):
            if causal and position_bias is None and q.is_cuda:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, dropout_p=dropout)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), scale=scale,
                                                     dropout_p=dropout)
        else:
            logits = torch.matmul(q, k.transpose(-1, -2)) * scale
            if self.logit_softcapping is not None:
                logits = torch.tanh(logits / self.logit_softcapping) * self.logit_softcapping
            logits = logits + bias.to(logits.dtype)
            if self.sinks is not None:
                sink = self.sinks.to(logits.dtype)[None, :, None, None].expand(b, -1, s, 1)
                logits = torch.cat([logits, sink], dim=-1)
            dtype = torch.float32 if self.softmax_fp32 else logits.dtype
            scores = torch.softmax(logits.to(dtype), dim=-1).to(q.dtype)
            if self.sinks is not None:
                scores = scores[..., :-1]
            out = torch.matmul(F.dropout(scores, dropout, self.training), v)
        return self.proj_output_dense_layer(out.transpose(1, 2).reshape(b, s, -1))
