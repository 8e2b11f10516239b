"""Your model: a small CNN that tells three shapes apart (see data.py).

The model function (``model.name: "model:build_model"`` in params.yaml) takes the keys of the params
file's ``model`` section as keyword arguments (its signature is their schema: an unknown or mistyped
key is an error naming the file and line) and returns a ``torch.nn.Module`` whose ``forward(batch)``
returns the loss. ``batch`` is what the data function's DataLoader yields, moved to the device.

Eval metrics: a ``cstorch.metrics`` metric created in ``__init__`` and updated in ``forward`` while
``not self.training``; cs-run reports it beside ``eval/loss`` under its name.
"""

from __future__ import annotations

import torch
from torch import nn

import cs_run as cstorch


class SmallCNN(nn.Module):
    """Two 3x3 convolutions with ReLU and pooling, then a linear classifier."""

    def __init__(self, channels: int, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, kernel_size=3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(2 * channels, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(images), 1))


class ShapesModel(nn.Module):
    """The network with its loss (``forward(batch) -> loss``) and an eval accuracy metric."""

    def __init__(self, channels: int, num_classes: int) -> None:
        super().__init__()
        self.net = SmallCNN(channels, num_classes)
        self.loss_fn = nn.CrossEntropyLoss()
        self.accuracy = cstorch.metrics.AccuracyMetric("eval/accuracy")

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        images, labels = batch
        logits = self.net(images)
        if not self.training:
            self.accuracy(labels=labels.clone(), predictions=logits.argmax(-1).int())
        return self.loss_fn(logits, labels)


def build_model(channels: int = 8, num_classes: int = 3) -> nn.Module:
    """The model function: ``channels`` and ``num_classes`` are the valid ``model`` keys."""
    if channels < 1 or num_classes < 2:
        raise ValueError(f"channels must be >= 1 and num_classes >= 2, got {channels} and {num_classes}")
    return ShapesModel(channels, num_classes)
