"""BERT pretraining (model.name ``bert``): the Model Zoo's BertForPreTrainingModel of Release 2.10
(``models/nlp/bert/model.py``, ``bert_pretrain_models.py``, ``bert_model.py``) with its loss
(``losses/BertPretrainModelLoss.py``) and eval metrics.

:class:`BertConfig` is the ``model:`` section: its fields are the keys of BertModelConfig plus
BertForPreTrainingModelConfig, with their defaults; :meth:`BertConfig.resolved` applies the vendor's
``post_init`` (the pretraining config's overrides: ``nonlinearity`` is ``encoder_nonlinearity``, embedding
dropout is ``dropout_rate``, the pooler exists only with NSP, two segments with NSP). Module names are the
vendor's (``model.bert_encoder.embedding_layer.word_embeddings.weight``, ``model.bert_mlm_head.classifier.
ffn.0.linear_layer.weight``, ...), so its checkpoints load key for key.

Loss: MLM cross entropy per predicted position times ``masked_lm_mask`` (times the batch's
``mlm_loss_scale`` when the data gives one), summed, divided by the batch size, times ``mlm_loss_weight``
(only without ``mlm_loss_scale``); plus NSP's mean cross entropy unless ``disable_nsp``. Labels shorter
than the sequence are gathered at ``masked_lm_positions``; labels as long as it are scored at every position.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from cs_run.metrics import AccuracyMetric, PerplexityMetric
from cs_run.models.common.activations import ACTIVATIONS
from cs_run.models.common.attention import MultiheadAttention
from cs_run.models.common.config import config_signature
from cs_run.models.common.config import key as config_key
from cs_run.models.common.embeddings import FixedPositionEmbeddingLayer, LearnedPositionEmbeddingLayer
from cs_run.models.common.encoder import TransformerEncoder, TransformerEncoderLayer, key_padding_mask
from cs_run.models.common.ffn import Dense, FeedForwardNetwork, Pooler
from cs_run.models.common.initializers import initializer_spec, make_initializer, scale_spec, truncated_normal
from cs_run.models.common.masks import encoder_vsl_mask
from cs_run.models.common.norms import reset_norm
from cs_run.models.common.rotary import RotaryEmbedding

logger = logging.getLogger(__name__)

__all__ = ["BertConfig", "BertModel", "BertPretrainModel", "BertForPreTrainingModel", "build_model",
           "DEFAULT_LR_ADJUSTMENT_GROUPS", "log_hardware_keys"]

Initializer = Optional[Union[str, dict]]
Activation = Literal[tuple(ACTIVATIONS)]

# bert_model.py BertModelConfig.lr_adjustment_groups
DEFAULT_LR_ADJUSTMENT_GROUPS = {
    "embedding": "*embedding*weight",
    "encoder_attention": "*transformer_encoder*attn*dense*weight",
    "encoder_input_ffn": "*transformer_encoder*ffn.ffn.[!1]*weight",
    "encoder_output_ffn": "*transformer_encoder*ffn.ffn.[1]*weight",
    "pooler": "*pooler*weight",
}
# Keys that steer Cerebras hardware only: accepted, same math here.
_HARDWARE_KEYS = ("attention_kernel", "fold_rope_consts", "dtype", "enable_vts", "precision_opt_level")


@dataclass
class BertConfig:
    """The ``model:`` keys of the Model Zoo's ``bert`` (Release 2.10), each with its default."""

    # embeddings
    vocab_size: int = 50257
    max_position_embeddings: Optional[int] = None
    position_embedding_type: Optional[Literal["learned", "fixed", "relative", "rotary", "alibi"]] = "learned"
    hidden_size: int = 768
    embedding_dropout_rate: float = 0.1
    """Overridden by ``dropout_rate`` (the pretraining config's post_init)."""
    embedding_pad_token_id: Optional[int] = 0
    """Overridden by ``pad_token_id``."""
    mask_padding_in_positional_embed: bool = False
    """Padding tokens take position row 0 and the others 1..L (RoBERTa's positions; learned only)."""
    rotary_dim: Optional[int] = None
    rope_theta: float = 10000.0
    fold_rope_consts: bool = False
    num_relative_attention_buckets: int = 32
    alibi_trainable_slopes: bool = False
    pos_scaling_factor: float = 1.0
    pos_scaling_type: str = "linear"
    pos_scaling_extra_args: Optional[dict] = None
    # encoder
    num_hidden_layers: int = 12
    layer_norm_epsilon: float = 1e-5
    norm_first: bool = False
    embedding_layer_norm: bool = True
    num_heads: int = 12
    attention_module: Literal["aiayn_attention", "multiquery_attention"] = "aiayn_attention"
    extra_attention_params: dict = field(default_factory=dict)
    attention_type: Literal["dot_product", "scaled_dot_product"] = "scaled_dot_product"
    attention_softmax_fp32: bool = True
    attention_kernel: Optional[str] = None
    dropout_rate: float = 0.1
    nonlinearity: Activation = "gelu"
    """Overridden by ``encoder_nonlinearity``."""
    pooler_nonlinearity: Optional[str] = None
    attention_dropout_rate: Optional[float] = None
    use_projection_bias_in_attention: bool = True
    use_ffn_bias_in_attention: bool = True
    filter_size: int = 3072
    use_ffn_bias: bool = True
    use_final_layer_norm: bool = False
    # initializers
    initializer_range: float = 0.02
    default_initializer: Initializer = None
    embeddings_initializer: Initializer = None
    position_embeddings_initializer: Initializer = None
    segment_embeddings_initializer: Initializer = None
    num_segments: Optional[int] = None
    add_pooling_layer: bool = True
    """Overridden: the pooler exists only with NSP."""
    freeze_ffn_bias_in_glu: bool = False
    # muP
    lr_adjustment_groups: dict = field(default_factory=lambda: dict(DEFAULT_LR_ADJUSTMENT_GROUPS))
    mup_base_hidden_size: Optional[float] = None
    mup_base_filter_size: Optional[float] = None
    embeddings_scale: float = 1.0
    scale_qk_dot_by_d: Optional[bool] = None
    attention_logits_alpha: float = 1.0
    output_logits_alpha: float = 1.0
    scale_output_logits_by_d: bool = True
    dtype: Optional[str] = None
    enable_vts: bool = config_key(False, "1.6.0", "set by Releases 1.6-1.7's files: strip the padding on Cerebras "
                                  "hardware (cbtorch StripPadding); the padding is masked either way, same loss here")
    precision_opt_level: Optional[int] = config_key(None, "1.8.0", "Release 1.8's weight-streaming files: the Cerebras "
                                             "compiler's precision level (read from model); no effect here")
    # pretraining (BertForPreTrainingModelConfig)
    share_embedding_weights: bool = True
    pad_token_id: int = 0
    encoder_nonlinearity: Activation = "gelu"
    mlm_nonlinearity: Optional[Activation] = None
    use_ffn_bias_in_mlm: bool = True
    use_output_bias_in_mlm: bool = True
    mlm_loss_weight: float = 1.0
    label_smoothing: float = 0.0
    disable_nsp: bool = False
    num_classes: int = 2
    compute_eval_metrics: bool = True

    POSITION_TYPES = (None, "learned", "fixed")
    """The position_embedding_type values this family builds (esm2 adds rotary)."""
    FAMILY = "BERT"

    def resolved(self) -> "BertConfig":
        """A copy with the vendor's post_init applied and every value checked. Raises ValueError naming the key."""
        c = dataclasses.replace(self, extra_attention_params=dict(self.extra_attention_params or {}),
                                lr_adjustment_groups=dict(self.lr_adjustment_groups or {}))
        if c.num_segments is None:
            c.num_segments = None if c.disable_nsp else 2
        c.nonlinearity = c.encoder_nonlinearity
        c.embedding_dropout_rate = c.dropout_rate
        c.embedding_pad_token_id = c.pad_token_id
        c.add_pooling_layer = not c.disable_nsp
        c.mlm_nonlinearity = c.mlm_nonlinearity or c.nonlinearity
        # no pooler without NSP: its activation is then no part of the model
        c.pooler_nonlinearity = (c.pooler_nonlinearity or c.nonlinearity) if c.add_pooling_layer else None
        if c.position_embedding_type is not None and c.max_position_embeddings is None:
            raise ValueError("max_position_embeddings: must be given with position_embedding_type "
                             f"{c.position_embedding_type!r}")
        _refuse("position_embedding_type", c.position_embedding_type, c.position_embedding_type in
                self.POSITION_TYPES, f"{self.FAMILY} here takes {', '.join(map(str, self.POSITION_TYPES))}")
        _refuse("attention_module", c.attention_module, c.attention_module == "aiayn_attention",
                "BERT here takes aiayn_attention")
        c.extra_attention_params.pop("attention_kernel", None)
        _refuse("extra_attention_params", c.extra_attention_params, not c.extra_attention_params,
                "it configures multiquery_attention only")
        _refuse("freeze_ffn_bias_in_glu", c.freeze_ffn_bias_in_glu, not c.freeze_ffn_bias_in_glu,
                "GLU encoder activations are not implemented for BERT")
        _refuse("mask_padding_in_positional_embed", c.mask_padding_in_positional_embed,
                not c.mask_padding_in_positional_embed or c.position_embedding_type == "learned",
                "it applies to learned position embeddings only")
        for key in ("vocab_size", "hidden_size", "num_heads", "filter_size", "num_classes"):
            if getattr(c, key) < 1:
                raise ValueError(f"{key}: must be >= 1, got {getattr(c, key)}")
        if c.vocab_size > 512000:
            raise ValueError(f"vocab_size: must be <= 512000 (the Model Zoo's limit), got {c.vocab_size}")
        if c.hidden_size % c.num_heads:
            raise ValueError(f"hidden_size: {c.hidden_size} is not divisible by num_heads ({c.num_heads})")
        for key in ("dropout_rate", "attention_dropout_rate", "label_smoothing"):
            value = getattr(c, key)
            if value is not None and not 0.0 <= value < 1.0:
                raise ValueError(f"{key}: must be in [0, 1), got {value}")
        if c.layer_norm_epsilon <= 0 or c.initializer_range <= 0:
            raise ValueError("layer_norm_epsilon / initializer_range: must be > 0")
        if not c.disable_nsp and c.num_classes != 2:
            raise ValueError(f"num_classes: the NSP loss reads 2 classes (BertPretrainModelLoss), got {c.num_classes}")
        mup = [k for k in ("mup_base_hidden_size", "mup_base_filter_size") if getattr(c, k)]
        if len(mup) == 1:
            raise ValueError(f"{mup[0]}: muP needs both mup_base_hidden_size and mup_base_filter_size")
        if c.scale_qk_dot_by_d is None:
            c.scale_qk_dot_by_d = bool(mup)
        for key in ("default_initializer", "embeddings_initializer", "position_embeddings_initializer",
                    "segment_embeddings_initializer"):
            if getattr(c, key) is not None:
                setattr(c, key, initializer_spec(getattr(c, key), key))
        c.default_initializer = c.default_initializer or truncated_normal(c.initializer_range)
        for key in ("embeddings_initializer", "position_embeddings_initializer", "segment_embeddings_initializer"):
            if getattr(c, key) is None:
                setattr(c, key, dict(c.default_initializer))
        return c


def _refuse(key: str, value: Any, ok: bool, why: str) -> None:
    if not ok:
        raise ValueError(f"{key}: {value!r} is not supported by cs-run ({why})")


class BertEmbeddingLayer(nn.Module):
    """Word (``padding_idx`` = pad id: its row gets no gradient), position and segment embeddings, summed."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.pad_token_id = c.embedding_pad_token_id
        self.mask_padding = c.mask_padding_in_positional_embed
        self.offset = c.embedding_pad_token_id if self.mask_padding else 0
        self.max_position_embeddings = c.max_position_embeddings
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=self.pad_token_id)
        self.position_embeddings: Optional[nn.Module] = None
        if c.position_embedding_type == "learned":
            self.position_embeddings = LearnedPositionEmbeddingLayer(
                c.max_position_embeddings + int(self.mask_padding), c.hidden_size, self.offset)
        elif c.position_embedding_type == "fixed":
            self.position_embeddings = FixedPositionEmbeddingLayer(c.max_position_embeddings, c.hidden_size)
        self.segment_embeddings = nn.Embedding(c.num_segments, c.hidden_size) if c.num_segments else None
        self.rotary = RotaryEmbedding(c.rotary_dim, c.max_position_embeddings, c.rope_theta, c.pos_scaling_type,
                                      c.pos_scaling_factor, c.pos_scaling_extra_args) \
            if c.position_embedding_type == "rotary" else None
        with torch.no_grad():
            make_initializer(c.embeddings_initializer)(self.word_embeddings.weight)
            if isinstance(self.position_embeddings, LearnedPositionEmbeddingLayer):
                make_initializer(c.position_embeddings_initializer)(self.position_embeddings.embed.weight)
            if self.segment_embeddings is not None:
                make_initializer(c.segment_embeddings_initializer)(self.segment_embeddings.weight)
            if self.pad_token_id:  # the vendor zeroes the pad row only for a non-zero pad id
                self.word_embeddings.weight[self.pad_token_id].zero_()

    def forward(self, input_ids: torch.Tensor, segment_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.add_positions_and_segments(self.word_embeddings(input_ids), input_ids, segment_ids)

    def add_positions_and_segments(self, x: torch.Tensor, input_ids: torch.Tensor,
                                   segment_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x`` (the token embeddings) plus the position table's rows and the segment embeddings."""
        length = input_ids.shape[1]
        if isinstance(self.position_embeddings, LearnedPositionEmbeddingLayer):
            table = self.position_embeddings.embed
            if self.mask_padding:  # positions 1..L, 0 for padding (assumed at the end, as the vendor does)
                positions = torch.arange(1, length + 1, device=input_ids.device)
                x = x + table(torch.where(input_ids.ne(self.pad_token_id), positions, 0) + self.offset)
            else:
                x = x + table.weight[:length][None]
        elif self.position_embeddings is not None:
            x = x + self.position_embeddings(length).to(x.dtype)
        if segment_ids is not None and self.segment_embeddings is not None:
            x = x + self.segment_embeddings(segment_ids.int())
        return x


class BertModel(nn.Module):
    """The encoder (bert_model.py BertModel): embeddings times ``embeddings_scale``, embedding norm, dropout, the
    encoder layers, and the pooler (the first token through a dense layer) when NSP is on.
    ``forward`` returns (hidden states, pooled output or None)."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        attn_init = ffn_init = out_init = ffn_out_init = c.default_initializer
        if c.mup_base_hidden_size:
            width = c.hidden_size / c.mup_base_hidden_size
            depth = (2 * c.num_hidden_layers) ** -0.5
            attn_init = ffn_init = scale_spec(c.default_initializer, width ** -0.5)
            out_init = scale_spec(c.default_initializer, width ** -0.5, depth)
        if c.mup_base_filter_size:
            ffn_out_init = scale_spec(c.default_initializer, (c.filter_size / c.mup_base_filter_size) ** -0.5,
                                      (2 * c.num_hidden_layers) ** -0.5)
        self.embeddings_scale = c.embeddings_scale
        self.embedding_layer = BertEmbeddingLayer(c)
        self.dropout_embd = nn.Dropout(c.embedding_dropout_rate)
        attention_dropout = c.dropout_rate if c.attention_dropout_rate is None else c.attention_dropout_rate
        layers = [TransformerEncoderLayer(
            c.hidden_size,
            MultiheadAttention(c.hidden_size, c.num_heads, dropout=attention_dropout,
                               use_projection_bias=c.use_projection_bias_in_attention,
                               use_ffn_bias=c.use_ffn_bias_in_attention, attention_type=c.attention_type,
                               scale_qk_dot_by_d=c.scale_qk_dot_by_d, attention_logits_alpha=c.attention_logits_alpha,
                               softmax_fp32=c.attention_softmax_fp32, initializer=attn_init,
                               output_initializer=out_init),
            FeedForwardNetwork(c.hidden_size, c.filter_size, c.nonlinearity, c.dropout_rate, c.use_ffn_bias, ffn_init,
                               ffn_out_init),
            c.dropout_rate, c.layer_norm_epsilon, c.norm_first) for _ in range(c.num_hidden_layers)]
        self.embed_ln_f = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_epsilon) if c.embedding_layer_norm else None
        final = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_epsilon) if c.use_final_layer_norm else None
        self.transformer_encoder = TransformerEncoder(layers, final)
        self.pooler = Pooler(c.hidden_size, c.pooler_nonlinearity, c.use_ffn_bias, attn_init) \
            if c.add_pooling_layer else None
        if self.embed_ln_f is not None:
            reset_norm(self.embed_ln_f)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                segment_ids: Optional[torch.Tensor] = None, attention_span: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``attention_span`` and ``position_ids`` (``use_vsl`` shards): each packed sequence attends to itself
        only (:func:`encoder_vsl_mask`, which replaces the padding mask, as the vendor's); positions are not
        restarted (the vendor's encoder passes none to its embeddings or RoPE)."""
        length = input_ids.shape[1]
        if self.embedding_layer.max_position_embeddings and length > self.embedding_layer.max_position_embeddings:
            raise ValueError(f"the batch's sequence length {length} exceeds model.max_position_embeddings "
                             f"({self.embedding_layer.max_position_embeddings}); raise it or shorten the input's "
                             "max_sequence_length")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        x = self.compute_input_embeddings(input_ids, attention_mask, segment_ids)
        if self.embeddings_scale != 1.0:
            x = x * self.embeddings_scale
        if self.embed_ln_f is not None:
            x = self.embed_ln_f(x)
        x = self.dropout_embd(x)
        if attention_span is not None:
            mask = encoder_vsl_mask(attention_span, position_ids, x.dtype)
        else:
            mask = key_padding_mask(attention_mask, x.dtype)
        x = self.transformer_encoder(x, mask, self.embedding_layer.rotary)
        return x, (self.pooler(x) if self.pooler is not None else None)

    def compute_input_embeddings(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                 segment_ids: Optional[torch.Tensor]) -> torch.Tensor:
        """The embedding layer's sum (the vendor's name: ESM-2 overrides it with token dropout)."""
        return self.embedding_layer(input_ids, segment_ids)


class BertClassifierHead(nn.Module):
    def __init__(self, hidden_size: int, num_classes: int, bias: bool, initializer: dict) -> None:
        super().__init__()
        self.classifier = Dense(hidden_size, num_classes, bias, initializer)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(pooled)


class BertMLMHeadTransform(nn.Module):
    def __init__(self, hidden_size: int, bias: bool, activation: str, eps: float, initializer: dict) -> None:
        super().__init__()
        self.ffn = Dense(hidden_size, hidden_size, bias, initializer, activation)
        self.ln = nn.LayerNorm(hidden_size, eps=eps)
        reset_norm(self.ln)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.ffn(x))


class BertMLMHead(nn.Module):
    def __init__(self, c: BertConfig, initializer: dict) -> None:
        super().__init__()
        self.mlm_transform = BertMLMHeadTransform(c.hidden_size, c.use_ffn_bias_in_mlm, c.mlm_nonlinearity,
                                                  c.layer_norm_epsilon, initializer)
        self.classifier = Dense(c.hidden_size, c.vocab_size, c.use_output_bias_in_mlm, initializer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.mlm_transform(x))


class BertPretrainModel(nn.Module):
    """The encoder with the MLM head (tied to the word embeddings by ``share_embedding_weights``) and the NSP
    head (``bert_cls_head``, unless ``disable_nsp``); muP scales both heads' logits. ``forward`` returns
    (mlm logits, nsp logits or None)."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.disable_nsp = c.disable_nsp
        self.share_embedding_weights = c.share_embedding_weights
        self.bert_encoder = self.build_encoder_model(c)
        self.output_logits_scale = None
        if c.mup_base_hidden_size:
            width = c.hidden_size / c.mup_base_hidden_size
            self.output_logits_scale = c.output_logits_alpha / (width if c.scale_output_logits_by_d else width ** 0.5)
        head_init = truncated_normal(c.initializer_range)
        self.bert_cls_head = None if c.disable_nsp else BertClassifierHead(c.hidden_size, c.num_classes,
                                                                            c.use_ffn_bias, head_init)
        self.bert_mlm_head = BertMLMHead(c, head_init)
        self.tie_weights()

    def build_encoder_model(self, c: BertConfig) -> BertModel:
        """The encoder (the vendor's hook: ESM-2's is :class:`cs_run.models.esm2.model.Esm2Model`)."""
        return BertModel(c)

    def tie_weights(self) -> None:
        if self.share_embedding_weights:
            self.bert_mlm_head.classifier.ffn[0].linear_layer.weight = \
                self.bert_encoder.embedding_layer.word_embeddings.weight

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, masked_lm_positions: Optional[torch.Tensor] = None,
                attention_span: Optional[torch.Tensor] = None, position_ids: Optional[torch.Tensor] = None
                ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        hidden, pooled = self.bert_encoder(input_ids, attention_mask, token_type_ids, attention_span, position_ids)
        if masked_lm_positions is not None:  # the predicted positions only
            index = masked_lm_positions.long()[..., None].expand(-1, -1, hidden.shape[-1])
            hidden = torch.gather(hidden, 1, index)
        mlm_logits = self.bert_mlm_head(hidden)
        nsp_logits = self.bert_cls_head(pooled) if self.bert_cls_head is not None else None
        if self.output_logits_scale:
            mlm_logits = mlm_logits * self.output_logits_scale
            nsp_logits = nsp_logits * self.output_logits_scale if nsp_logits is not None else None
        return mlm_logits, nsp_logits


class BertForPreTrainingModel(nn.Module):
    """:class:`BertPretrainModel` (``.model``) with the vendor's loss and metrics: ``forward(batch) -> loss``.
    In eval mode it updates ``eval/accuracy_cls`` (with NSP), ``eval/accuracy_masked_lm`` and
    ``eval/mlm_perplexity``."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        c = config.resolved()
        self.spec = c
        self.config = dataclasses.asdict(c)  # the resolved keys, as the decoders' ``config`` (HF adapters read it)
        self.vocab_size = c.vocab_size
        self.disable_nsp = c.disable_nsp
        self.mlm_loss_weight = c.mlm_loss_weight
        self.label_smoothing = c.label_smoothing
        self.model = self.build_model(c)
        self.lr_adjustment_groups = _lr_groups(c)
        self.accuracy_metric_cls = self.accuracy_metric_mlm = self.perplexity_metric = None
        if c.compute_eval_metrics:
            if not c.disable_nsp:
                self.accuracy_metric_cls = AccuracyMetric("eval/accuracy_cls")
            self.accuracy_metric_mlm = AccuracyMetric("eval/accuracy_masked_lm")
            self.perplexity_metric = PerplexityMetric("eval/mlm_perplexity")

    def build_model(self, c: BertConfig) -> BertPretrainModel:
        """The encoder and heads (the vendor's hook, as :meth:`BertPretrainModel.build_encoder_model`)."""
        return BertPretrainModel(c)

    def forward(self, batch: dict) -> torch.Tensor:
        labels = batch["labels"]
        input_ids = batch["input_ids"]
        gather = labels.shape[1] != input_ids.shape[1]
        mlm_logits, nsp_logits = self.model(input_ids, batch.get("attention_mask"), batch.get("token_type_ids"),
                                            batch["masked_lm_positions"] if gather else None,
                                            batch.get("attention_span"), batch.get("position_ids"))
        mask = batch["masked_lm_mask"] if gather else torch.ones_like(labels)
        mask = mask.to(mlm_logits.dtype)
        scale = batch.get("mlm_loss_scale")
        weights = mask if scale is None else mask * scale.to(mlm_logits.dtype)
        token_loss = F.cross_entropy(mlm_logits.float().reshape(-1, self.vocab_size), labels.reshape(-1).long(),
                                     reduction="none")
        if self.label_smoothing > 0.0 and self.training:
            smooth = -F.log_softmax(mlm_logits.float().reshape(-1, self.vocab_size), dim=-1).mean(-1)
            token_loss = (1.0 - self.label_smoothing) * token_loss + self.label_smoothing * smooth
        loss = torch.sum(token_loss * weights.reshape(-1)) / labels.shape[0]
        if scale is None:
            loss = loss * self.mlm_loss_weight
        if not self.disable_nsp:
            loss = loss + F.cross_entropy(nsp_logits.float().reshape(-1, 2),
                                          batch["next_sentence_label"].reshape(-1).long())
        if not self.training and self.accuracy_metric_mlm is not None:
            if self.accuracy_metric_cls is not None:
                self.accuracy_metric_cls(labels=batch["next_sentence_label"].clone(),
                                         predictions=nsp_logits.argmax(-1).int())
            xent = torch.sum(F.cross_entropy(mlm_logits.detach().float().reshape(-1, self.vocab_size),
                                             labels.reshape(-1).long(), reduction="none") * mask.reshape(-1))
            self.accuracy_metric_mlm(labels=labels.clone(), predictions=mlm_logits.argmax(-1).int(), weights=mask)
            self.perplexity_metric(labels=labels.clone(), loss=xent, weights=mask)
        return loss


def _lr_groups(c: BertConfig) -> dict:
    """muP's learning-rate groups (bert_model.py): 1/width for attention, input FFN and pooler kernels, 1/filter
    multiplier for output FFN kernels."""
    groups = {name: {"param_filter_patterns": [p] if isinstance(p, str) else list(p), "scale": 1.0}
              for name, p in c.lr_adjustment_groups.items()}
    if c.mup_base_hidden_size:
        for name in ("encoder_attention", "encoder_input_ffn", "pooler"):
            if name in groups:
                groups[name]["scale"] = c.mup_base_hidden_size / c.hidden_size
    if c.mup_base_filter_size and "encoder_output_ffn" in groups:
        groups["encoder_output_ffn"]["scale"] = c.mup_base_filter_size / c.filter_size
    return groups


def build(config: BertConfig) -> BertForPreTrainingModel:
    """The family's builder (:attr:`cs_run.registry.ModelSpec.builder`): the model of one config."""
    log_hardware_keys(config)
    return BertForPreTrainingModel(config)


def log_hardware_keys(config: BertConfig) -> None:
    """One info line per key that steers Cerebras hardware only (accepted: the math here is the same)."""
    for key in _HARDWARE_KEYS:
        if getattr(config, key, None) not in (None, False):
            logger.info("model.%s: a Cerebras hardware option; same math here", key)


def build_model(**keys: Any) -> BertForPreTrainingModel:
    """Model function of ``model.name: bert``: the keys are :class:`BertConfig`'s fields."""
    return build(BertConfig(**keys))


build_model.__signature__ = config_signature(BertConfig)
