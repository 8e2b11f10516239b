"""The Model Zoo's activations by their params names (``nonlinearity``): plain ones take one tensor,
GLU ones (``swiglu``, ``geglu``, ``reglu``, ``liglu``, ``swiglu_clamped``) take the FFN's two projections.

A GLU activation ``f(x1, x2) = x1 * act(x2)``: ``x1`` is the FFN's ``linear_layer`` output and ``x2`` its
``linear_layer_for_glu`` output, as in the Model Zoo's ``SingleFeedForwardLayer``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

__all__ = ["ACTIVATIONS", "GLU_ACTIVATIONS", "get_activation", "is_glu"]


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def gelu_fast(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


def squared_gelu(x: torch.Tensor) -> torch.Tensor:
    g = F.gelu(x)
    return g * g


def squared_relu(x: torch.Tensor) -> torch.Tensor:
    r = F.relu(x)
    return r * r


def linear(x: torch.Tensor) -> torch.Tensor:
    return x


def swiglu_clamped(x1: torch.Tensor, x2: torch.Tensor, limit: float = 7.0) -> torch.Tensor:
    """GPT-OSS's clamped SwiGLU; gradients stop outside the clamp range as with torch.clamp."""
    return (torch.clamp(x1, -limit, limit) + 1) * quick_gelu(torch.clamp(x2, max=limit))


ACTIVATIONS: dict[str, Callable] = {
    "relu": F.relu, "leaky_relu": F.leaky_relu, "silu": F.silu, "swish": F.silu, "gelu": F.gelu, "tanh": torch.tanh,
    "gelu_new": gelu_new, "gelu_fast": gelu_fast, "quick_gelu": quick_gelu, "squared_gelu": squared_gelu,
    "squared_relu": squared_relu, "mish": F.mish, "linear": linear, "sigmoid": torch.sigmoid, "relu6": F.relu6,
    "liglu": lambda x1, x2: x1 * x2,
    "geglu": lambda x1, x2: x1 * F.gelu(x2),
    # not a Model Zoo name: GEGLU on the tanh GELU of transformers' gelu_pytorch_tanh (every published Gemma 2),
    # which the vendor's converter maps to the erf geglu; convert --from hf writes it so the logits match
    "geglu_tanh": lambda x1, x2: x1 * F.gelu(x2, approximate="tanh"),
    "reglu": lambda x1, x2: x1 * F.relu(x2),
    "swiglu": lambda x1, x2: x1 * F.silu(x2),
    "swiglu_clamped": swiglu_clamped,
}
GLU_ACTIVATIONS = frozenset({"liglu", "geglu", "geglu_tanh", "reglu", "swiglu", "swiglu_clamped"})


def is_glu(name: str) -> bool:
    return name.lower() in GLU_ACTIVATIONS


def get_activation(name: str) -> Callable:
    """The activation called ``name`` (case-insensitive, as the Model Zoo). KeyError if unknown."""
    return ACTIVATIONS[name.lower()]
