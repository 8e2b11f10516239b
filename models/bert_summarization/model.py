"""BERT extractive summarization (model.name ``bert/extractive_summarization``): the Model Zoo's
BertSummarizationModel of Release 2.10 (``models/nlp/bert/extractive_summarization/model.py`` and
``bert_extractive_summarization.py``): bert's encoder without a pooler (``model.bert``), its hidden states
gathered at each sentence's [CLS] position (``cls_indices``), and a linear classifier (``model.classifier``,
N(0, 0.02), bias 0, ``use_cls_bias``) giving ``num_labels`` (1 or 2) logits per sentence.

Loss (BertForSummarizationLoss): cross entropy per sentence times ``cls_weights``, summed, divided by the batch
size, times ``loss_weight`` (0 or unset: 1). The vendor's eval metric (ROUGE) is refused there
(``compute_eval_metrics`` raises NotImplementedError); here too, by name. Unlike the other heads this config
keeps ``nonlinearity`` as the encoder's activation (its post_init does not copy ``encoder_nonlinearity``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch
import torch.nn.functional as F
from torch import nn

from cs_run.models.bert.model import BertConfig, BertModel
from cs_run.models.common.config import config_signature

__all__ = ["BertSummarizationConfig", "BertForSummarization", "BertSummarizationModel", "build", "build_model"]

_PRETRAINING_ONLY = ("use_ffn_bias_in_mlm", "use_output_bias_in_mlm", "label_smoothing", "disable_nsp",
                     "pad_token_id", "num_classes")


@dataclass
class BertSummarizationConfig(BertConfig):
    """The ``model:`` keys of ``bert/extractive_summarization`` (BertSummarizationModelConfig, Release 2.10)."""

    num_labels: Literal[1, 2] = 2
    """Logits per sentence."""
    loss_weight: Optional[float] = 1.0
    """The loss's factor (0 or null: 1, as the vendor's validator)."""
    use_cls_bias: bool = True
    """The classifier has a bias."""
    vocab_file: Optional[str] = None
    """The word-piece vocabulary (the data reads its [PAD] id)."""
    vocab_size: int = 30522
    attention_dropout_rate: Optional[float] = 0.1
    max_position_embeddings: Optional[int] = 1024
    embedding_dropout_rate: Optional[float] = None
    """None: ``dropout_rate``."""
    num_segments: Optional[int] = 2
    add_pooling_layer: bool = False
    """Always false (the vendor's Literal[False])."""
    compute_eval_metrics: bool = False

    def resolved(self) -> "BertSummarizationConfig":
        """The encoder's checks (BertConfig.resolved) with this head's post_init: no pooler, embedding dropout
        ``embedding_dropout_rate`` when given, ``nonlinearity`` kept, padding id ``embedding_pad_token_id``."""
        for key in _PRETRAINING_ONLY:
            if getattr(self, key) != getattr(BertConfig, key):
                raise ValueError(f"{key}: a bert pretraining key; bert/extractive_summarization has no such key "
                                 "(drop it)")
        if self.num_labels not in (1, 2):
            raise ValueError(f"num_labels: must be 1 or 2, got {self.num_labels}")
        if self.add_pooling_layer:
            raise ValueError("add_pooling_layer: must be false for bert/extractive_summarization (it has no pooler)")
        if self.compute_eval_metrics:
            raise ValueError("compute_eval_metrics: the Model Zoo's ROUGE metric for this model is not implemented "
                             "(its own code raises NotImplementedError); set it false")
        c = BertConfig.resolved(dataclasses.replace(self, pad_token_id=self.embedding_pad_token_id, disable_nsp=True))
        c.disable_nsp = False
        c.nonlinearity = self.nonlinearity
        c.embedding_dropout_rate = c.dropout_rate if self.embedding_dropout_rate is None \
            else self.embedding_dropout_rate
        c.loss_weight = self.loss_weight or 1.0
        return c


class BertForSummarization(nn.Module):
    """``bert``, the [CLS] positions' hidden states, ``classifier``: logits [batch, max_cls_tokens, num_labels]."""

    def __init__(self, c: BertSummarizationConfig) -> None:
        super().__init__()
        self.bert = BertModel(c)
        self.classifier = nn.Linear(c.hidden_size, c.num_labels, bias=c.use_cls_bias)
        with torch.no_grad():
            self.classifier.weight.normal_(mean=0.0, std=0.02)
            if self.classifier.bias is not None:
                self.classifier.bias.zero_()

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor],
                token_type_ids: Optional[torch.Tensor], cls_tokens_positions: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.bert(input_ids, attention_mask, token_type_ids)
        index = cls_tokens_positions.long()[..., None].expand(-1, -1, hidden.shape[-1])
        return self.classifier(torch.gather(hidden, 1, index))


class BertSummarizationModel(nn.Module):
    """:class:`BertForSummarization` (``.model``) with the vendor's loss: ``forward(batch) -> loss``."""

    def __init__(self, config: BertSummarizationConfig) -> None:
        super().__init__()
        c = config.resolved()
        self.spec = c
        self.config = dataclasses.asdict(c)
        self.num_labels, self.loss_weight = c.num_labels, c.loss_weight
        self.model = BertForSummarization(c)

    def forward(self, batch: dict) -> torch.Tensor:
        logits = self.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                            batch["cls_indices"])
        labels = batch["labels"]
        token_loss = F.cross_entropy(logits.float().reshape(-1, self.num_labels), labels.reshape(-1).long(),
                                     reduction="none")
        weights = batch["cls_weights"].to(token_loss.dtype).reshape(-1)
        return torch.sum(token_loss * weights) / labels.shape[0] * self.loss_weight


def build(config: BertSummarizationConfig) -> BertSummarizationModel:
    """The family's builder (:attr:`cs_run.registry.ModelSpec.builder`): the model of one config."""
    return BertSummarizationModel(config)


def build_model(**keys: Any) -> BertSummarizationModel:
    """Model function of ``model.name: bert/extractive_summarization``: the keys are
    :class:`BertSummarizationConfig`'s fields."""
    return build(BertSummarizationConfig(**keys))


build_model.__signature__ = config_signature(BertSummarizationConfig)
