"""dpr (``model.name: dpr``): the Model Zoo's DPRWrapperModel of Release 2.10 (``models/nlp/dpr/model.py``,
``dpr_model.py``) with its loss (``losses/dpr_loss.py``) and eval metric.

Two bert encoders (``model.question_encoder``, ``model.ctx_encoder``: bert's :class:`BertModel`, module names as
the vendor's BertModel, so its checkpoints load key for key), or one shared (``use_biencoder: false`` with
``encoder``). A batch holds per question ``num_context`` contexts (the positive first, then hard negatives),
``ctx_*`` of [batch, num_context, length]; the contexts are flattened to [batch * num_context, length] and every
question is scored against every context (``q2c = q @ c.T``), so the other questions' contexts are in-batch
negatives and the label of question i is context ``i * num_context`` (the processor's ``labels``). The pooled
embedding is the first token's hidden state (``cls``), that token through the encoder's pooler (``ffn_pooler``)
or the mean over unmasked tokens (``mean``).

Loss (DPRLoss): cross entropy of ``q2c / softmax_temperature``; with ``mutual_information`` also the
context-to-question loss over each question's positive context (``c2q``, labels ``context_labels``), mixed
``(1 - 1/(1 + C)) * q2c_loss + 1/(1 + C) * c2q_loss``. Eval metric with ``compute_eval_metrics``:
``eval/accuracy`` of ``argmax(q2c)`` against the labels.

Release 2.2's keys: ``scale_similarity`` divides the q2c scores by ``sqrt(hidden_size)`` of the question encoder
(2.2 ``dpr_model.py`` get_similarity_scores; 2.3 removed it). The 2.2 / 2.3 files give each encoder its own
``mixed_precision`` and ``fp16_type``: the vendor's runner reads the run's precision from ``model.mixed_precision``
/ ``model.fp16_type`` only and its encoder builder reads neither (2.2's check_unused_model_params drops them, 2.3
keeps them as ModelConfig fields no code reads), so they are type-checked and have no effect here either (those
files, with no model-level ``mixed_precision``, run in float32 as the vendor's did).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch
import torch.nn.functional as F
from torch import nn

from cs_run.metrics import AccuracyMetric
from cs_run.models.bert.model import BertConfig, BertModel
from cs_run.models.common.config import config_signature, key

__all__ = ["DPRConfig", "DPRModel", "DPRWrapperModel", "dpr_loss", "mean_pooling", "build", "build_model"]

POOLER_TYPES = ("mean", "cls", "ffn_pooler")
# BertConfig's pretraining keys that DPREncoderConfig does not have (it takes mlm_loss_weight, mlm_nonlinearity
# and share_embedding_weights as deprecated and unused)
_NOT_DPR = ("use_ffn_bias_in_mlm", "use_output_bias_in_mlm", "label_smoothing", "num_classes", "compute_eval_metrics")
_DEPRECATED = ("mlm_loss_weight", "mlm_nonlinearity", "share_embedding_weights")
# an encoder's copies of the run's precision keys (Release 2.2 / 2.3 files): read by no vendor code (module doc)
_UNREAD_PRECISION = ("mixed_precision", "fp16_type")
_HALF_TYPES = ("bfloat16", "float16", "cbfloat16")


def encoder_config(keys: Any, where: str, add_pooling_layer: bool) -> BertConfig:
    """One encoder's BertConfig from its ``model.<where>`` mapping (DPREncoderConfig: BertModelConfig's keys, its
    post_init: embedding dropout ``dropout_rate``, pad id ``pad_token_id``, ``nonlinearity`` the
    ``encoder_nonlinearity``, two segments unless ``disable_nsp``; the pooler only for ``ffn_pooler``).

    Raises:
        ValueError: naming ``<where>.<key>``.
    """
    if not isinstance(keys, dict):
        raise ValueError(f"{where}: expected a mapping of bert encoder keys (vocab_size, hidden_size, ...), "
                         f"got {keys!r}")
    fields = {f.name for f in dataclasses.fields(BertConfig)} - set(_NOT_DPR)
    unknown = sorted(set(keys) - fields - {"add_pooling_layer"} - set(_UNREAD_PRECISION))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: not a key of a DPR encoder (bert's encoder keys: vocab_size, "
                         "hidden_size, num_hidden_layers, num_heads, filter_size, ...)")
    if not isinstance(keys.get("mixed_precision", False), bool):
        raise ValueError(f"{where}.mixed_precision: expected true or false, got {keys['mixed_precision']!r}")
    if keys.get("fp16_type", "bfloat16") not in _HALF_TYPES:
        raise ValueError(f"{where}.fp16_type: {keys['fp16_type']!r} is not one of {', '.join(_HALF_TYPES)}")
    dropped = {"add_pooling_layer", *_DEPRECATED, *_UNREAD_PRECISION}
    given = {k: v for k, v in keys.items() if k not in dropped}
    try:
        c = BertConfig(**given).resolved()
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}.{e}") from None
    c.add_pooling_layer = add_pooling_layer
    c.pooler_nonlinearity = (keys.get("pooler_nonlinearity") or c.nonlinearity) if add_pooling_layer else None
    return c


@dataclass
class DPRConfig:
    """The ``model:`` keys of ``dpr`` (DPRModelConfig, Release 2.10)."""

    q_encoder: Optional[dict] = key(None, "2.2.0", "the question encoder's bert keys (bi-encoder)")
    ctx_encoder: Optional[dict] = key(None, "2.2.0", "the context encoder's bert keys (bi-encoder)")
    encoder: Optional[dict] = key(None, "2.3.0", "one encoder's keys: shared with use_biencoder false, else "
                                  "copied to both sides")
    softmax_temperature: float = key(1.0, "2.3.0", "the scores are divided by it before the softmax")
    mutual_information: bool = key(False, "2.3.0", "add the context-to-question loss")
    use_biencoder: bool = key(True, "2.3.0", "two encoders, or one shared (with encoder)")
    pooler_type: Literal["mean", "cls", "ffn_pooler"] = key("cls", "2.3.0", "the sequence embedding: the first "
                                                            "token's state, it through a pooler, or the masked mean")
    compute_eval_metrics: bool = key(False, "2.3.0", "eval/accuracy of the top-scored context")
    selected_encoder: Optional[Literal["q_encoder", "ctx_encoder", "encoder"]] = key(
        None, "2.4.0", "read by the vendor's embedding generation only; no effect here")
    scale_similarity: bool = key(False, "2.2.0", "divide the scores by sqrt(the question encoder's hidden_size) "
                                 "(Release 2.2 only)")

    def __post_init__(self) -> None:
        """DPRModelConfig's validate_encoders, the pooler choice and each encoder's keys, naming the key."""
        bi = self.q_encoder is not None and self.ctx_encoder is not None and self.encoder is None
        uni = self.q_encoder is None and self.ctx_encoder is None and self.encoder is not None
        if not (bi or uni):
            raise ValueError("q_encoder: give both q_encoder and ctx_encoder, or only encoder")
        if not self.use_biencoder and not uni:
            raise ValueError("use_biencoder: false shares one encoder: give only encoder (not q_encoder/ctx_encoder)")
        if self.pooler_type not in POOLER_TYPES:
            raise ValueError(f"pooler_type: {self.pooler_type!r} is not one of {', '.join(POOLER_TYPES)}")
        if self.scale_similarity and self.mutual_information:
            raise ValueError("scale_similarity: Release 2.2's key, from before mutual_information (2.3); no Model "
                             "Zoo release scales the context-to-question scores: set one of them false")
        if not self.softmax_temperature > 0:
            raise ValueError(f"softmax_temperature: must be > 0, got {self.softmax_temperature}")
        pooler = self.pooler_type == "ffn_pooler"
        for name in ("q_encoder", "ctx_encoder", "encoder"):
            if getattr(self, name) is not None:
                encoder_config(getattr(self, name), name, pooler)

    def encoders(self) -> tuple[BertConfig, Optional[BertConfig]]:
        """(question, context) encoder configs; context None when one encoder serves both."""
        pooler = self.pooler_type == "ffn_pooler"
        if self.q_encoder is not None:
            return (encoder_config(self.q_encoder, "q_encoder", pooler),
                    encoder_config(self.ctx_encoder, "ctx_encoder", pooler))
        c = encoder_config(self.encoder, "encoder", pooler)
        return c, (dataclasses.replace(c) if self.use_biencoder else None)


def mean_pooling(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of the hidden states over the mask's tokens (dpr_model.py mean_pooling, for Jina's embeddings)."""
    weights = mask.unsqueeze(-1).expand(hidden.size()).float()
    return (torch.sum(hidden * weights, 1) / torch.clamp(weights.sum(1), min=1e-9)).to(hidden.dtype)


class DPRModel(nn.Module):
    """``forward`` -> (q2c scores [B, B*C], c2q scores [B, B] or None, question and context embeddings)."""

    def __init__(self, question: BertConfig, context: Optional[BertConfig], pooler_type: str,
                 mutual_information: bool, scale_similarity: bool = False) -> None:
        super().__init__()
        self.score_divisor = math.sqrt(question.hidden_size) if scale_similarity else None
        self.question_encoder = BertModel(question)
        self.ctx_encoder = BertModel(context) if context is not None else None
        self.pooler_type = pooler_type
        self.mutual_information = mutual_information

    def _pool(self, encoder: BertModel, ids: torch.Tensor, mask: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
        hidden, pooled = encoder(ids, mask, segments)
        if self.pooler_type == "mean":
            return mean_pooling(hidden, mask)
        if self.pooler_type == "cls":
            return hidden[:, 0] if pooled is None else pooled
        return pooled

    def forward(self, questions_input_ids, questions_attention_mask, questions_token_type_ids, ctx_input_ids,
                ctx_attention_mask, ctx_token_type_ids):
        batch, num_context = questions_input_ids.shape[0], ctx_input_ids.shape[1]
        flat = [t.reshape(-1, t.shape[-1]) for t in (ctx_input_ids, ctx_attention_mask, ctx_token_type_ids)]
        q = self._pool(self.question_encoder, questions_input_ids, questions_attention_mask, questions_token_type_ids)
        c = self._pool(self.ctx_encoder or self.question_encoder, *flat)
        c2q = c.view(batch, num_context, -1)[:, 0, :] @ q.T if self.mutual_information else None
        q2c = q @ c.T if self.score_divisor is None else q @ c.T / self.score_divisor
        return q2c, c2q, q, c


def dpr_loss(q2c: torch.Tensor, labels: torch.Tensor, temperature: float, c2q: Optional[torch.Tensor] = None,
             context_labels: Optional[torch.Tensor] = None) -> torch.Tensor:
    """DPRLoss (see the module docstring); float32 cross entropy."""
    loss = F.cross_entropy(q2c.float() / temperature, labels.long())
    if c2q is None:
        return loss
    share = 1 / (1 + q2c.shape[1] // q2c.shape[0])  # the vendor's distribution_factor, 1 / (1 + num_context)
    return (1 - share) * loss + share * F.cross_entropy(c2q.float() / temperature, context_labels.long())


class DPRWrapperModel(nn.Module):
    """:class:`DPRModel` (``.model``) with the vendor's loss and metric: ``forward(batch) -> loss``."""

    def __init__(self, config: DPRConfig) -> None:
        super().__init__()
        self.config = dataclasses.asdict(config)
        self.softmax_temperature = config.softmax_temperature
        self.mutual_information = config.mutual_information
        self.model = DPRModel(*config.encoders(), config.pooler_type, config.mutual_information,
                              config.scale_similarity)
        self.accuracy_metric = AccuracyMetric(name="eval/accuracy") if config.compute_eval_metrics else None

    def forward(self, batch: dict) -> torch.Tensor:
        inputs = {k: v for k, v in batch.items() if k not in ("labels", "context_labels")}
        q2c, c2q, _, _ = self.model(**inputs)
        loss = dpr_loss(q2c, batch["labels"], self.softmax_temperature, c2q, batch.get("context_labels"))
        if not self.training and self.accuracy_metric is not None:
            self.accuracy_metric(labels=batch["labels"].clone(), predictions=q2c.argmax(-1).int())
        return loss


def build(config: DPRConfig) -> DPRWrapperModel:
    """Builder of ``model.name: dpr`` (ModelSpec.builder): the model of one config object."""
    return DPRWrapperModel(config)


def build_model(**keys: Any) -> DPRWrapperModel:
    """Model function of ``model.name: dpr``: the keys are :class:`DPRConfig`'s fields."""
    return build(DPRConfig(**keys))


build_model.__signature__ = config_signature(DPRConfig)
