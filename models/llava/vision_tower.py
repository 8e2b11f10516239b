"""The vision tower of the Model Zoo's multimodal models (llava; multimodal_simple's is the same): the ViT
trunk (:class:`~cs_run.models.vision_transformer.trunk.ViTModel`, with CLIP's settings in the vendor's
files: :mod:`cs_run.models.vision_transformer.clip`), the image features a language model reads from it
(:func:`image_features`: one block's output, no final norm) and the projector onto the text width
(:class:`Projector`, the vendor's FeedForwardNetwork).
"""

from __future__ import annotations

import torch
from torch import nn

from cs_run.models.common.ffn import SingleFeedForwardLayer, init_layers
from cs_run.models.vision_transformer.trunk import ViTModel

__all__ = ["image_features", "Projector"]


def image_features(vit: ViTModel, images: torch.Tensor, layer_idx: int, mode: str) -> torch.Tensor:
    """The features of ``images`` [b, c, h, w] after block ``layer_idx`` (no final norm): with ``mode``
    ``patch`` the patches' only (the cls token's dropped), ``cls_patch`` all of them."""
    features = vit.extract_features(vit.embedding_layer(images), layer_idx)
    return features[:, 1:] if mode == "patch" and vit.embedding_layer.prepend_cls_token else features


class Projector(nn.Module):
    """The vendor's FeedForwardNetwork as llava's projector (``ffn.N.linear_layer``): one linear layer per
    width, each followed by its activation and dropout; weights kaiming-uniform (a = sqrt(5), torch's
    nn.Linear default), biases zero."""

    def __init__(self, input_unit: int, layers_units: list, layers_activation: list, layers_dropout_rates: list,
                 use_bias: bool, kernel_initializer: dict) -> None:
        super().__init__()
        widths = [input_unit, *layers_units]
        self.ffn = nn.ModuleList([SingleFeedForwardLayer(widths[i], widths[i + 1], use_bias, layers_activation[i],
                                                         layers_dropout_rates[i] or 0.0)
                                  for i in range(len(layers_units))])
        init_layers(self.ffn, [kernel_initializer] * len(self.ffn))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.ffn:
            x = layer(x)
        return x
