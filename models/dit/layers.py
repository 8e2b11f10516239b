"""The DiT's own layers (Model Zoo 2.10 models/vision/dit/layers/ and layers/AdaLayerNorm.py), with the
vendor's module names so its checkpoints load by key:

* :class:`AdaLayerNorm`: a layer norm without affine weights, scaled and shifted by linear maps of the
  conditioning (``scale_linear.1``, ``shift_linear.1``), all zero at start;
* :class:`DiTDecoderLayer`: self-attention and FFN between adaptive norms (``norm1``, ``norm3``), each branch
  gated by a zero-initialized linear map of the conditioning (``gate_msa.1``, ``gate_mlp.1``): adaLN-zero, so a
  new block is the identity;
* :class:`TimestepEmbeddingLayer`: a fixed sinusoidal table of the timesteps (``timestep_embedding``, cos then
  sin) through a two-layer MLP (``ffn.ffn.0``, ``ffn.ffn.1``);
* :class:`RegressionHead`: hidden states back to a latent-shaped noise prediction (``conv_transpose``, or
  ``linear`` and unpatchify);
* :class:`DiTPatchEmbedding`: the ViT family's patch embedding with the vendor's fixed 2-D sin-cos positions.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from cs_run.models.common.activations import get_activation
from cs_run.models.common.attention import MultiheadAttention
from cs_run.models.common.ffn import FeedForwardNetwork, SingleFeedForwardLayer
from cs_run.models.common.initializers import make_initializer
from cs_run.models.vision_transformer.config import ViTModelConfig
from cs_run.models.vision_transformer.trunk import ViTEmbeddingLayer, patchify

__all__ = ["AdaLayerNorm", "DiTDecoderLayer", "DiTDecoder", "TimestepEmbeddingLayer", "RegressionHead",
           "DiTPatchEmbedding", "fixed_2d_position_embeddings", "timestep_table", "unpatchify"]


class AdaLayerNorm(nn.Module):
    """``(1 + scale(c)) * LayerNorm(x) + shift(c)``, scale and shift per sample from the conditioning ``c``."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.layernorm = nn.LayerNorm(hidden_size, eps=eps, elementwise_affine=False)
        self.scale_linear = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, hidden_size))
        self.shift_linear = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, hidden_size))
        with torch.no_grad():
            for p in self.parameters():
                p.zero_()

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        shift = self.shift_linear(context)
        scale = self.scale_linear(context)
        return (1 + scale.unsqueeze(1)) * self.layernorm(x) + shift.unsqueeze(1)


def _gate(hidden_size: int) -> nn.Sequential:
    gate = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, hidden_size), nn.Unflatten(1, (1, -1)))
    with torch.no_grad():
        gate[1].weight.zero_()
        gate[1].bias.zero_()
    return gate


class DiTDecoderLayer(nn.Module):
    """One adaLN-zero block (DiTDecoderLayer with gate_res): ``x + gate_msa(c) * attn(norm1(x, c))``, then
    ``x + gate_mlp(c) * ffn(norm3(x, c))``; post-norm (``norm_first: false``) normalizes after each residual."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, *, dropout: float, activation: str,
                 layer_norm_eps: float, norm_first: bool, attention_dropout_rate: float, attention_type: str,
                 attention_softmax_fp32: bool, use_projection_bias_in_attention: bool,
                 use_ffn_bias_in_attention: bool, use_ffn_bias: bool, attention_initializer: dict,
                 ffn_initializer: dict) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(
            d_model, nhead, dropout=attention_dropout_rate, use_projection_bias=use_projection_bias_in_attention,
            use_ffn_bias=use_ffn_bias_in_attention, attention_type=attention_type,
            softmax_fp32=attention_softmax_fp32, initializer=attention_initializer)
        self.norm_first = norm_first
        self.norm1 = AdaLayerNorm(d_model, layer_norm_eps)
        self.dropout1 = nn.Dropout(dropout)
        self.norm3 = AdaLayerNorm(d_model, layer_norm_eps)
        # the vendor's use_ff_layer1_dropout=False, use_ff_layer2_dropout=True: dropout after the second layer only
        self.ffn = FeedForwardNetwork(d_model, dim_feedforward, activation, dropout, use_ffn_bias, ffn_initializer,
                                      ffn_initializer)
        self.gate_msa = _gate(d_model)
        self.gate_mlp = _gate(d_model)

    def _sa_block(self, x: torch.Tensor) -> torch.Tensor:
        s = x.shape[1]
        return self.dropout1(self.self_attn(x, x.new_zeros(s, s)))  # no mask: every patch sees every patch

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        if self.norm_first:
            x = x + self.gate_msa(context) * self._sa_block(self.norm1(x, context))
            return x + self.gate_mlp(context) * self.ffn(self.norm3(x, context))
        x = self.norm1(x + self.gate_msa(context) * self._sa_block(x), context)
        return self.norm3(x + self.gate_mlp(context) * self.ffn(x), context)


class DiTDecoder(nn.Module):
    """The blocks in turn (``layers.N``), each conditioned on the same context; no final norm here (the
    model's ``final_norm`` follows)."""

    def __init__(self, layers: list[DiTDecoderLayer]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, context)
        return x


def timestep_table(num_steps: int, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """``[num_steps, dim]``: row t is ``cos(t * f_i)`` then ``sin(t * f_i)`` for ``f_i = max_period^(-i / (dim // 2))``
    (GLIDE's timestep embedding, the vendor's create_timestep_embedding), a zero column for an odd ``dim``."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
    args = torch.arange(num_steps, dtype=torch.float32)[:, None] * freqs[None]
    table = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    return torch.cat([table, torch.zeros_like(table[:, :1])], dim=-1) if dim % 2 else table


class _MLP(nn.Module):
    """The vendor's FeedForwardNetwork of two layers ``in -> hidden (activation) -> hidden`` (``ffn.0``, ``ffn.1``)."""

    def __init__(self, inputs: int, hidden: int, activation: str, initializer: dict) -> None:
        super().__init__()
        self.ffn = nn.ModuleList([SingleFeedForwardLayer(inputs, hidden, True, activation),
                                  SingleFeedForwardLayer(hidden, hidden, True, None)])
        with torch.no_grad():
            for layer in self.ffn:
                make_initializer(initializer)(layer.linear_layer.weight)
                layer.linear_layer.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.ffn:
            x = layer(x)
        return x


class TimestepEmbeddingLayer(nn.Module):
    """Integer timesteps ``[b]`` -> ``[b, hidden]``: a row of the fixed table through the MLP."""

    def __init__(self, num_diffusion_steps: int, hidden_size: int, frequency_embedding_size: int, nonlinearity: str,
                 kernel_initializer: dict) -> None:
        super().__init__()
        get_activation(nonlinearity)  # an unknown name fails here, not in the first step
        self.timestep_embedding = nn.Parameter(timestep_table(num_diffusion_steps, frequency_embedding_size),
                                               requires_grad=False)
        self.ffn = _MLP(frequency_embedding_size, hidden_size, nonlinearity, kernel_initializer)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.ffn(torch.index_select(self.timestep_embedding, 0, t.long()))


def unpatchify(x: torch.Tensor, channels: int, image_size: list, patch_size: list) -> torch.Tensor:
    """``[b, patches, ph * pw * c]`` -> ``[b, c, h, w]``, each patch read as (row, column, channel): the
    inverse of :func:`~cs_run.models.vision_transformer.trunk.patchify` (the vendor's unpatchify_helper)."""
    (h, w), (ph, pw) = image_size, patch_size
    x = x.reshape(x.shape[0], h // ph, w // pw, ph, pw, channels)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(x.shape[0], channels, h, w)


class RegressionHead(nn.Module):
    """Hidden states ``[b, patches, hidden]`` -> ``[b, out_channels, h, w]``: one transposed convolution with the
    patch as kernel and stride (``use_conv_transpose_unpatchify``), or a Linear to each patch's pixels and
    unpatchify. The kernel starts at ``kernel_initializer`` (the vendor's zeros), the bias at zero."""

    def __init__(self, image_size: list, out_channels: int, patch_size: list, hidden_size: int,
                 use_conv_transpose_unpatchify: bool, kernel_initializer: dict) -> None:
        super().__init__()
        self.image_size, self.out_channels, self.patch_size = image_size, out_channels, patch_size
        self.hidden_size = hidden_size
        if use_conv_transpose_unpatchify:
            self.conv_transpose = nn.ConvTranspose2d(hidden_size, out_channels, kernel_size=patch_size,
                                                     stride=patch_size)
            layer = self.conv_transpose
        else:
            self.linear = nn.Linear(hidden_size, patch_size[0] * patch_size[1] * out_channels)
            layer = self.linear
        self.use_conv_transpose_unpatchify = use_conv_transpose_unpatchify
        with torch.no_grad():
            make_initializer(kernel_initializer)(layer.weight)
            layer.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_conv_transpose_unpatchify:
            grid = (self.image_size[0] // self.patch_size[0], self.image_size[1] // self.patch_size[1])
            return self.conv_transpose(x.transpose(1, 2).reshape(x.shape[0], self.hidden_size, *grid))
        return unpatchify(self.linear(x), self.out_channels, self.image_size, self.patch_size)


def fixed_2d_position_embeddings(grid: list, hidden_size: int) -> torch.Tensor:
    """``[rows * cols, hidden]`` (row-major patches): the column's sin-cos features then the row's, each
    ``sin(p * f_i)`` then ``cos(p * f_i)`` for ``f_i = 10000^(-i / (hidden / 4))``, ``i < hidden / 4`` (the
    vendor's get_2d_fixed_position_embeddings, without a cls row: DiT has no cls token)."""
    quarter = hidden_size // 4
    inv_freq = 1.0 / (10000 ** (torch.arange(quarter, dtype=torch.float32) / quarter))
    rows = torch.arange(grid[0], dtype=torch.float32).repeat_interleave(grid[1])
    cols = torch.arange(grid[1], dtype=torch.float32).repeat(grid[0])

    def features(p: torch.Tensor) -> torch.Tensor:
        args = p[:, None] * inv_freq[None]
        return torch.cat([torch.sin(args), torch.cos(args)], dim=1)
    return torch.cat([features(cols), features(rows)], dim=1)


class DiTPatchEmbedding(ViTEmbeddingLayer):
    """The ViT trunk's patch embedding (``linear_proj``; learned ``position_embeddings`` as there) of the
    latents, no cls token. ``fixed``: ``position_embeddings`` is the fixed 2-D table, a parameter that is not
    trained (the vendor's, so checkpoints carry it). ``init_conv_like_linear``: the conv projection is
    initialized as its ``[out, in * ph * pw]`` matrix (the vendor's fan-in / fan-out)."""

    def __init__(self, cfg: ViTModelConfig, fixed: bool, init_conv_like_linear: bool) -> None:
        super().__init__(cfg)
        self.fixed = fixed
        if fixed:
            grid = [s // p for s, p in zip(cfg.image_size, cfg.patch_size)]
            self.position_embeddings = nn.Parameter(fixed_2d_position_embeddings(grid, cfg.hidden_size),
                                                    requires_grad=False)
        if cfg.use_conv_patchified_embedding and init_conv_like_linear:
            with torch.no_grad():
                w = self.linear_proj.weight
                make_initializer(cfg.projection_initializer)(w.view(w.shape[0], -1))

    def forward(self, images: torch.Tensor, masks: Optional[torch.Tensor] = None) -> torch.Tensor:
        if not self.fixed:
            return super().forward(images, masks)
        if self.use_conv_patchified_embedding:
            x = self.linear_proj(images).flatten(2).transpose(1, 2)
        else:
            x = self.linear_proj(patchify(images, self.patch_size))
        return self.dropout_embd(x + self.position_embeddings.to(x.dtype))
