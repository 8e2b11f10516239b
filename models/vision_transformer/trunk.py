"""The ViT trunk (the Model Zoo's ViTModel): patch embedding, transformer encoder, optional pooler. dino,
llava and multimodal_simple reuse it as the vendor's do; module names are the vendor's
(``embedding_layer.linear_proj``, ``position_embeddings``, ``cls_embedding``;
``encoder.transformer_encoder.layers.N``, ``encoder.pooler``) so its checkpoints load by key.

The cls token's position embedding is the table's LAST row (the vendor's ``cls_embedding_position_index``
is the number of patches), while Hugging Face's is the first: the HF adapter moves it.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from cs_run.models.common.ffn import Pooler
from cs_run.models.common.initializers import make_initializer
from cs_run.models.vision_transformer.config import ViTModelConfig
from cs_run.models.vision_transformer.encoder import TransformerEncoder, TransformerEncoderLayer

__all__ = ["patchify", "bicubic_interpolation_matrix", "ViTEmbeddingLayer", "ViTEncoder", "ViTModel"]


def patchify(images: torch.Tensor, patch_size: list) -> torch.Tensor:
    """``[b, c, h, w]`` -> ``[b, patches, ph * pw * c]``, each patch flattened as (row, column, channel):
    the vendor's patchify_helper order, which the Linear projection's weight columns follow."""
    b, c, h, w = images.shape
    ph, pw = patch_size
    x = images.reshape(b, c, h // ph, ph, w // pw, pw).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(b, (h // ph) * (w // pw), ph * pw * c)


def bicubic_interpolation_matrix(grid: list, interpolation: dict, cls_token: bool) -> torch.Tensor:
    """``[local rows (+1), table rows]``: the constant matrix that maps the learned position table of a
    ``grid`` of patches to the ``local_patch_dims`` grid, as the vendor precomputes it (bicubic
    F.interpolate of each one-hot table row, scale (local + interpolate_offset) / global); with a cls
    token its row comes first and reads the table's last row."""
    gh, gw = grid
    lh, lw = interpolation["local_patch_dims"]
    offset = interpolation["interpolate_offset"]
    n = gh * gw
    eye = torch.eye(n, dtype=torch.float32).reshape(n, 1, gh, gw)
    out = nn.functional.interpolate(eye, mode="bicubic", antialias=interpolation["antialias"],
                                    scale_factor=((lh + offset) / gh, (lw + offset) / gw))
    matrix = out.reshape(n, -1).transpose(0, 1)
    if cls_token:
        matrix = nn.functional.pad(matrix, (0, 1, 1, 0))
        matrix[0, -1] = 1.0
    return matrix


class ViTEmbeddingLayer(nn.Module):
    def __init__(self, cfg: ViTModelConfig) -> None:
        super().__init__()
        self.patch_size = cfg.patch_size
        self.hidden_size = cfg.hidden_size
        self.prepend_cls_token = cfg.prepend_cls_token
        self.use_conv_patchified_embedding = cfg.use_conv_patchified_embedding
        self.num_patches = (cfg.image_size[0] // cfg.patch_size[0]) * (cfg.image_size[1] // cfg.patch_size[1])
        if cfg.use_conv_patchified_embedding:
            self.linear_proj = nn.Conv2d(cfg.num_channels, cfg.hidden_size, kernel_size=cfg.patch_size,
                                         stride=cfg.patch_size, bias=cfg.use_embed_proj_bias)
        else:
            self.linear_proj = nn.Linear(cfg.patch_size[0] * cfg.patch_size[1] * cfg.num_channels, cfg.hidden_size,
                                         bias=cfg.use_embed_proj_bias)
        self.position_embeddings = None
        if cfg.position_embedding_type == "learned":
            self.position_embeddings = nn.Embedding(self.num_patches + int(cfg.prepend_cls_token), cfg.hidden_size)
        self.cls_embedding = nn.Parameter(torch.zeros(cfg.hidden_size)) if cfg.prepend_cls_token else None
        self.mask_token = nn.Parameter(torch.zeros(cfg.hidden_size)) if cfg.use_masked_patches else None
        self.dropout_embd = nn.Dropout(cfg.embedding_dropout_rate)
        self.post_embed_ln = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon) \
            if cfg.use_post_embed_layer_norm else None
        matrix = None
        if cfg.interpolate_position_embedding is not None:  # not in checkpoints: a constant of the config
            grid = [cfg.image_size[0] // cfg.patch_size[0], cfg.image_size[1] // cfg.patch_size[1]]
            matrix = bicubic_interpolation_matrix(grid, cfg.interpolate_position_embedding, cfg.prepend_cls_token)
        self.register_buffer("interpolation_matrix", matrix, persistent=False)
        with torch.no_grad():
            make_initializer(cfg.projection_initializer)(self.linear_proj.weight)
            if self.linear_proj.bias is not None:
                self.linear_proj.bias.zero_()
            if self.cls_embedding is not None:
                make_initializer(cfg.cls_token_initializer)(self.cls_embedding)
            if self.position_embeddings is not None:
                make_initializer(cfg.position_embedding_initializer)(self.position_embeddings.weight)

    def _position_ids(self, device: torch.device) -> torch.Tensor:
        """Rows of the position table in sequence order: the cls token (if any) takes the last row."""
        ids = torch.arange(self.num_patches, device=device)
        if self.prepend_cls_token:
            ids = torch.cat([torch.full((1,), self.num_patches, device=device, dtype=ids.dtype), ids])
        return ids

    def _positions(self, x: torch.Tensor) -> torch.Tensor:
        """The table's rows for ``x``'s sequence, interpolated (a matmul with the constant matrix, as the
        vendor's) when ``x`` holds fewer patches than the table, e.g. a DINOv2 local crop."""
        rows = self.position_embeddings.weight.shape[0]
        if x.shape[1] == rows:
            return self.position_embeddings(self._position_ids(x.device))
        if self.interpolation_matrix is None or self.interpolation_matrix.shape[0] != x.shape[1]:
            raise ValueError(f"ViT: an image of {x.shape[1] - int(self.prepend_cls_token)} patches, but the "
                             f"position table holds {self.num_patches} and interpolate_position_embedding."
                             "local_patch_dims does not give that grid; make the crop size match")
        return self.interpolation_matrix.to(self.position_embeddings.weight.dtype) @ self.position_embeddings.weight

    def forward(self, images: torch.Tensor, masks: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``images`` ``[b, c, h, w]`` -> ``[b, (1 +) patches, hidden]``; ``masks`` (``use_masked_patches``)
        replaces the masked patches by ``mask_token`` before the position embedding."""
        b = images.shape[0]
        if self.use_conv_patchified_embedding:
            x = self.linear_proj(images).flatten(2).transpose(1, 2)
        else:
            x = self.linear_proj(patchify(images, self.patch_size))
        if masks is not None:
            if self.mask_token is None:
                raise ValueError("masks: given but use_masked_patches is false")
            m = masks.reshape(b, -1, 1).to(x.dtype)
            x = m * self.mask_token.to(x.dtype) + (1 - m) * x
        if self.cls_embedding is not None:
            x = torch.cat([self.cls_embedding.to(x.dtype).expand(b, 1, -1), x], dim=1)
        if self.position_embeddings is not None:
            x = x + self._positions(x).to(x.dtype)
        x = self.dropout_embd(x)
        return self.post_embed_ln(x) if self.post_embed_ln is not None else x


class ViTEncoder(nn.Module):
    def __init__(self, cfg: ViTModelConfig) -> None:
        super().__init__()
        n = cfg.num_hidden_layers
        drops = [cfg.stochastic_depth_drop_prob] * n
        if cfg.stochastic_depth_drop_prob_schedule == "linear" and n > 1:  # 0 .. p, as np.linspace
            drops = [cfg.stochastic_depth_drop_prob * i / (n - 1) for i in range(n)]
        layers = [TransformerEncoderLayer(
            cfg.hidden_size, cfg.num_heads, cfg.filter_size, dropout=cfg.dropout_rate, activation=cfg.nonlinearity,
            layer_norm_eps=cfg.layer_norm_epsilon, norm_first=cfg.norm_first,
            attention_dropout_rate=cfg.attention_dropout_rate, attention_type=cfg.attention_type,
            attention_softmax_fp32=cfg.attention_softmax_fp32,
            use_projection_bias_in_attention=cfg.use_projection_bias_in_attention,
            use_ffn_bias_in_attention=cfg.use_ffn_bias_in_attention, use_ffn_bias=cfg.use_ffn_bias,
            attention_initializer=cfg.attention_initializer, ffn_initializer=cfg.ffn_initializer,
            num_kv_groups=cfg.num_kv_groups, layerscale_value=cfg.layerscale_value,
            stochastic_depth_drop_prob=drops[i] if cfg.stochastic_depth_drop_prob > 0 else 0.0,
            stochastic_depth_mode=cfg.stochastic_depth_mode) for i in range(n)]
        norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon) if cfg.use_final_layer_norm else None
        self.transformer_encoder = TransformerEncoder(layers, norm)
        self.pooler = Pooler(cfg.hidden_size, cfg.pooler_nonlinearity or cfg.nonlinearity, cfg.use_ffn_bias,
                             cfg.pooler_initializer) if cfg.use_encoder_pooler_layer else None

    def forward(self, embeddings: torch.Tensor, extract_layer_idx: Optional[int] = None):
        """(hidden states, pooled state): the pooler's output, else the first token's state."""
        hidden = self.transformer_encoder(embeddings, extract_layer_idx)
        pooled = self.pooler(hidden) if self.pooler is not None else hidden[:, 0]
        return hidden, pooled


class ViTModel(nn.Module):
    """The trunk: images -> (hidden states, pooled state)."""

    def __init__(self, cfg: ViTModelConfig) -> None:
        super().__init__()
        self.embedding_layer = ViTEmbeddingLayer(cfg)
        self.encoder = ViTEncoder(cfg)

    def forward(self, input_image: Optional[torch.Tensor] = None,
                input_image_embeddings: Optional[torch.Tensor] = None):
        if (input_image is None) == (input_image_embeddings is None):
            raise ValueError("ViTModel: pass exactly one of input_image and input_image_embeddings")
        if input_image_embeddings is None:
            input_image_embeddings = self.embedding_layer(input_image)
        return self.encoder(input_image_embeddings)

    def extract_features(self, input_embeddings: torch.Tensor, extract_layer_idx: int) -> torch.Tensor:
        """The hidden states after block ``extract_layer_idx`` (inclusive), without the final norm."""
        return self.encoder(input_embeddings, extract_layer_idx)[0]
