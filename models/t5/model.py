"""t5 (``model.name: t5``): the Model Zoo's T5ForConditionalGenerationModel of Release 2.10
(``models/nlp/t5/model.py``, ``t5_model.py``) with its loss (``losses/T5ForConditionalGenerationLoss.py``)
and eval metrics.

The encoder's layers: pre-norm ``x + dropout(attn(norm1(x)))``, ``x + ffn(norm2(x))``; the decoder adds
cross-attention over the encoder's output between them (``multihead_attn``, ``norm2``; its FFN's norm is
``norm3``). Attention is unscaled (T5's ``dot_product``) unless ``use_transformer_initialization``; the
encoder's and decoder's relative position bias (bidirectional / causal buckets, max distance 128) is added to
every self-attention layer's logits, none to cross-attention. With a tied head the decoder output is scaled
by ``d_model ** -0.5``. Module names are the vendor's (``model.encoder.layers.0.self_attn.proj_q_dense_layer``,
``model.decoder.layers.0.multihead_attn``, ``model.encoder_embeddings.position_embed_helper.
relative_attention_bias``), so its checkpoints load key for key.

muP (``mup_base_d_model`` and ``mup_base_d_ff``, t5_model.py's rules; width multiplier ``m = d_model /
mup_base_d_model``): attention scaled by ``1/d_kv`` (``scale_*_qk_dot_by_d``, default on) times its
``*_attention_logits_alpha``; embeddings times ``embeddings_alpha * d_model ** 0.5`` with their std times
``d_model ** -0.5``; logits times ``output_logits_alpha / m ** 0.5`` (``/ m`` with ``scale_output_logits_by_d``)
instead of the tied head's ``d_model ** -0.5``; q, k, v projections times ``m ** -0.5`` and the attention output
times ``m ** 0.5`` (without ``mup_base_d_kv``), the attention-output and FFN-output stds times ``2 * layers`` (the
vendor's ``depth_scale=2 * num_hidden_layers``, not its inverse root as gpt2's) and the learning-rate groups of
:func:`t5_lr_adjustment_groups`.

Loss: per-token cross entropy times ``decoder_attention_mask`` (times the batch's ``loss_weight`` under
``precomputed_num_masked``), summed, then / unmasked tokens (``num_masked``), / batch size
(``precomputed_num_masked``) or / batch size * ``lm_loss_weight`` (``batch_size``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from cs_run.metrics import AccuracyMetric, PerplexityMetric
from cs_run.models.common.config import config_signature
from cs_run.models.common.embeddings import FixedPositionEmbeddingLayer
from cs_run.models.common.encoder import key_padding_mask
from cs_run.models.common.ffn import FeedForwardNetwork
from cs_run.models.common.initializers import make_initializer, scale_spec
from cs_run.models.common.norms import get_norm, reset_norm
from cs_run.models.t5.config import T5Config

logger = logging.getLogger(__name__)

__all__ = ["T5ForConditionalGeneration", "T5ForConditionalGenerationModel", "relative_position_bucket", "build",
           "build_model", "t5_lr_adjustment_groups"]


def relative_position_bucket(relative: torch.Tensor, bidirectional: bool, num_buckets: int,
                             max_distance: int = 128) -> torch.Tensor:
    """Bucket of each ``key - query`` distance (RelativePositionEmbeddingLayer.relative_position_bucket): exact
    below half the buckets, logarithmic up to ``max_distance``; bidirectional gives positive distances their
    own half, causal folds them to 0."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).long() * num_buckets
        relative = relative.abs()
    else:
        relative = -torch.clamp(relative, max=0)
    max_exact = num_buckets // 2
    large = max_exact + (torch.log(relative.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(relative < max_exact, relative, large)


class RelativePositionEmbeddingLayer(nn.Module):
    """A learned bias per (bucket, head); ``forward(q, k)`` is its [heads, q, k] table."""

    def __init__(self, num_heads: int, num_buckets: int, bidirectional: bool) -> None:
        super().__init__()
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)
        self.num_buckets = num_buckets
        self.bidirectional = bidirectional
        with torch.no_grad():
            nn.init.xavier_uniform_(self.relative_attention_bias.weight)  # the vendor's default initializer

    def forward(self, query_length: int, key_length: int) -> torch.Tensor:
        device = self.relative_attention_bias.weight.device
        relative = torch.arange(key_length, device=device)[None, :] - torch.arange(query_length, device=device)[:, None]
        buckets = relative_position_bucket(relative, self.bidirectional, self.num_buckets)
        return self.relative_attention_bias(buckets).permute(2, 0, 1)


class T5EmbeddingLayer(nn.Module):
    """Token embeddings plus the position scheme: a relative bias helper or a fixed sin-cos table."""

    def __init__(self, vocab_size: int, c: T5Config, max_positions: Optional[int], bidirectional: bool,
                 initializer: dict) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, c.d_model)
        with torch.no_grad():
            make_initializer(initializer)(self.word_embeddings.weight)
        self.position_embeddings = (FixedPositionEmbeddingLayer(max_positions, c.d_model)
                                    if c.position_embedding_type == "fixed" else None)
        self.position_embed_helper = (RelativePositionEmbeddingLayer(c.num_heads, c.relative_attention_num_buckets,
                                                                     bidirectional)
                                      if c.position_embedding_type == "relative" else None)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(input_ids.shape[1]).to(x.dtype)
        return x

    def compute_position_bias(self, query_length: int, key_length: int) -> Optional[torch.Tensor]:
        return None if self.position_embed_helper is None else self.position_embed_helper(query_length, key_length)


class Attention(nn.Module):
    """The Model Zoo's MultiheadAttention with separate key/value input (self- or cross-attention): q from
    ``x``, k and v from ``memory``; inner width ``num_heads * d_kv``, no output bias."""

    def __init__(self, c: T5Config, logits_alpha: float, scale_by_d: bool, inits: dict) -> None:
        super().__init__()
        inner = c.num_heads * c.d_kv
        self.qkv_scale, self.output_scale = _projection_scales(c)
        self.num_heads, self.head_dim = c.num_heads, c.d_kv
        bias = c.use_projection_bias_in_attention
        self.proj_q_dense_layer = nn.Linear(c.d_model, inner, bias=bias)
        self.proj_k_dense_layer = nn.Linear(c.d_model, inner, bias=bias)
        self.proj_v_dense_layer = nn.Linear(c.d_model, inner, bias=bias)
        self.proj_output_dense_layer = nn.Linear(inner, c.d_model, bias=False)
        self.scale = logits_alpha
        if c.use_transformer_initialization or c.is_mup:  # the vendor's scaled_dot_product cases
            self.scale /= self.head_dim if scale_by_d else math.sqrt(self.head_dim)
        self.dropout = c.dropout_rate
        self.softmax_fp32 = c.attention_softmax_fp32
        with torch.no_grad():
            for layer, init in ((self.proj_q_dense_layer, inits["q"]), (self.proj_k_dense_layer, inits["kv"]),
                                (self.proj_v_dense_layer, inits["kv"]), (self.proj_output_dense_layer, inits["out"])):
                make_initializer(init)(layer.weight)
                if layer.bias is not None:
                    layer.bias.zero_()

    def forward(self, x: torch.Tensor, memory: torch.Tensor, mask: Optional[torch.Tensor],
                position_bias: Optional[torch.Tensor]) -> torch.Tensor:
        b, s, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            if self.qkv_scale != 1.0:  # muP's q/k/v_projection_scale
                t = t * self.qkv_scale
            return t.view(b, -1, self.num_heads, self.head_dim).transpose(1, 2)
        q, k, v = heads(self.proj_q_dense_layer(x)), heads(self.proj_k_dense_layer(memory)), \
            heads(self.proj_v_dense_layer(memory))
        logits = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        if mask is not None:
            logits = logits + mask.to(logits.dtype)
        if position_bias is not None:
            logits = logits + position_bias.to(logits.dtype)
        dtype = torch.float32 if self.softmax_fp32 else logits.dtype
        scores = torch.softmax(logits.to(dtype), dim=-1).to(q.dtype)
        out = torch.matmul(F.dropout(scores, self.dropout, self.training), v)
        out = self.proj_output_dense_layer(out.transpose(1, 2).reshape(b, s, -1))
        return out * self.output_scale if self.output_scale != 1.0 else out


class T5Layer(nn.Module):
    """One encoder layer, or (``cross``) one decoder layer: self-attention, [cross-attention,] FFN."""

    def __init__(self, c: T5Config, cross: bool, inits: dict, logits_alpha: float, scale_by_d: bool) -> None:
        super().__init__()
        norm = get_norm(c.norm_type)
        self.norm_first = c.use_pre_encoder_decoder_layer_norm
        self.self_attn = Attention(c, logits_alpha, scale_by_d, inits)
        self.multihead_attn = Attention(c, logits_alpha, scale_by_d, inits) if cross else None
        # the decoder's FFN inner dropout is dropout_rate (the vendor passes relu_dropout_rate to the encoder only)
        self.ffn = FeedForwardNetwork(c.d_model, c.d_ff, c.encoder_nonlinearity, c.dropout_rate, self._ffn_bias(c),
                                      inits["ffn"], inits["ffn_out"])
        self.ffn.ffn[0].dropout_layer = nn.Dropout(c.dropout_rate if cross else c.relu_dropout_rate)
        self.norm1 = norm(c.d_model, eps=c.layer_norm_epsilon)
        self.norm2 = norm(c.d_model, eps=c.layer_norm_epsilon)
        self.norm3 = norm(c.d_model, eps=c.layer_norm_epsilon) if cross else None
        for n in (self.norm1, self.norm2, self.norm3):
            if n is not None:
                reset_norm(n)
        self.dropout1 = nn.Dropout(c.dropout_rate)
        self.dropout2 = nn.Dropout(c.dropout_rate) if cross else None

    @staticmethod
    def _ffn_bias(c: T5Config) -> bool:
        return c.use_ffn_bias and c.encoder_nonlinearity != "gelu" and c.decoder_nonlinearity != "gelu"

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor], position_bias: Optional[torch.Tensor],
                memory: Optional[torch.Tensor] = None, memory_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        blocks = [(self.norm1, lambda h: self.dropout1(self.self_attn(h, h, mask, position_bias)))]
        if self.multihead_attn is not None:
            blocks.append((self.norm2, lambda h: self.dropout2(self.multihead_attn(h, memory, memory_mask, None))))
        blocks.append((self.norm3 if self.multihead_attn is not None else self.norm2, self.ffn))
        for norm, block in blocks:
            x = x + block(norm(x)) if self.norm_first else norm(x + block(x))
        return x


class T5Stack(nn.Module):
    """The layers and the final norm (``encoder`` / ``decoder``: ``layers.N``, ``norm``)."""

    def __init__(self, c: T5Config, n: int, cross: bool, inits: dict, logits_alpha: float, scale_by_d: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList([T5Layer(c, cross, inits, logits_alpha, scale_by_d) for _ in range(n)])
        self.norm = get_norm(c.norm_type)(c.d_model, eps=c.layer_norm_epsilon)
        reset_norm(self.norm)

    def forward(self, x, mask, position_bias, memory=None, memory_mask=None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mask, position_bias, memory, memory_mask)
        return self.norm(x)


def _width_mult(c: T5Config) -> Optional[float]:
    """muP's ``d_model / mup_base_d_model``, None outside muP (t5_model.py scales nothing without it)."""
    return c.d_model / c.mup_base_d_model if c.mup_base_d_model and not c.use_transformer_initialization else None


def _projection_scales(c: T5Config) -> tuple[float, float]:
    """(q/k/v, output) projection scales: ``m ** -0.5`` and ``m ** 0.5`` under muP without ``mup_base_d_kv``."""
    m = _width_mult(c)
    return (m ** -0.5, m ** 0.5) if m and not c.mup_base_d_kv else (1.0, 1.0)


def _mup_stack_init(c: T5Config, layer: dict, layers: int) -> dict:
    """One stack's initializers under muP: the attention output's std times ``2 * layers`` (and
    ``(d_model / (num_heads * d_kv)) ** 0.5`` with ``mup_base_d_kv``), the FFN output's times ``2 * layers``
    with ``mup_base_d_ff``: t5_model.py's ``scale_initializers_by_dimension(..., depth_scale=2 * layers)``."""
    layer = dict(layer)
    if _width_mult(c):
        width = (c.d_model / (c.num_heads * c.d_kv)) ** 0.5 if c.mup_base_d_kv else 1.0
        layer["out"] = scale_spec(layer["out"], width, 2 * layers)
    if c.mup_base_d_ff and not c.use_transformer_initialization:
        layer["ffn_out"] = scale_spec(layer["ffn_out"], 1.0, 2 * layers)
    return layer


def t5_lr_adjustment_groups(c: T5Config) -> dict[str, dict]:
    """model.py's ``create_default_lr_adjustment_groups`` with t5_model.py's muP scales (1.0 outside muP):
    embedding and lm_head ``1 / m ** 0.5``, input FFNs ``1 / m``, output FFNs ``mup_base_d_ff / d_ff``; q/k/v
    and the attention output ``1 / m ** 0.5``, or with ``mup_base_d_kv`` ``1 / m`` and ``mup_base_d_kv / d_kv``."""
    names = {
        "embedding": ["*embedding*weight"],
        "decoder_qkv_projection": [f"*decoder*attn.proj_{x}*dense*weight" for x in "qkv"],
        "decoder_output_projection": ["*decoder*attn.proj_output*dense*weight"],
        "decoder_input_ffn": ["*decoder*ffn.ffn.[!1]*weight"],
        "decoder_output_ffn": ["*decoder*ffn.ffn.[1]*weight"],
        "encoder_qkv_projection": [f"*encoder*attn.proj_{x}*dense*weight" for x in "qkv"],
        "encoder_output_projection": ["*encoder*attn.proj_output*dense*weight"],
        "encoder_input_ffn": ["*encoder*ffn.ffn.[!1]*weight"],
        "encoder_output_ffn": ["*encoder*ffn.ffn.[1]*weight"],
        "lm_head": ["*lm_head*weight"],
    }
    scales = dict.fromkeys(names, 1.0)
    m = _width_mult(c)
    if m:
        scales.update(embedding=m ** -0.5, lm_head=m ** -0.5, decoder_input_ffn=1 / m, encoder_input_ffn=1 / m)
        for side in ("decoder", "encoder"):
            if c.mup_base_d_kv:
                scales[f"{side}_qkv_projection"] = 1 / m
                scales[f"{side}_output_projection"] = c.mup_base_d_kv / c.d_kv
            else:
                scales[f"{side}_qkv_projection"] = scales[f"{side}_output_projection"] = m ** -0.5
    if c.mup_base_d_ff and not c.use_transformer_initialization:
        scales["decoder_output_ffn"] = scales["encoder_output_ffn"] = c.mup_base_d_ff / c.d_ff
    return {name: {"param_filter_patterns": globs, "scale": scales[name]} for name, globs in names.items()}


def _initializers(c: T5Config) -> tuple[dict, dict, dict]:
    """(embedding, encoder layer, decoder layer) initializers of t5_model.py: T5's normals of
    initializer_factor, or the Transformer's scaled Xavier ones; muP scales them (:func:`_mup_stack_init`)."""
    f = c.initializer_factor
    if c.use_transformer_initialization:
        emb = {"name": "truncated_normal", "mean": 0.0, "std": 1.0, "a": -2.0, "b": 2.0}
        attn = {"name": "variance_scaling", "scale": 1.0 / 9.0, "mode": "fan_avg", "distribution": "uniform"}
        q = {**attn, "scale": 1.0 / (c.d_kv * 9.0)}
        ffn = ffn_out = {"name": "xavier_uniform", "gain": 1.0}
    else:
        emb = {"name": "normal", "mean": 0.0, "std": f}
        q = {"name": "normal", "mean": 0.0, "std": f * (c.d_model * c.d_kv) ** -0.5}
        attn = ffn = {"name": "normal", "mean": 0.0, "std": f * c.d_model ** -0.5}
        ffn_out = {"name": "normal", "mean": 0.0, "std": f * c.d_ff ** -0.5}
    layer = {"q": q, "kv": attn, "out": attn, "ffn": ffn, "ffn_out": ffn_out}
    if _width_mult(c):
        emb = scale_spec(emb, c.d_model ** -0.5)
    return (emb, _mup_stack_init(c, layer, c.encoder_num_hidden_layers),
            _mup_stack_init(c, layer, c.decoder_num_hidden_layers))


def _scale_by_d(given: Optional[bool], c: T5Config) -> bool:
    """scale_*_qk_dot_by_d: None is True in a muP run (model.py's build_model, with its warning), else False."""
    if given is None and c.is_mup:
        logger.warning("Found muP params but no scale_*_qk_dot_by_d was provided, so it will be automatically set to "
                       "'True' as the muP default.")
    return c.is_mup if given is None else bool(given)


class T5ForConditionalGeneration(nn.Module):
    """(input_ids, attention_mask, decoder_input_ids) -> LM logits over the target vocabulary."""

    def __init__(self, c: T5Config) -> None:
        super().__init__()
        src, tgt = c.src_vocab_size + c.extra_ids, c.tgt_vocab_size + c.extra_ids
        emb, enc_init, dec_init = _initializers(c)
        self.d_model = c.d_model
        m = _width_mult(c)
        self.embeddings_scale = c.embeddings_alpha * (c.d_model ** 0.5 if m else 1.0)
        alpha = c.output_logits_alpha or 1.0
        self.output_logits_scale = None if not m else alpha / m if c.scale_output_logits_by_d else alpha / m ** 0.5
        self.share_embedding_weights = c.share_embedding_weights
        self.encoder_embeddings = T5EmbeddingLayer(src, c, c.src_max_position_embeddings, True, emb)
        self.decoder_embeddings = T5EmbeddingLayer(tgt, c, c.tgt_max_position_embeddings, False, emb)
        if c.share_encoder_decoder_embedding:
            self.decoder_embeddings.word_embeddings = self.encoder_embeddings.word_embeddings
        self.pre_encoder_dropout = nn.Dropout(c.dropout_rate) if c.use_pre_encoder_decoder_dropout else None
        self.pre_decoder_dropout = nn.Dropout(c.dropout_rate) if c.use_pre_encoder_decoder_dropout else None
        self.dropout_before_encoder = nn.Dropout(c.dropout_rate)
        self.encoder = T5Stack(c, c.encoder_num_hidden_layers, False, enc_init, c.encoder_attention_logits_alpha,
                               _scale_by_d(c.scale_encoder_qk_dot_by_d, c))
        self.dropout_after_encoder = nn.Dropout(c.dropout_rate) if c.use_dropout_outside_residual_path else None
        self.dropout_before_decoder = nn.Dropout(c.dropout_rate)
        self.decoder = T5Stack(c, c.decoder_num_hidden_layers, True, dec_init, c.decoder_attention_logits_alpha,
                               _scale_by_d(c.scale_decoder_qk_dot_by_d, c))
        self.dropout_after_decoder = nn.Dropout(c.dropout_rate) if c.use_dropout_outside_residual_path else None
        self.lm_head = nn.Linear(c.d_model, tgt, bias=False)
        if c.share_embedding_weights:
            self.lm_head.weight = self.decoder_embeddings.word_embeddings.weight
        else:
            with torch.no_grad():  # muP: std initializer_factor / d_model ** 0.5
                self.lm_head.weight.normal_(0.0, c.initializer_factor / (c.d_model ** 0.5 if c.mup_base_d_model else 1))

    def _embed(self, layer: T5EmbeddingLayer, ids: torch.Tensor, pre: Optional[nn.Module],
               before: nn.Module) -> torch.Tensor:
        x = layer(ids) * torch.tensor(float(self.embeddings_scale), dtype=layer.word_embeddings.weight.dtype)
        if pre is not None:
            x = pre(x)
        return before(x)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor],
                decoder_input_ids: torch.Tensor) -> torch.Tensor:
        src = self._embed(self.encoder_embeddings, input_ids, self.pre_encoder_dropout, self.dropout_before_encoder)
        mask = None if attention_mask is None else key_padding_mask(attention_mask, src.dtype)
        s = src.shape[1]
        memory = self.encoder(src, mask, self.encoder_embeddings.compute_position_bias(s, s))
        if self.dropout_after_encoder is not None:
            memory = self.dropout_after_encoder(memory)
        tgt = self._embed(self.decoder_embeddings, decoder_input_ids, self.pre_decoder_dropout,
                          self.dropout_before_decoder)
        t = tgt.shape[1]
        causal = torch.full((t, t), torch.finfo(tgt.dtype).min, device=tgt.device, dtype=tgt.dtype).triu(1)
        out = self.decoder(tgt, causal[None, None], self.decoder_embeddings.compute_position_bias(t, t), memory, mask)
        if self.dropout_after_decoder is not None:
            out = self.dropout_after_decoder(out)
        if self.share_embedding_weights and not self.output_logits_scale:
            out = out * (self.d_model ** -0.5)
        logits = self.lm_head(out)
        if self.output_logits_scale:  # muP
            logits = logits * torch.tensor(float(self.output_logits_scale), dtype=logits.dtype)
        return logits


def t5_loss(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, scaling: str, lm_loss_weight: float,
            label_smoothing: float = 0.0, loss_weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """T5ForConditionalGenerationLoss (see the module docstring). ``precomputed_num_masked`` without a batch
    ``loss_weight`` (eval data that carries none) falls back to ``batch_size`` with ``lm_loss_weight``, as the
    vendor's loss does."""
    mask = mask.to(logits.dtype)
    if scaling == "precomputed_num_masked":
        if loss_weight is not None:
            mask = mask * loss_weight.to(logits.dtype)
        else:
            scaling = "batch_size"
    token = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1).long(), reduction="none")
    if label_smoothing > 0.0:
        smooth = -F.log_softmax(logits.float().reshape(-1, logits.shape[-1]), dim=-1).mean(-1)
        token = (1.0 - label_smoothing) * token + label_smoothing * smooth
    total = torch.sum(token * mask.reshape(-1))
    if scaling == "num_masked":
        return total / torch.sum(mask)
    if scaling == "precomputed_num_masked":
        return total / labels.shape[0]
    return total / labels.shape[0] * lm_loss_weight


class T5ForConditionalGenerationModel(nn.Module):
    """``forward(batch) -> loss``, the runners' contract; ``config`` holds the resolved keys."""

    def __init__(self, c: T5Config) -> None:
        super().__init__()
        self.config = dataclasses.asdict(c)
        self.lr_adjustment_groups = t5_lr_adjustment_groups(c)
        self.model = T5ForConditionalGeneration(c)
        self.mlm_loss_scaling, self.lm_loss_weight = c.mlm_loss_scaling, c.lm_loss_weight
        self.label_smoothing = c.label_smoothing
        self.accuracy_metric = self.perplexity_metric = None
        if c.compute_eval_metrics:
            self.accuracy_metric = AccuracyMetric("eval/accuracy_lm")
            self.perplexity_metric = PerplexityMetric("eval/perplexity_lm")

    def forward(self, batch: dict) -> torch.Tensor:
        logits = self.model(batch["input_ids"], batch.get("attention_mask"), batch["decoder_input_ids"])
        labels, mask = batch["labels"], batch["decoder_attention_mask"]
        loss = t5_loss(logits, labels, mask, self.mlm_loss_scaling, self.lm_loss_weight,
                       self.label_smoothing if self.training else 0.0, batch.get("loss_weight"))
        if not self.training and self.accuracy_metric is not None:
            weights = mask.to(logits.dtype)
            self.accuracy_metric(labels=labels.clone(), predictions=logits.argmax(-1).int(), weights=weights)
            xent = torch.sum(F.cross_entropy(logits.detach().float().reshape(-1, logits.shape[-1]),
                                             labels.reshape(-1).long(), reduction="none") * weights.reshape(-1))
            self.perplexity_metric(labels=labels.clone(), loss=xent, weights=weights)
        return loss


def build(config: T5Config) -> T5ForConditionalGenerationModel:
    """Builder of ``model.name: t5`` (ModelSpec.builder): the model of one config object."""
    if config.attention_kernel is not None:
        logger.info("model.attention_kernel: a Cerebras hardware option; same math here")
    return T5ForConditionalGenerationModel(config)


def build_model(**keys: Any) -> T5ForConditionalGenerationModel:
    """Model function of ``model.name: t5``: the keys are :class:`T5Config`'s fields."""
    return build(T5Config(**keys))


build_model.__signature__ = config_signature(T5Config)
