"""The Model Zoo fc_mnist model: flatten, depth x (Linear + activation + dropout), Linear(10), NLL of log-softmax."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from cs_run import amp
from cs_run.metrics import AccuracyMetric

__all__ = ["MNIST", "FcMnistModel", "build_model"]

_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid,
                "leaky_relu": nn.LeakyReLU, "silu": nn.SiLU}


class MNIST(nn.Module):
    """The classifier itself: the ten digits' logits (the Model Zoo's ``MNIST``)."""

    def __init__(self, depth: int, hidden_size: int | list[int], dropout: float, activation_fn: Optional[str],
                 use_bias: bool = True) -> None:
        super().__init__()
        sizes = hidden_size if isinstance(hidden_size, list) else [hidden_size] * depth
        layers, width = [], 28 * 28
        for size in sizes:
            layers.append(nn.Linear(width, size, bias=use_bias))
            width = size
        self.fc_layers = nn.ModuleList(layers)
        self.last_layer = nn.Linear(width, 10, bias=use_bias)
        self.nonlin = _ACTIVATIONS[activation_fn]() if activation_fn is not None else None
        self.dropout = nn.Dropout(dropout)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(inputs, 1)
        for layer in self.fc_layers:
            x = layer(x)
            if self.nonlin is not None:
                x = self.nonlin(x)
            x = self.dropout(x)
        return self.last_layer(x)


class FcMnistModel(nn.Module):
    """Wraps the classifier with its loss, the contract of cs-run's runners: ``forward(batch) -> loss``:
    NLL of the log-softmax (of the logits themselves with ``disable_softmax``, as the Model Zoo's).

    With ``compute_eval_metrics`` it updates the ``eval/accuracy`` metric in eval mode (computed on the
    host after the run).
    """

    def __init__(self, depth: int, hidden_size: int | list[int], dropout: float, activation_fn: Optional[str],
                 compute_eval_metrics: bool = False, use_bias: bool = True, disable_softmax: bool = False) -> None:
        super().__init__()
        self.model = MNIST(depth, hidden_size, dropout, activation_fn, use_bias)
        self.loss_fn = nn.NLLLoss()
        self.disable_softmax = disable_softmax
        self.accuracy = None
        if compute_eval_metrics:
            self.accuracy = AccuracyMetric("eval/accuracy")

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, labels = batch
        logits = self.model(inputs)
        if self.accuracy is not None and not self.training:
            self.accuracy(labels=labels.clone(), predictions=logits.argmax(-1).int())
        outputs = logits if self.disable_softmax else F.log_softmax(logits, dim=1)
        return self.loss_fn(outputs, labels)


def build_model(depth: Optional[int] = None, hidden_size: Optional[int | list] = None,
                hidden_sizes: Optional[list[int]] = None, dropout: float = 0.0, activation_fn: Optional[str] = None,
                compute_eval_metrics: bool | list = False, to_float16: bool = False, use_bias: bool = True,
                disable_softmax: bool = False) -> FcMnistModel:
    """Model function for ``model.name: fc_mnist``; its parameters are the valid ``model`` keys, with the
    Model Zoo 2.10 defaults (``MNISTModelConfig``): no activation (``activation_fn`` None; ``relu`` or,
    beyond the Model Zoo, gelu / tanh / sigmoid / leaky_relu / silu), no eval metrics, biases, log-softmax.

    The layer sizes have no defaults, as in the Model Zoo (its fc_mnist config raises "hidden_size and
    depth, or hidden_sizes must be provided"): ``hidden_sizes`` (one size per hidden layer; it takes
    precedence), or ``depth`` and ``hidden_size`` (also a list, then depth is its length).
    ``compute_eval_metrics``: true (or the Model Zoo 1.x list ``["accuracy"]``) reports eval/accuracy.
    ``to_float16``: as the vendor's fc_mnist, the weights are stored in the half type
    (``cstorch.amp.get_half_dtype()``)."""
    if activation_fn is not None and activation_fn not in _ACTIVATIONS:
        raise ValueError(f"activation_fn: unknown {activation_fn!r}; expected one of {', '.join(_ACTIVATIONS)} or "
                         "null (none, the default)")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout: must be in [0, 1), got {dropout}")
    if hidden_sizes is None and not isinstance(hidden_size, list):
        missing = [f"model.{key}" for key, value in (("depth", depth), ("hidden_size", hidden_size)) if value is None]
        if missing:
            raise ValueError(f"fc_mnist needs its layer sizes: model.depth and model.hidden_size, or model.hidden_sizes "
                             f"(a list, one size per hidden layer); missing {' and '.join(missing)} (the Model Zoo "
                             "fc_mnist params: depth: 10, hidden_size: 50; the bundled ones: depth: 2, hidden_size: 128)")
        if depth < 0:  # one key per message: the error names that key's line
            raise ValueError(f"depth: must be >= 0, got {depth}")
        if hidden_size < 1:
            raise ValueError(f"hidden_size: must be >= 1, got {hidden_size}")
    sizes = hidden_sizes if hidden_sizes is not None else hidden_size
    if isinstance(sizes, list) and not all(isinstance(n, int) and n >= 1 for n in sizes):
        raise ValueError(f"hidden_sizes: every size must be an integer >= 1, got {sizes}")
    if isinstance(compute_eval_metrics, list) and not set(compute_eval_metrics) <= {"accuracy"}:
        raise ValueError(f"compute_eval_metrics: fc_mnist computes accuracy only, got {compute_eval_metrics}")
    model = FcMnistModel(len(sizes) if isinstance(sizes, list) else depth, sizes, dropout, activation_fn,
                         bool(compute_eval_metrics), use_bias, disable_softmax)
    if to_float16:
        model.model.to(amp.get_half_dtype())
    return model
