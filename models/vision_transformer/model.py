"""vision_transformer: the Model Zoo's ViT image classifier (ViTClassificationModel under
ViTClassificationWrapperModel): the trunk's pooled state through a linear classifier, cross entropy
against the labels, and in eval the ``eval/accuracy_cls`` metric.

Checkpoint keys are the vendor's: ``model.vit_model.*`` (the trunk), ``model.classifier.classifier.ffn.0.*``.
"""

from __future__ import annotations

import dataclasses
import re
import typing

import torch
from torch import nn

from cs_run.metrics import AccuracyMetric
from cs_run.models.common.ffn import Dense
from cs_run.models.vision_transformer.config import VisionTransformerConfig
from cs_run.models.vision_transformer.trunk import ViTModel

__all__ = ["ViTClassificationModel", "ViTClassificationWrapperModel", "build", "build_model"]


class ViTClassificationModel(nn.Module):
    """Images -> class logits."""

    def __init__(self, cfg: VisionTransformerConfig) -> None:
        super().__init__()
        self.vit_model = ViTModel(cfg)
        self.use_dinov2_classifier = cfg.use_dinov2_classifier
        width = cfg.hidden_size * (2 if cfg.use_dinov2_classifier else 1)
        self.classifier = nn.Module()  # the vendor's BertClassifierHead: its one layer is classifier.classifier
        self.classifier.classifier = Dense(width, cfg.num_classes, cfg.use_bias_in_output, cfg.default_initializer)

    def forward(self, input_image: torch.Tensor) -> torch.Tensor:
        hidden, pooled = self.vit_model(input_image)
        if self.use_dinov2_classifier:
            pooled = torch.cat([hidden[:, 0], hidden[:, 1:].mean(dim=1)], dim=1)
        return self.classifier.classifier(pooled)


class ViTClassificationWrapperModel(nn.Module):
    """``forward((images, labels)) -> loss``, the runners' contract; ``config`` is the resolved keys."""

    def __init__(self, cfg: VisionTransformerConfig) -> None:
        super().__init__()
        self.config = dataclasses.asdict(cfg)
        self.num_classes = cfg.num_classes
        self.model = ViTClassificationModel(cfg)
        self.loss_fn = nn.CrossEntropyLoss()
        self.accuracy_metric_cls = AccuracyMetric("eval/accuracy_cls") if cfg.compute_eval_metrics else None
        if cfg.freeze:
            _freeze(self.model, cfg.freeze)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        images, labels = batch
        logits = self.model(images)
        loss = self.loss_fn(logits.view(-1, self.num_classes), labels.view(-1).long())
        if self.accuracy_metric_cls is not None and not self.training:
            self.accuracy_metric_cls(labels=labels.clone(), predictions=logits.argmax(-1).int())
        return loss


def _freeze(model: nn.Module, patterns: list) -> None:
    """No gradient for the parameters whose names (relative to ``model``) match one of ``patterns``."""
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except (re.error, TypeError) as e:
            raise ValueError(f"freeze: {pattern!r} is not a regular expression ({e})") from None
    for name, param in model.named_parameters():
        if any(p.search(name) for p in compiled):
            param.requires_grad_(False)


def build(config: VisionTransformerConfig) -> ViTClassificationWrapperModel:
    """Builder of ``model.name: vision_transformer`` (ModelSpec.builder): the model of one config object."""
    return ViTClassificationWrapperModel(config)


def build_model(**keys: typing.Any) -> ViTClassificationWrapperModel:
    """Model function of ``model.name: vision_transformer``: the ``model:`` keys (checked against
    :class:`VisionTransformerConfig`, their schema) as a config, built."""
    return build(VisionTransformerConfig(**keys))
