"""The configurable decoder language model: :func:`build` makes it of one :class:`DecoderConfig` (the Model
Zoo's decoder ``model:`` keys, declared in ``config.py``) and a family's :class:`BlockLayout`. Every
sequential-block family registers it under its name (``llama``, ``mistral``, ``gpt3``, ...), as the Model
Zoo's families are GPT-2 under other names; the parallel-block families (``parallel.py``) build through it.

One default follows the older releases: ``attention_dropout_rate`` absent is ``dropout_rate`` (Releases
1.x-2.3, whose files rely on it; 2.4+ declare 0.1 but every 2.10 decoder file sets the key, and None
means ``dropout_rate`` there too).

A key whose value cs-run cannot honour raises ValueError naming the key (reported as a params
error), never a silently different model. Keys that only steer Cerebras hardware
(``attention_kernel``, ``fold_rope_consts``, ``use_experimental_flex_api``, ``boundary_casting``) or
inference (``start_token``, ``temperature``, ...) are accepted; the hardware ones are logged once.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from cs_run.metrics import AccuracyMetric, PerplexityMetric
from cs_run.models.common.attention import MultiheadAttention
from cs_run.models.common.config import DecoderConfig
from cs_run.models.common.decoder import DecoderLM, TransformerDecoderLayer
from cs_run.models.common.embeddings import EmbeddingLayer
from cs_run.models.common.ffn import FeedForwardNetwork
from cs_run.models.common.initializers import initializer_spec, scale_spec, truncated_normal
from cs_run.models.common.moe import MoEConfig, SparseMoEBlock, load_balancing_loss, moe_config
from cs_run.models.common.mup import default_lr_adjustment_groups
from cs_run.models.common.norms import get_norm
from cs_run.models.common.rotary import check_scaling

logger = logging.getLogger(__name__)

__all__ = ["DecoderLMModel", "BlockLayout", "SEQUENTIAL", "build", "build_model", "model_defaults", "HARDWARE_KEYS",
           "masked_lm_loss"]

# Keys that steer the Cerebras compiler or kernels only: same math here.
HARDWARE_KEYS = {
    "attention_kernel": "picks a Cerebras attention kernel; cs-run computes the same attention",
    "fold_rope_consts": "folds the rotary tables into compile-time constants on Cerebras; same values here",
    "use_experimental_flex_api": "builds the mask with a Cerebras compile-time sparsity hint; same mask here",
    "boundary_casting": "a Cerebras precision-boundary option; no effect here",
    # Releases 1.7-2.0
    "precision_opt_level": "the Cerebras compiler's precision level (read from model by Releases 1.7-1.9); no effect "
                           "here",
    "allow_multireplica": "allows the Cerebras compiler's several model copies on one system; no effect here",
    "alibi_implementation": "picks one of the Model Zoo's two ways to build the same alibi bias; same bias here",
    "tf_summary": "read by no Model Zoo PyTorch code; no effect here",
    # Release 2.1's santacoder file (False there): read by no Model Zoo code, whose key is scale_qk_dot_by_layer_idx
    "scale_by_layer_index": "read by no Model Zoo code (the layer-index scaling is scale_qk_dot_by_layer_idx); no "
                            "effect here",
}
_logged: set = set()


class DecoderLMModel(nn.Module):
    """:class:`DecoderLM` (``.model``) with the Model Zoo's LM loss: ``forward(batch) -> loss``.

    Loss (GPTLMHeadModelLoss): per-token cross entropy times the loss mask (``attention_mask``),
    summed, divided by the unmasked token count (``loss_scaling: num_tokens``) or by the batch size
    times ``loss_weight`` (``batch_size``); plus, for MoE, ``load_balancing_loss_coef`` times the
    load-balancing loss while training. In eval mode it updates ``eval/accuracy`` and
    ``eval/lm_perplexity``. ``lr_adjustment_groups`` are muP's learning-rate groups (name ->
    (glob patterns over parameter names, scale)) for the optimizer's ``adjust_learning_rate``.
    A batch's ``attention_span`` and ``position_ids`` (``use_vsl`` shards) go to the decoder.
    """

    def __init__(self, model: DecoderLM, *, vocab_size: int, loss_scaling: str, loss_weight: float,
                 compute_eval_metrics: bool, moe: Optional[MoEConfig], lr_adjustment_groups: dict,
                 config: dict) -> None:
        super().__init__()
        self.model = model
        self.vocab_size = vocab_size
        self.loss_scaling = loss_scaling
        self.loss_weight = loss_weight
        self.moe = moe
        self.lr_adjustment_groups = lr_adjustment_groups
        self.config = config
        self.accuracy_metric = self.perplexity_metric = None
        if compute_eval_metrics:
            self.perplexity_metric = PerplexityMetric("eval/lm_perplexity")
            self.accuracy_metric = AccuracyMetric("eval/accuracy")

    def forward(self, batch: dict) -> torch.Tensor:
        input_ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
        out = self.model(input_ids, batch.get("attention_span"), batch.get("position_ids"))
        logits, routing = out if isinstance(out, tuple) else (out, None)
        token_loss = F.cross_entropy(logits.float().reshape(-1, self.vocab_size), labels.reshape(-1).long(),
                                     reduction="none")
        weights = mask.reshape(-1).to(torch.float32)
        summed = torch.sum(token_loss * weights)
        if self.loss_scaling == "num_tokens":
            loss = summed / torch.sum(weights)
        else:
            loss = summed / labels.shape[0] * self.loss_weight
        if routing and self.training and self.moe.load_balancing_loss_coef > 0:
            loss = loss + self.moe.load_balancing_loss_coef * load_balancing_loss(
                routing, self.moe.num_experts, attention_mask=mask)
        if not self.training and self.accuracy_metric is not None:
            lm_weights = mask.to(torch.float32)
            self.accuracy_metric(labels=labels.clone(), predictions=logits.argmax(-1).int(), weights=lm_weights)
            self.perplexity_metric(labels=labels.clone(), loss=summed.detach(), weights=lm_weights)
        return loss


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, loss_scaling: str,
                   loss_weight: float) -> torch.Tensor:
    """The Model Zoo's GPTLMHeadModelLoss, which the multimodal models (llava, multimodal_simple) use: the
    labels' cross entropy (in float32) summed under ``mask``, / the masked tokens (``num_tokens``) or / the batch
    size * ``loss_weight`` (``batch_size``)."""
    token_loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1).long(),
                                 reduction="none")
    weights = mask.reshape(-1).to(torch.float32)
    summed = torch.sum(token_loss * weights)
    if loss_scaling == "num_tokens":
        return summed / torch.sum(weights)
    return summed / labels.shape[0] * loss_weight


def _gpt2_initializers(specs: dict, default: dict, layers: int, width: Optional[float],
                       filter_mult: Optional[float]) -> tuple[dict, dict, dict, dict, dict]:
    """(embedding, attention, attention output, ffn, ffn output) specs by gpt2_model.py's rules: defaults
    are truncated normal(initializer_range), output projections 1/sqrt(2 * layers) of it; muP scales
    attention and ffn by width^-0.5, the outputs by width (filter) ^-0.5 and depth."""
    depth = (2 * layers) ** -0.5 if layers else 1.0
    attn = specs["initializer"] or default
    ffn = specs["ffn_initializer"] or attn
    out, ffn_out = specs["output_layer_initializer"], specs["ffn_output_layer_initializer"]
    if width:
        attn = scale_spec(attn, width ** -0.5, key="initializer")
        ffn = scale_spec(ffn, width ** -0.5, key="ffn_initializer")
        out = scale_spec(out or default, width ** -0.5, depth, key="output_layer_initializer")
    if filter_mult:
        ffn_out = scale_spec(ffn_out or default, filter_mult ** -0.5, depth, key="ffn_output_layer_initializer")
    if out is None and specs["initializer"] is None:
        out = scale_spec(default, depth_scale=depth)
    return specs["embedding_initializer"] or default, attn, out, ffn, ffn_out or out or ffn

def _refuse(key: str, value: Any, ok: bool, why: str) -> None:
    if not ok:
        raise ValueError(f"{key}: {value!r} is not supported by cs-run ({why})")


def _positive(**values: Optional[float]) -> None:
    for key, value in values.items():
        if value is not None and value <= 0:
            raise ValueError(f"{key}: must be > 0, got {value}")


def _rate(**values: Optional[float]) -> None:
    for key, value in values.items():
        if value is not None and not 0.0 <= value < 1.0:
            raise ValueError(f"{key}: must be in [0, 1), got {value}")



@dataclass(frozen=True)
class BlockLayout:
    """How a family wires its decoder blocks, beyond its keys: ``parallel`` (GPT-J/NeoX/Falcon blocks:
    attention and FFN read the same input and add to one residual), ``ffn_norm`` (for parallel blocks: a
    second norm for the FFN input) and ``initializer_rules`` (the family's default initializers: a function
    of (specs, default, layers, width, filter multiplier) -> (embedding, attention, attention output, ffn,
    ffn output) specs)."""

    parallel: bool = False
    ffn_norm: bool = True
    initializer_rules: Callable = _gpt2_initializers


SEQUENTIAL = BlockLayout()
"""GPT-2's blocks (attention, then FFN) and initializer rules: every family of :class:`DecoderConfig`."""


class _Init(NamedTuple):
    """The resolved initializers and muP factors of one build."""

    embedding: dict
    attention: dict
    output: dict
    ffn: dict
    ffn_output: dict
    gate: dict
    logits_scale: Optional[float]
    groups: dict
    scale_qk_dot_by_d: bool


def build(config: DecoderConfig, layout: BlockLayout = SEQUENTIAL) -> DecoderLMModel:
    """The decoder LM of ``config`` with ``layout``'s blocks (a family's builder calls this with its own
    layout). Its ``.config`` is the config's keys as resolved (what the HF adapters read).

    Raises:
        ValueError: naming the key whose value cs-run cannot honour or that is out of range.
    """
    config = _current_spelling(config)
    _log_hardware_keys(config)
    _refuse_unsupported(config)
    num_kv_groups = _check_sizes(config)
    _check_ranges(config)
    kind, rotary_dim = _check_positions(config)
    loss_scaling, loss_weight = _loss_rule(config)
    moe_cfg = moe_config(config.moe or {})
    if moe_cfg.enabled and layout.parallel:
        raise ValueError("moe: experts are not supported with parallel attention blocks (GPT-J/NeoX/Falcon)")
    init = _initializers(config, layout, moe_cfg)
    layers = [_layer(config, layout, init, moe_cfg, num_kv_groups) for _ in range(config.num_hidden_layers)]
    decoder = _decoder(config, layers, init, kind, rotary_dim)
    # the moe section with every default filled in (what the block computes; the HF adapters compare it)
    resolved = {**asdict(config), "rotary_dim": rotary_dim, "scale_qk_dot_by_d": init.scale_qk_dot_by_d,
                "loss_scaling": loss_scaling, "loss_weight": loss_weight, "num_kv_groups": num_kv_groups,
                "output_logits_scale_applied": init.logits_scale, "moe": asdict(moe_cfg) if moe_cfg.enabled else None}
    return DecoderLMModel(decoder, vocab_size=config.vocab_size, loss_scaling=loss_scaling,
                          loss_weight=float(loss_weight), compute_eval_metrics=config.compute_eval_metrics,
                          moe=moe_cfg if moe_cfg.enabled else None, lr_adjustment_groups=init.groups,
                          config=resolved)


def _current_spelling(config: DecoderConfig) -> DecoderConfig:
    """Release 1.x's spellings as today's: use_position_embedding: false is position_embedding_type null, and
    Release 1.9's use_rms_norm: true is norm_type rmsnorm (its gpt2 model: RMSNorm if use_rms_norm)."""
    if not config.use_position_embedding:
        config = replace(config, position_embedding_type=None)
    if config.use_rms_norm:
        if config.norm_type not in ("layernorm", "rmsnorm"):
            raise ValueError(f"use_rms_norm: true and norm_type: {config.norm_type} name two norms; keep norm_type")
        config = replace(config, norm_type="rmsnorm")
    return config


def _log_hardware_keys(config: DecoderConfig) -> None:
    """Log once per process each hardware-only key a config sets (same math here)."""
    for key in HARDWARE_KEYS:
        if getattr(config, key) not in (None, False) and key not in _logged:
            _logged.add(key)
            logger.info("model.%s: %s", key, HARDWARE_KEYS[key])


def _refuse_unsupported(c: DecoderConfig) -> None:
    """Values cs-run cannot honour: one error naming the key."""
    _refuse("position_embedding_type", c.position_embedding_type, c.position_embedding_type != "relative",
            "T5-style relative position buckets are an encoder feature; use learned, fixed, rotary or alibi")
    _refuse("constant_pos_embedding", c.constant_pos_embedding, c.constant_pos_embedding is None,
            "it needs a multimodal constant_pos_mask input")
    _refuse("attention_vertical_column_spacing", c.attention_vertical_column_spacing,
            c.attention_vertical_column_spacing is None and c.attention_vertical_column_width is None,
            "vertical-column sparse masks are not implemented")
    _refuse("attention_chunk_size", c.attention_chunk_size, c.attention_chunk_size is None,
            "chunked attention masks are not implemented")
    _refuse("attention_qk_norm_layer", c.attention_qk_norm_layer, c.attention_qk_norm_layer is None,
            "the Model Zoo builds q/k norms without applying them; no equivalent to match")
    _refuse("fixed_sparse_attention", c.fixed_sparse_attention, not c.fixed_sparse_attention,
            "fixed sparse attention masks are not implemented")
    _refuse("memory_tokens", c.memory_tokens, not (c.memory_tokens or {}).get("memory_tokens_enabled"),
            "memory tokens are not implemented")
    _refuse("cross_attention_layers", c.cross_attention_layers, not c.cross_attention_layers,
            "cross-attention (multimodal) layers are not implemented")
    _refuse("rel_distance_mode", c.rel_distance_mode, c.rel_distance_mode == "default",
            "capped/grouped RoPE distances are not implemented")
    _refuse("extra_ffn_params", c.extra_ffn_params, not c.extra_ffn_params, "no FFN variants are implemented")
    _refuse("lr_adjustment_groups", c.lr_adjustment_groups, c.lr_adjustment_groups is None,
            "custom groups are not implemented; the muP default groups apply")
    _refuse("dtype", c.dtype, c.dtype is None, "the embedding dtype follows the run's precision")


def _check_sizes(c: DecoderConfig) -> Optional[int]:
    """The sizes' ranges and divisibility; returns the key/value group count (None: one per head)."""
    extra_attention_params = dict(c.extra_attention_params or {})
    extra_attention_params.pop("attention_kernel", None)
    num_kv_groups = extra_attention_params.pop("num_kv_groups", None)
    for key in extra_attention_params:
        raise ValueError(f"extra_attention_params.{key}: unknown; the decoder's attention takes num_kv_groups")
    for key in ("vocab_size", "hidden_size", "num_heads", "filter_size", "max_position_embeddings"):
        if getattr(c, key) < 1:
            raise ValueError(f"{key}: must be >= 1, got {getattr(c, key)}")
    if c.num_hidden_layers < 0:
        raise ValueError(f"num_hidden_layers: must be >= 0, got {c.num_hidden_layers}")
    if c.vocab_size > 512000:
        raise ValueError(f"vocab_size: must be <= 512000 (the Model Zoo's limit), got {c.vocab_size}")
    inner_dim = c.attention_inner_dim or c.hidden_size
    if c.hidden_size % c.num_heads:
        raise ValueError(f"hidden_size: {c.hidden_size} is not divisible by num_heads ({c.num_heads})")
    if inner_dim % c.num_heads:
        raise ValueError(f"attention_inner_dim: {inner_dim} is not divisible by num_heads ({c.num_heads})")
    if c.attention_module == "multiquery_attention":
        num_kv_groups = 1 if num_kv_groups is None else num_kv_groups
        if num_kv_groups < 1 or c.num_heads % num_kv_groups:
            raise ValueError(f"extra_attention_params.num_kv_groups: num_heads ({c.num_heads}) must be a multiple "
                             f"of it, got {num_kv_groups}")
        return num_kv_groups
    if num_kv_groups is not None and num_kv_groups != c.num_heads:
        raise ValueError("extra_attention_params.num_kv_groups: set attention_module: multiquery_attention to "
                         "group keys and values")
    return None


def _check_ranges(c: DecoderConfig) -> None:
    """Rates in [0, 1), positive scales, and the keys that need another key."""
    _rate(dropout_rate=c.dropout_rate, embedding_dropout_rate=c.embedding_dropout_rate,
          attention_dropout_rate=c.attention_dropout_rate)
    _positive(layer_norm_epsilon=c.layer_norm_epsilon, rope_theta=c.rope_theta, pos_scaling_factor=c.pos_scaling_factor,
              attention_logit_softcapping=c.attention_logit_softcapping,
              final_logit_softcapping=c.final_logit_softcapping,
              attention_sliding_window_length=c.attention_sliding_window_length,
              mup_base_hidden_size=c.mup_base_hidden_size, mup_base_filter_size=c.mup_base_filter_size,
              initializer_range=c.initializer_range)
    if c.position_embedding_offset < 0:
        raise ValueError(f"position_embedding_offset: must be >= 0, got {c.position_embedding_offset}")
    if c.position_embedding_offset and c.position_embedding_type != "learned":
        raise ValueError("position_embedding_offset: applies to learned position embeddings only")
    if c.position_embedding_type == "fixed" and c.hidden_size < 4:
        raise ValueError("hidden_size: fixed position embeddings need hidden_size >= 4")
    if c.sliding_window_every_other_decoder_layer and c.attention_sliding_window_length is None:
        raise ValueError("sliding_window_every_other_decoder_layer: needs attention_sliding_window_length")
    if (c.sliding_window_every_other_decoder_layer_pattern not in (None, "full_attention_first")
            and not c.sliding_window_every_other_decoder_layer):
        raise ValueError("sliding_window_every_other_decoder_layer_pattern: only applies with "
                         "sliding_window_every_other_decoder_layer: true")
    if c.attention_sink_tokens is not None and c.attention_sliding_window_length is None:
        raise ValueError("attention_sink_tokens: needs attention_sliding_window_length")


def _check_positions(c: DecoderConfig) -> tuple[str, Optional[int]]:
    """The position scaling kind (checked) and the rotary width (its default filled in)."""
    kind = check_scaling(c.pos_scaling_type, c.pos_scaling_extra_args)
    if c.position_embedding_type not in ("rotary", "alibi") and (c.pos_scaling_factor != 1.0 or kind != "linear"):
        raise ValueError("pos_scaling_factor: position scaling applies to rotary and alibi only")
    if c.position_embedding_type == "alibi" and kind != "linear":
        raise ValueError(f"pos_scaling_type: alibi takes linear scaling only, got {c.pos_scaling_type!r}")
    rotary_dim = c.rotary_dim
    if c.position_embedding_type == "rotary":
        head_dim = (c.attention_inner_dim or c.hidden_size) // c.num_heads
        if rotary_dim is None:
            rotary_dim = int(c.hidden_size // c.num_heads * 0.25)  # the Model Zoo config's default
        if rotary_dim > head_dim or rotary_dim % 2 or rotary_dim < 2:
            raise ValueError(f"rotary_dim: must be even, >= 2 and <= head_dim ({head_dim}), got {rotary_dim}")
    return kind, rotary_dim


def _loss_rule(c: DecoderConfig) -> tuple[str, float]:
    """``(loss_scaling, loss_weight)`` as the loss applies them (the weight only scales batch_size scaling)."""
    loss_scaling, loss_weight = c.loss_scaling.lower(), c.loss_weight
    if loss_scaling == "num_tokens" and loss_weight != 1.0:
        logger.warning("model.loss_weight=%s has no effect with loss_scaling 'num_tokens'; using 1.0, as the "
                       "Model Zoo does", loss_weight)
        loss_weight = 1.0
    if loss_weight <= 0:
        raise ValueError(f"loss_weight: must be > 0, got {loss_weight}")
    return loss_scaling, loss_weight


def _initializers(c: DecoderConfig, layout: BlockLayout, moe_cfg: MoEConfig) -> _Init:
    """The family's initializer rules and muP's scaling of them, of the logits and of the LR groups."""
    mup = bool(c.mup_base_hidden_size or c.mup_base_filter_size)
    if mup and not (c.mup_base_hidden_size and c.mup_base_filter_size):
        raise ValueError("mup_base_hidden_size: muP needs both mup_base_hidden_size and mup_base_filter_size")
    if mup and c.output_logits_scale:
        raise ValueError("output_logits_scale: the deprecated muP scale cannot be combined with mup_base_* keys; "
                         "use output_logits_alpha")
    specs = {k: initializer_spec(getattr(c, k), k) if getattr(c, k) is not None else None for k in (
        "initializer", "embedding_initializer", "output_layer_initializer", "ffn_initializer",
        "ffn_output_layer_initializer")}
    width = c.hidden_size / c.mup_base_hidden_size if c.mup_base_hidden_size else None
    filter_mult = c.filter_size / c.mup_base_filter_size if c.mup_base_filter_size else None
    default = truncated_normal(c.initializer_range)
    inits = layout.initializer_rules(specs, default, c.num_hidden_layers, width, filter_mult)
    # the router's gate (gpt2_model.py): the given ``initializer`` as written, else moe.gate_initializer, else
    # the default truncated normal
    gate = specs["initializer"] or (initializer_spec(moe_cfg.gate_initializer, "moe.gate_initializer")
                                    if moe_cfg.gate_initializer is not None else default)
    logits_scale, groups = c.output_logits_scale, default_lr_adjustment_groups()
    if width:
        alpha = c.output_logits_alpha or 1.0
        logits_scale = alpha / width if c.scale_output_logits_by_d else alpha / width ** 0.5
        for name in ("decoder_attention", "decoder_input_ffn"):
            groups[name] = (groups[name][0], 1 / width)
    if filter_mult:
        groups["decoder_output_ffn"] = (groups["decoder_output_ffn"][0], 1 / filter_mult)
    scale_qk = mup if c.scale_qk_dot_by_d is None else c.scale_qk_dot_by_d
    return _Init(*inits, gate, logits_scale, groups, scale_qk)


def _norm(c: DecoderConfig) -> Callable[[int], nn.Module]:
    norm_class = get_norm(c.norm_type)
    return lambda size: norm_class(size, eps=c.layer_norm_epsilon)


def _layer(c: DecoderConfig, layout: BlockLayout, init: _Init, moe_cfg: MoEConfig,
           num_kv_groups: Optional[int]) -> TransformerDecoderLayer:
    """One decoder block: attention, FFN (or experts), their norms."""
    attention = MultiheadAttention(
        c.hidden_size, c.num_heads, inner_dim=c.attention_inner_dim, num_kv_groups=num_kv_groups,
        dropout=c.dropout_rate if c.attention_dropout_rate is None else c.attention_dropout_rate,
        use_projection_bias=c.use_projection_bias_in_attention, use_ffn_bias=c.use_ffn_bias_in_attention,
        attention_type=c.attention_type, scale_qk_dot_by_d=init.scale_qk_dot_by_d,
        attention_logits_alpha=c.attention_logits_alpha or 1.0, scale_qk_dot_by_layer_idx=c.scale_qk_dot_by_layer_idx,
        logit_softcapping=c.attention_logit_softcapping, softmax_fp32=c.attention_softmax_fp32,
        use_sink_token=c.use_sink_token, initializer=init.attention, output_initializer=init.output)
    if moe_cfg.enabled:
        ffn = SparseMoEBlock(moe_cfg, c.hidden_size, c.filter_size, c.nonlinearity, c.dropout_rate, c.use_ffn_bias,
                             init.ffn, init.ffn_output, init.gate)
    else:
        ffn = FeedForwardNetwork(c.hidden_size, c.filter_size, c.nonlinearity, c.dropout_rate, c.use_ffn_bias,
                                 init.ffn, init.ffn_output)
    return TransformerDecoderLayer(c.hidden_size, _norm(c), attention, ffn, c.dropout_rate, c.norm_first_sandwich,
                                   parallel=layout.parallel, ffn_norm=layout.ffn_norm)


def _decoder(c: DecoderConfig, layers: list, init: _Init, kind: str, rotary_dim: Optional[int]) -> DecoderLM:
    """The embeddings, the blocks, the final norm and the LM head."""
    embedding = EmbeddingLayer(
        c.vocab_size + c.num_extra_input_vocab_tokens, c.hidden_size, c.max_position_embeddings,
        c.position_embedding_type, init.embedding, c.position_embedding_offset, c.num_heads, rotary_dim, c.rope_theta,
        c.alibi_trainable_slopes, init.attention, c.pos_scaling_factor, kind, c.pos_scaling_extra_args)
    every_other = c.sliding_window_every_other_decoder_layer
    return DecoderLM(
        embedding_layer=embedding, layers=layers, norm=_norm(c), hidden_size=c.hidden_size, vocab_size=c.vocab_size,
        embedding_layer_norm=c.embedding_layer_norm,
        embedding_dropout=c.dropout_rate if c.embedding_dropout_rate is None else c.embedding_dropout_rate,
        embeddings_scale=float(1.0 if c.embeddings_scale is None else c.embeddings_scale),
        share_embedding_weights=c.share_embedding_weights, use_bias_in_output=c.use_bias_in_output,
        lm_head_std=c.initializer_range, output_logits_scale=init.logits_scale,
        final_logit_softcapping=c.final_logit_softcapping, sliding_window=c.attention_sliding_window_length,
        sliding_window_every_other_layer=every_other,
        sliding_window_first=every_other and c.sliding_window_every_other_decoder_layer_pattern == "sliding_window_first",
        sink_tokens=c.attention_sink_tokens)


def model_defaults(model: dict) -> None:
    """The Model Zoo decoders' params defaults (gpt2/utils.py set_defaults): mixed precision is bfloat16."""
    if model.get("mixed_precision"):
        model.setdefault("use_bfloat16", True)


def build_model(**keys: Any) -> DecoderLMModel:
    """Model function of the decoder families (``model.name: gpt2``, ``llama``, ...): the ``model:`` keys (a
    Model Zoo ``model`` section, a ``**`` of it) as a :class:`DecoderConfig`, built."""
    return build(DecoderConfig(**keys))
