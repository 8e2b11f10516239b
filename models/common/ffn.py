"""The decoder's feed-forward network (FeedForwardNetwork.FeedForwardNetwork): ``ffn.0`` projects to
``filter_size`` and applies the activation, ``ffn.1`` projects back (then dropout). A GLU activation
gives ``ffn.0`` a second projection, ``linear_layer_for_glu``, whose output is gated: for swiglu,
``linear_layer(x) * silu(linear_layer_for_glu(x))``. The encoders' heads and pooler (bert,
vision_transformer) are its one-layer form, :class:`Dense` and :class:`Pooler`.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from cs_run.models.common.activations import get_activation, is_glu
from cs_run.models.common.initializers import make_initializer

__all__ = ["FeedForwardNetwork", "SingleFeedForwardLayer", "Dense", "Pooler", "init_layers"]


class SingleFeedForwardLayer(nn.Module):
    def __init__(self, inputs: int, outputs: int, bias: bool, activation: Optional[str] = None,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.linear_layer = nn.Linear(inputs, outputs, bias=bias)
        self.linear_layer_for_glu = nn.Linear(inputs, outputs, bias=bias) if activation and is_glu(activation) \
            else None
        self.act_layer = get_activation(activation) if activation else None
        self.dropout_layer = nn.Dropout(dropout) if dropout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.linear_layer_for_glu is not None:
            out = self.act_layer(self.linear_layer(x), self.linear_layer_for_glu(x))
        else:
            out = self.linear_layer(x)
            if self.act_layer is not None:
                out = self.act_layer(out)
        return self.dropout_layer(out) if self.dropout_layer is not None else out


def init_layers(layers: nn.ModuleList, initializers: list) -> None:
    """Each layer's weights (its GLU gate's too) drawn from its initializer spec, its biases zero."""
    with torch.no_grad():
        for layer, spec in zip(layers, initializers):
            init = make_initializer(spec)
            for linear in (layer.linear_layer, layer.linear_layer_for_glu):
                if linear is not None:
                    init(linear.weight)
                    if linear.bias is not None:
                        linear.bias.zero_()


class FeedForwardNetwork(nn.Module):
    def __init__(self, hidden_size: int, filter_size: int, activation: str, dropout: float, bias: bool,
                 initializer: dict, output_initializer: dict) -> None:
        super().__init__()
        self.ffn = nn.ModuleList([SingleFeedForwardLayer(hidden_size, filter_size, bias, activation),
                                  SingleFeedForwardLayer(filter_size, hidden_size, bias, None, dropout)])
        init_layers(self.ffn, [initializer, output_initializer])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.ffn:
            x = layer(x)
        return x


class Dense(nn.Module):
    """The vendor's one-layer FeedForwardNetwork (``ffn.0.linear_layer``): a linear map and an optional
    activation, the form of the encoders' heads and poolers (bert, vision_transformer)."""

    def __init__(self, inputs: int, outputs: int, bias: bool, initializer: dict,
                 activation: Optional[str] = None) -> None:
        super().__init__()
        self.ffn = nn.ModuleList([SingleFeedForwardLayer(inputs, outputs, bias, activation)])
        with torch.no_grad():
            make_initializer(initializer)(self.ffn[0].linear_layer.weight)
            if bias:
                self.ffn[0].linear_layer.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn[0](x)


class Pooler(nn.Module):
    """The vendor's BertPooler without its norm: a :class:`Dense` layer and activation on the first token's
    state (bert's pooler, vision_transformer's ``use_encoder_pooler_layer``)."""

    def __init__(self, hidden_size: int, activation: Optional[str], bias: bool, initializer: dict) -> None:
        super().__init__()
        self.pooler = Dense(hidden_size, hidden_size, bias, initializer, activation)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.pooler(hidden_states[:, 0])
