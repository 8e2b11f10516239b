"""The vision tower of the Model Zoo's multimodal models (llava, multimodal_simple): the ViT trunk
(:class:`~cs_run.models.vision_transformer.trunk.ViTModel`, with CLIP's settings in the vendor's files:
:mod:`cs_run.models.vision_transformer.clip`), the image features a language model reads from it
(:func:`image_features`: one block's output, no final norm) and the projector onto the text width
(:class:`Projector`, the vendor's FeedForwardNetwork, keys :class:`FeedForwardNetworkConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from cs_run.models.common.activations import ACTIVATIONS
from cs_run.models.common.config import key
from cs_run.models.common.ffn import SingleFeedForwardLayer
from cs_run.models.common.initializers import initializer_spec, make_initializer
from cs_run.models.vision_transformer.trunk import ViTModel

__all__ = ["image_features", "Projector", "FeedForwardNetworkConfig"]


def image_features(vit: ViTModel, images: torch.Tensor, layer_idx: Optional[int], mode: str) -> torch.Tensor:
    """The features of ``images`` [b, c, h, w] after block ``layer_idx`` (no final norm; None: every block
    and the final norm, as the vendor's extract_features): with ``mode`` ``patch`` the patches' only (the cls
    token's dropped), ``cls_patch`` all of them."""
    features = vit.extract_features(vit.embedding_layer(images), layer_idx)
    return features[:, 1:] if mode == "patch" and vit.embedding_layer.prepend_cls_token else features


@dataclass
class FeedForwardNetworkConfig:
    """``name: FeedForwardNetwork`` (Model Zoo 2.10 layers/FeedForwardNetwork.py FeedForwardNetworkConfig, its
    defaults): one linear layer per ``layers_units`` entry, each followed by its ``layers_activation`` (null:
    none) and dropout; weights from ``kernel_initializer`` (the last from ``output_layer_initializer`` when
    set), biases from ``bias_initializer``. An error's text starts at the key; the caller prefixes its section."""

    input_unit: int = key(1024, "2.2.0", "input width")
    layers_units: list = key([4096, 4096], "2.2.0", "output width of each layer")
    layers_activation: Optional[list] = key(None, "2.2.0", "activation after each layer (null: none)")
    layers_dropout_rates: Optional[list] = key(None, "2.2.0", "dropout after each layer (null: none)")
    use_bias: bool = key(False, "2.2.0", "the layers' biases")
    kernel_initializer: object = key("xavier_uniform", "2.2.0", "the layers' weights")
    bias_initializer: object = key("zeros", "2.2.0", "the layers' biases")
    output_layer_initializer: object = key(None, "2.2.0", "the last layer's weights (null: kernel_initializer)")

    def __post_init__(self) -> None:
        n = len(self.layers_units) if isinstance(self.layers_units, list) else 0
        if not n or not all(isinstance(u, int) and u > 0 for u in [self.input_unit, *self.layers_units]):
            raise ValueError(f"layers_units: expected positive widths, got {self.layers_units!r}")
        for name in ("layers_activation", "layers_dropout_rates"):
            value = getattr(self, name)
            if value is None:
                setattr(self, name, [None] * n)
            elif not isinstance(value, list) or len(value) != n:
                raise ValueError(f"{name}: {value!r} needs one entry per layers_units entry ({n})")
        for act in self.layers_activation:
            if act is not None and str(act).lower() not in ACTIVATIONS:
                raise ValueError(f"layers_activation: unknown {act!r}; expected one of {', '.join(ACTIVATIONS)} "
                                 "or null")
        for rate in self.layers_dropout_rates:
            if rate is not None and not 0.0 <= rate < 1.0:
                raise ValueError(f"layers_dropout_rates: {rate} is not in [0, 1)")
        for name in ("kernel_initializer", "bias_initializer", "output_layer_initializer"):
            if getattr(self, name) is not None:
                setattr(self, name, initializer_spec(getattr(self, name), name))


class Projector(nn.Module):
    """The vendor's FeedForwardNetwork as a multimodal projector (``ffn.N.linear_layer``): one linear layer
    per width, each followed by its activation and dropout, initialised as its config says."""

    def __init__(self, cfg: FeedForwardNetworkConfig) -> None:
        super().__init__()
        widths = [cfg.input_unit, *cfg.layers_units]
        self.ffn = nn.ModuleList([SingleFeedForwardLayer(widths[i], widths[i + 1], cfg.use_bias,
                                                         cfg.layers_activation[i], cfg.layers_dropout_rates[i] or 0.0)
                                  for i in range(len(cfg.layers_units))])
        kernels = [cfg.kernel_initializer] * len(self.ffn)
        if cfg.output_layer_initializer is not None:
            kernels[-1] = cfg.output_layer_initializer
        bias = make_initializer(cfg.bias_initializer)
        with torch.no_grad():
            for layer, spec in zip(self.ffn, kernels):
                init = make_initializer(spec)
                for linear in (layer.linear_layer, layer.linear_layer_for_glu):
                    if linear is not None:
                        init(linear.weight)
                        if linear.bias is not None:
                            bias(linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.ffn:
            x = layer(x)
        return x
