"""BERT token classification (model.name ``bert/token_classifier``): the Model Zoo's
BertForTokenClassificationModel of Release 2.10 (``models/nlp/bert/token_classifier/model.py`` and
``bert_token_classifier.py``): bert's encoder without a pooler (``model.bert``), dropout
``encoder_output_dropout_rate`` and a linear classifier per token (``model.classifier``, N(0, 0.02), bias 0).

Loss (BertForTokenClassificationLoss): per-token cross entropy times the batch's ``loss_mask``, summed, divided
by the batch size, times ``loss_weight`` (and by the sequence length with ``include_padding_in_loss``). Eval
metric with ``compute_eval_metrics``: ``eval/f1_score``, macro F1 over the labels of ``label_vocab_file`` that
begin with B or I (the others, O, X, [CLS], [SEP], [PAD], are left out).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from cs_run.metrics import FBetaScoreMetric
from cs_run.models.bert.model import BertConfig, BertModel
from cs_run.models.common.config import config_signature

__all__ = ["BertTokenClassifierConfig", "BertForTokenClassification", "BertForTokenClassificationModel", "build",
           "build_model", "eval_ignore_labels"]

_PRETRAINING_ONLY = ("use_ffn_bias_in_mlm", "use_output_bias_in_mlm", "label_smoothing", "disable_nsp",
                     "pad_token_id")


@dataclass
class BertTokenClassifierConfig(BertConfig):
    """The ``model:`` keys of ``bert/token_classifier`` (BertForTokenClassificationModelConfig, Release 2.10):
    BertModelConfig's keys with the token classifier's defaults, and its task keys."""

    num_classes: Optional[int] = None
    """Labels per token (required; BC5CDR's label2id.json has 7)."""
    encoder_output_dropout_rate: Optional[float] = None
    """Dropout on the encoder's output before the classifier (required)."""
    loss_weight: float = 1.0
    include_padding_in_loss: bool = False
    """The loss is also divided by the sequence length (the data's loss_mask is then all ones)."""
    label_vocab_file: Optional[str] = None
    """label2id.json of the NER preprocessing; its B* and I* labels are scored by the eval F1."""
    dropout_rate: float = 0.0
    attention_dropout_rate: Optional[float] = 0.0
    embedding_dropout_rate: Optional[float] = None
    """None: ``dropout_rate``."""
    vocab_size: int = 30522
    max_position_embeddings: Optional[int] = 1024
    num_segments: Optional[int] = 2
    add_pooling_layer: bool = False
    """Always false (the vendor's Literal[False])."""
    compute_eval_metrics: bool = False

    def resolved(self) -> "BertTokenClassifierConfig":
        """The encoder's checks (BertConfig.resolved) with the token classifier's post_init: no pooler,
        embedding dropout ``embedding_dropout_rate`` when given, padding id ``embedding_pad_token_id``."""
        for key in _PRETRAINING_ONLY:
            if getattr(self, key) != getattr(BertConfig, key):
                raise ValueError(f"{key}: a bert pretraining key; bert/token_classifier has no such key (drop it)")
        for key in ("num_classes", "encoder_output_dropout_rate"):
            if getattr(self, key) is None:
                raise ValueError(f"{key}: required by bert/token_classifier")
        if self.add_pooling_layer:
            raise ValueError("add_pooling_layer: must be false for bert/token_classifier (it has no pooler)")
        if not 0.0 <= self.encoder_output_dropout_rate < 1.0:
            raise ValueError(f"encoder_output_dropout_rate: must be in [0, 1), got {self.encoder_output_dropout_rate}")
        if self.compute_eval_metrics and self.label_vocab_file is None:
            raise ValueError("label_vocab_file: required with compute_eval_metrics (the F1 scores its B and I labels)")
        c = BertConfig.resolved(dataclasses.replace(self, pad_token_id=self.embedding_pad_token_id, disable_nsp=True))
        c.disable_nsp = False
        c.embedding_dropout_rate = c.dropout_rate if self.embedding_dropout_rate is None \
            else self.embedding_dropout_rate
        return c


def eval_ignore_labels(label_vocab_file: str) -> list[int]:
    """The ids of label2id.json's labels that neither begin nor continue an entity (not B*, not I*)."""
    try:
        with open(label_vocab_file, encoding="utf-8") as f:
            label_map = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"label_vocab_file: {label_vocab_file} is not a readable label2id.json ({e})") from None
    if not isinstance(label_map, dict):
        raise ValueError(f"label_vocab_file: {label_vocab_file} must map each label to its id")
    return [int(i) for label, i in label_map.items() if not (label.startswith("B") or label.startswith("I"))]


class BertForTokenClassification(nn.Module):
    """``bert`` (the encoder), dropout, ``classifier``: ``forward`` returns logits [batch, length, num_classes]."""

    def __init__(self, c: BertTokenClassifierConfig) -> None:
        super().__init__()
        self.bert = BertModel(c)
        self.dropout = nn.Dropout(c.encoder_output_dropout_rate)
        self.classifier = nn.Linear(c.hidden_size, c.num_classes)
        with torch.no_grad():
            self.classifier.weight.normal_(mean=0.0, std=0.02)
            self.classifier.bias.zero_()

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        hidden, _ = self.bert(input_ids, attention_mask, token_type_ids)
        return self.classifier(self.dropout(hidden))


class BertForTokenClassificationModel(nn.Module):
    """:class:`BertForTokenClassification` (``.model``) with the vendor's loss and F1: ``forward(batch) -> loss``."""

    def __init__(self, config: BertTokenClassifierConfig) -> None:
        super().__init__()
        c = config.resolved()
        self.spec = c
        self.config = dataclasses.asdict(c)
        self.num_classes, self.loss_weight = c.num_classes, c.loss_weight
        self.include_padding_in_loss = c.include_padding_in_loss
        self.model = BertForTokenClassification(c)
        self.f1_metric = None
        if c.compute_eval_metrics:
            self.f1_metric = FBetaScoreMetric(num_classes=c.num_classes, beta=1.0, average_type="macro",
                                              ignore_labels=eval_ignore_labels(c.label_vocab_file),
                                              name="eval/f1_score")

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, loss_mask: Optional[torch.Tensor]) -> torch.Tensor:
        token_loss = F.cross_entropy(logits.float().reshape(-1, self.num_classes), labels.reshape(-1).long(),
                                     reduction="none")
        weight = self.loss_weight
        if loss_mask is not None:
            token_loss = token_loss * loss_mask.to(token_loss.dtype).reshape(-1)
            if self.include_padding_in_loss:
                weight = self.loss_weight / loss_mask.shape[1]
        return torch.sum(token_loss) / labels.shape[0] * weight

    def forward(self, batch: dict) -> torch.Tensor:
        logits = self.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        loss = self.loss(logits, batch["labels"], batch["loss_mask"])
        if not self.training and self.f1_metric is not None:
            self.f1_metric(labels=batch["labels"].clone(), predictions=logits.argmax(-1).int())
        return loss


def build(config: BertTokenClassifierConfig) -> BertForTokenClassificationModel:
    """The family's builder (:attr:`cs_run.registry.ModelSpec.builder`): the model of one config."""
    return BertForTokenClassificationModel(config)


def build_model(**keys: Any) -> BertForTokenClassificationModel:
    """Model function of ``model.name: bert/token_classifier``: the keys are :class:`BertTokenClassifierConfig`'s."""
    return build(BertTokenClassifierConfig(**keys))


build_model.__signature__ = config_signature(BertTokenClassifierConfig)
