"""dino's trunk and head modules: MultiImageViTModel (the shared ViT trunk over several views per sample) and
DinoHead (the Model Zoo 2.10 generic image encoders' ``heads/DinoHead.py``), with the vendor's module and
parameter names (``mlp.N``, ``last_layer.weight_g`` / ``last_layer.weight_v``) so checkpoints load by key."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from cs_run.models.common.initializers import make_initializer
from cs_run.models.dino.config import DinoHeadConfig
from cs_run.models.vision_transformer.trunk import ViTModel

__all__ = ["MultiImageViTModel", "WeightNormLinear", "DinoHead"]


class MultiImageViTModel(ViTModel):
    """The ViT trunk over ``[batch, views, c, h, w]``: the views are folded into the batch and unfolded after,
    giving ``([batch, views, tokens, hidden], [batch, views, hidden])``."""

    def forward(self, input_image: Optional[torch.Tensor] = None,  # noqa: D417 - the vendor's three arguments
                input_image_embeddings: Optional[torch.Tensor] = None, masks: Optional[torch.Tensor] = None):
        if (input_image is None) == (input_image_embeddings is None):
            raise ValueError("MultiImageViTModel: pass exactly one of input_image and input_image_embeddings")
        x = input_image if input_image is not None else input_image_embeddings
        b, n = x.shape[0], x.shape[1]
        x = x.reshape(b * n, *x.shape[2:])
        if input_image is not None:
            x = self.embedding_layer(x, masks.reshape(b * n, -1) if masks is not None else None)
        hidden, pooled = self.encoder(x)
        return hidden.reshape(b, n, -1, hidden.shape[-1]), pooled.reshape(b, n, -1)


class WeightNormLinear(nn.Module):
    """A bias-free Linear as torch's ``weight_norm`` makes it (the vendor's): ``weight = g * v / ||v||`` row by
    row, the parameters named ``weight_g`` ``[out, 1]`` and ``weight_v`` ``[out, in]``. Written out instead of
    the parametrization hook so the weight is an ordinary traced expression."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight_g = nn.Parameter(torch.ones(out_features, 1))
        self.weight_v = nn.Parameter(torch.empty(out_features, in_features))
        nn.init.kaiming_uniform_(self.weight_v, a=math.sqrt(5))  # nn.Linear's own init, which the vendor keeps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.weight_v
        weight = self.weight_g * v / v.norm(dim=1, keepdim=True)
        return nn.functional.linear(x, weight.to(x.dtype))


class DinoHead(nn.Module):
    """``[b, views, hidden]`` or ``[b, views, tokens, hidden]`` -> the same with ``output_size`` last: an MLP
    (GELU between layers) to ``bottleneck_size``, L2 normalisation, the weight-normalised last layer."""

    def __init__(self, cfg: DinoHeadConfig) -> None:
        super().__init__()
        n = max(cfg.num_layers, 1)
        sizes = [cfg.input_size] + [cfg.hidden_size] * (n - 1) + [cfg.bottleneck_size]
        layers: list[nn.Module] = []
        for i in range(n):
            layers.append(nn.Linear(sizes[i], sizes[i + 1], bias=cfg.use_bias_in_mlp))
            if i < n - 1:
                layers.append(nn.GELU())
        self.mlp = nn.Sequential(*layers)
        self.last_layer = WeightNormLinear(cfg.bottleneck_size, cfg.output_size)
        if cfg.norm_last_layer:  # the direction learns, the norm stays 1
            self.last_layer.weight_g.requires_grad_(False)
        init = make_initializer(cfg.initializer)
        with torch.no_grad():
            for layer in self.mlp:
                if isinstance(layer, nn.Linear):
                    init(layer.weight)
                    if layer.bias is not None:
                        layer.bias.zero_()

    def forward(self, data: torch.Tensor) -> torch.Tensor:
        lead = data.shape[:-1]
        x = self.mlp(data.reshape(-1, data.shape[-1]))
        eps = 1e-6 if x.dtype == torch.float16 else 1e-12
        x = nn.functional.normalize(x, dim=-1, p=2, eps=eps)
        return self.last_layer(x).reshape(*lead, -1)
