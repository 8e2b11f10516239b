"""BERT sequence classification (model.name ``bert/classifier``): the Model Zoo's
BertForSequenceClassificationModel of Release 2.10 (``models/nlp/bert/classifier/model.py`` and
``bert_classifier_model.py``): bert's encoder with its pooler (``model.bert``), dropout ``task_dropout`` and a
linear classifier (``model.classifier``, weights N(0, 0.02), bias 0).

Loss (BertForSequenceClassificationLoss): ``single_label_classification`` the mean cross entropy,
``regression`` (``num_labels: 1``) the mean squared error. Eval metrics with ``compute_eval_metrics``:
``eval/accuracy``, ``eval/f1_score`` (micro F1, two labels only) and, for MNLI's eval samples,
``eval/accuracy_matched`` / ``eval/accuracy_mismatched`` weighted by ``is_matched`` / ``is_mismatched``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch
import torch.nn.functional as F
from torch import nn

from cs_run.metrics import AccuracyMetric, FBetaScoreMetric
from cs_run.models.bert.model import BertConfig, BertModel
from cs_run.models.common.config import config_signature

__all__ = ["BertClassifierConfig", "BertForSequenceClassification", "BertForSequenceClassificationModel",
           "build", "build_model"]

ProblemType = Literal["single_label_classification", "regression"]
# BertConfig's pretraining keys that BertForSequenceClassificationModelConfig does not have (three of them,
# mlm_loss_weight, mlm_nonlinearity, share_embedding_weights, it takes as deprecated and unused)
_PRETRAINING_ONLY = ("use_ffn_bias_in_mlm", "use_output_bias_in_mlm", "label_smoothing", "disable_nsp",
                     "num_classes", "pad_token_id")


@dataclass
class BertClassifierConfig(BertConfig):
    """The ``model:`` keys of ``bert/classifier`` (BertForSequenceClassificationModelConfig, Release 2.10):
    BertModelConfig's keys with the classifier's defaults, and its three task keys."""

    num_labels: int = 2
    """Classes of the task (SST-2 2, MNLI 3); 1 is regression."""
    problem_type: ProblemType = "single_label_classification"
    """The loss: cross entropy, or mean squared error (regression)."""
    task_dropout: float = 0.1
    """Dropout on the pooled output before the classifier."""
    vocab_size: int = 30522
    attention_dropout_rate: Optional[float] = 0.1
    max_position_embeddings: Optional[int] = 1024
    num_segments: Optional[int] = 2
    embedding_dropout_rate: Optional[float] = None
    """None: ``dropout_rate``."""
    compute_eval_metrics: bool = False

    def resolved(self) -> "BertClassifierConfig":
        """The encoder's checks (BertConfig.resolved) with the classifier's post_init: embedding dropout is
        ``embedding_dropout_rate`` when given, padding id ``embedding_pad_token_id``, the pooler always on."""
        for key in _PRETRAINING_ONLY:
            if getattr(self, key) != getattr(BertConfig, key):
                raise ValueError(f"{key}: a bert pretraining key; bert/classifier has no such key (drop it)")
        if self.problem_type not in ("single_label_classification", "regression"):
            raise ValueError(f"problem_type: {self.problem_type!r} is not supported here; expected "
                             "single_label_classification or regression")
        if (self.problem_type == "regression") != (self.num_labels == 1):
            raise ValueError(f"num_labels: {self.num_labels} with problem_type {self.problem_type!r}; regression "
                             "takes num_labels 1, classification 2 or more")
        if not 0.0 <= self.task_dropout < 1.0:
            raise ValueError(f"task_dropout: must be in [0, 1), got {self.task_dropout}")
        if not self.add_pooling_layer:
            raise ValueError("add_pooling_layer: false leaves the classifier no pooled output; drop it")
        c = BertConfig.resolved(dataclasses.replace(self, pad_token_id=self.embedding_pad_token_id))
        c.embedding_dropout_rate = c.dropout_rate if self.embedding_dropout_rate is None \
            else self.embedding_dropout_rate
        return c


class BertForSequenceClassification(nn.Module):
    """``bert`` (the encoder and pooler), dropout, ``classifier``: ``forward`` returns logits [batch, num_labels]."""

    def __init__(self, c: BertClassifierConfig) -> None:
        super().__init__()
        self.bert = BertModel(c)
        self.dropout = nn.Dropout(c.task_dropout)
        self.classifier = nn.Linear(c.hidden_size, c.num_labels)
        with torch.no_grad():
            self.classifier.weight.normal_(mean=0.0, std=0.02)
            self.classifier.bias.zero_()

    def forward(self, input_ids: torch.Tensor, token_type_ids: Optional[torch.Tensor] = None,
                attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        _, pooled = self.bert(input_ids, attention_mask, token_type_ids)
        return self.classifier(self.dropout(pooled))


class BertForSequenceClassificationModel(nn.Module):
    """:class:`BertForSequenceClassification` (``.model``) with the vendor's loss and metrics:
    ``forward(batch) -> loss``."""

    def __init__(self, config: BertClassifierConfig) -> None:
        super().__init__()
        c = config.resolved()
        self.spec = c
        self.config = dataclasses.asdict(c)
        self.num_labels, self.problem_type = c.num_labels, c.problem_type
        self.model = BertForSequenceClassification(c)
        self.compute_eval_metrics = c.compute_eval_metrics
        if c.compute_eval_metrics:
            self.accuracy_metric = AccuracyMetric(name="eval/accuracy")
            self.f1_metric = FBetaScoreMetric(num_classes=2, beta=1.0, average_type="micro",
                                              name="eval/f1_score") if c.num_labels == 2 else None
            self.matched_accuracy_metric = AccuracyMetric(name="eval/accuracy_matched")
            self.mismatched_accuracy_metric = AccuracyMetric(name="eval/accuracy_mismatched")

    def loss(self, labels: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if self.problem_type == "regression":
            return F.mse_loss(logits.float().squeeze(), labels.float().squeeze())
        return F.cross_entropy(logits.float().view(-1, self.num_labels), labels.view(-1).long())

    def forward(self, batch: dict) -> torch.Tensor:
        logits = self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        loss = self.loss(batch["labels"], logits)
        if not self.training and self.compute_eval_metrics:
            labels, predictions = batch["labels"].clone(), logits.argmax(-1).int()
            self.accuracy_metric(labels=labels, predictions=predictions)
            if self.f1_metric is not None:
                self.f1_metric(labels=labels, predictions=predictions)
            if "is_matched" in batch:
                self.matched_accuracy_metric(labels=labels, predictions=predictions, weights=batch["is_matched"])
            if "is_mismatched" in batch:
                self.mismatched_accuracy_metric(labels=labels, predictions=predictions,
                                                weights=batch["is_mismatched"])
        return loss


def build(config: BertClassifierConfig) -> BertForSequenceClassificationModel:
    """The family's builder (:attr:`cs_run.registry.ModelSpec.builder`): the model of one config."""
    return BertForSequenceClassificationModel(config)


def build_model(**keys: Any) -> BertForSequenceClassificationModel:
    """Model function of ``model.name: bert/classifier``: the keys are :class:`BertClassifierConfig`'s fields."""
    return build(BertClassifierConfig(**keys))


build_model.__signature__ = config_signature(BertClassifierConfig)
