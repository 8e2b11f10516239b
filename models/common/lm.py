"""The configurable decoder language model: ``build_model``'s keyword parameters are the Model Zoo's
decoder ``model:`` keys (Release 2.10 ``gpt2/gpt2_model.py`` GPT2LMHeadModelConfig and
``gpt2/model.py`` GPT2ModelConfig), each with the Model Zoo's meaning and default. Every decoder
family registers this function under its name (``llama``, ``mistral``, ``gpt3``, ...), as the Model
Zoo's families are GPT-2 under other names.

One default follows the older releases: ``attention_dropout_rate`` absent is ``dropout_rate`` (Releases
1.x-2.3, whose files rely on it; 2.4+ declare 0.1 but every 2.10 decoder file sets the key, and None
means ``dropout_rate`` there too).

A key whose value cs-run cannot honour raises ValueError naming the key (reported as a params
error), never a silently different model. Keys that only steer Cerebras hardware
(``attention_kernel``, ``fold_rope_consts``, ``use_experimental_flex_api``, ``boundary_casting``) or
inference (``start_token``, ``temperature``, ...) are accepted; the hardware ones are logged once.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import asdict
from typing import Any, Literal, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from cs_run.metrics import AccuracyMetric, PerplexityMetric
from cs_run.models.common.activations import ACTIVATIONS
from cs_run.models.common.attention import MultiheadAttention
from cs_run.models.common.decoder import DecoderLM, TransformerDecoderLayer
from cs_run.models.common.embeddings import EmbeddingLayer
from cs_run.models.common.ffn import FeedForwardNetwork
from cs_run.models.common.initializers import initializer_spec, scale_spec, truncated_normal
from cs_run.models.common.moe import MoEConfig, SparseMoEBlock, load_balancing_loss, moe_config
from cs_run.models.common.mup import default_lr_adjustment_groups
from cs_run.models.common.norms import get_norm
from cs_run.models.common.rotary import check_scaling

logger = logging.getLogger(__name__)

__all__ = ["DecoderLMModel", "assemble", "build_model", "model_defaults", "HARDWARE_KEYS"]

Initializer = Optional[Union[str, dict]]
NormType = Literal["layernorm", "rmsnorm", "biasless-layernorm", "nonparametric-layernorm"]
Activation = Literal[tuple(ACTIVATIONS)]

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
_FAMILY_ARGS = ("parallel_attention", "untied_layer_norm", "initializer_rules")


class DecoderLMModel(nn.Module):
    """:class:`DecoderLM` (``.model``) with the Model Zoo's LM loss: ``forward(batch) -> loss``.

    Loss (GPTLMHeadModelLoss): per-token cross entropy times the loss mask (``attention_mask``),
    summed, divided by the unmasked token count (``loss_scaling: num_tokens``) or by the batch size
    times ``loss_weight`` (``batch_size``); plus, for MoE, ``load_balancing_loss_coef`` times the
    load-balancing loss while training. In eval mode it updates ``eval/accuracy`` and
    ``eval/lm_perplexity``. ``lr_adjustment_groups`` are muP's learning-rate groups (name ->
    (glob patterns over parameter names, scale)) for the optimizer's ``adjust_learning_rate``.
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
        out = self.model(input_ids)
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


def _gptj_initializers(specs: dict, default: dict, layers: int, width: Optional[float],
                       filter_mult: Optional[float]) -> tuple[dict, dict, dict, dict, dict]:
    """The same by gptj_model.py's rules: every default is truncated normal(initializer_range), no depth
    scaling outside muP; ffn and ffn output default to the output initializer. muP scales only the
    defaults: the Model Zoo scales its default dicts in place and drops the scaled copies of
    initializers the params give (their values are used as written)."""
    depth = (2 * layers) ** -0.5 if layers else 1.0

    w = width ** -0.5 if width else 1.0
    out_given = specs["output_layer_initializer"]
    attn = specs["initializer"] or scale_spec(default, w)
    out = out_given or scale_spec(default, w, depth if width else 1.0)
    ffn = specs["ffn_initializer"] or out_given or scale_spec(default, w)
    ffn_out = specs["ffn_output_layer_initializer"] or out_given or \
        scale_spec(default, filter_mult ** -0.5 if filter_mult else 1.0, depth if filter_mult else 1.0)
    return specs["embedding_initializer"] or default, attn, out, ffn, ffn_out


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


def assemble(
    # embeddings
    vocab_size: int = 50257, num_extra_input_vocab_tokens: int = 0, max_position_embeddings: int = 1024,
    embedding_dropout_rate: Optional[float] = None,
    position_embedding_type: Optional[Literal["learned", "fixed", "relative", "rotary", "alibi"]] = "learned",
    constant_pos_embedding: Optional[int] = None, position_embedding_offset: int = 0, hidden_size: int = 768,
    share_embedding_weights: bool = True, embedding_layer_norm: bool = False,
    num_relative_attention_buckets: int = 32, rotary_dim: Optional[int] = None, rope_theta: float = 10000.0,
    fold_rope_consts: bool = False,
    # decoder
    num_hidden_layers: int = 12, dropout_rate: float = 0.1, norm_type: NormType = "layernorm",
    layer_norm_epsilon: float = 1e-5,
    # attention
    num_heads: int = 12, attention_type: Literal["dot_product", "scaled_dot_product"] = "scaled_dot_product",
    attention_module: Literal["aiayn_attention", "multiquery_attention"] = "aiayn_attention",
    attention_sliding_window_length: Optional[int] = None, sliding_window_every_other_decoder_layer: bool = False,
    sliding_window_every_other_decoder_layer_pattern: Optional[
        Literal["sliding_window_first", "full_attention_first"]] = "full_attention_first",
    attention_sink_tokens: Optional[int] = None, attention_vertical_column_spacing: Optional[int] = None,
    attention_vertical_column_width: Optional[int] = None, attention_chunk_size: Optional[int] = None,
    attention_qk_norm_layer: Optional[str] = None, attention_qk_norm_eps: float = 1e-5,
    extra_attention_params: Optional[dict] = None, extra_ffn_params: Optional[dict] = None,
    attention_inner_dim: Optional[int] = None, use_projection_bias_in_attention: bool = True,
    use_ffn_bias_in_attention: bool = True, attention_dropout_rate: Optional[float] = None,
    attention_softmax_fp32: bool = True, attention_kernel: Optional[str] = None,
    attention_logit_softcapping: Optional[float] = None, fixed_sparse_attention: Optional[dict] = None,
    memory_tokens: Optional[dict] = None, use_experimental_flex_api: bool = False,
    # ffn
    filter_size: int = 3072, nonlinearity: Activation = "gelu", use_ffn_bias: bool = True,
    use_sink_token: bool = False,
    # head and initializers
    use_bias_in_output: bool = False, initializer_range: float = 0.02, embedding_initializer: Initializer = None,
    initializer: Initializer = None, output_layer_initializer: Initializer = None,
    ffn_initializer: Initializer = None, ffn_output_layer_initializer: Initializer = None,
    # muP
    lr_adjustment_groups: Optional[dict] = None, mup_base_hidden_size: Optional[float] = None,
    mup_base_filter_size: Optional[float] = None, embeddings_scale: Optional[float] = 1.0,
    scale_qk_dot_by_d: Optional[bool] = None, attention_logits_alpha: Optional[float] = 1.0,
    scale_output_logits_by_d: Optional[bool] = True, output_logits_alpha: Optional[float] = None,
    output_logits_scale: Optional[float] = None,
    # position scaling, misc
    alibi_trainable_slopes: bool = False, pos_scaling_factor: float = 1.0,
    pos_scaling_type: Literal["linear", "YaRN", "yarn", "llama3", "longrope"] = "linear",
    pos_scaling_extra_args: Optional[dict] = None, cross_attention_layers: Optional[list] = None,
    rel_distance_mode: Literal["default", "capped", "grouped"] = "default",
    rel_distance_extra_args: Optional[dict] = None, scale_qk_dot_by_layer_idx: bool = False,
    norm_first_sandwich: bool = False, final_logit_softcapping: Optional[float] = None,
    moe: Optional[dict] = None, dtype: Optional[str] = None, boundary_casting: Optional[bool] = False,
    # loss, inference, metrics (gpt2/model.py)
    loss_scaling: Literal["batch_size", "num_tokens", "BATCH_SIZE", "NUM_TOKENS"] = "num_tokens",
    loss_weight: float = 1.0, start_token: Optional[Union[int, list]] = None, loop_dim: int = 1,
    stop_sequences: Optional[Union[int, list]] = None, max_tokens: Optional[int] = None,
    temperature: Optional[float] = None, top_k: Optional[int] = None, top_p: Optional[float] = None,
    compute_eval_metrics: bool = True,
    # Release 1.x
    use_position_embedding: bool = True, use_rms_norm: Optional[bool] = None,
    precision_opt_level: Optional[int] = None, allow_multireplica: Optional[bool] = None,
    alibi_implementation: Optional[Literal["expand", "embedding"]] = None, tf_summary: Optional[bool] = None,
    scale_by_layer_index: Optional[bool] = None,
    *, parallel_attention: bool = False, untied_layer_norm: bool = True, initializer_rules: str = "gpt2",
) -> DecoderLMModel:
    """The decoder LM of these keys; :func:`build_model` is this without the last three, which a family
    with its own schema sets: ``parallel_attention`` (GPT-J/NeoX/Falcon blocks: attention and FFN read
    the same input and add to one residual), ``untied_layer_norm`` (for parallel blocks: a second norm
    for the FFN input) and ``initializer_rules`` ("gpt2" or "gptj", whose default initializers differ).
    Raises ValueError naming the key."""
    config = {k: v for k, v in locals().items() if k not in _FAMILY_ARGS}
    if not use_position_embedding:  # Release 1.x's way to say position_embedding_type: null
        position_embedding_type = config["position_embedding_type"] = None
    if use_rms_norm:  # Release 1.9's way to say norm_type: rmsnorm (its gpt2 model: RMSNorm if use_rms_norm)
        if norm_type not in ("layernorm", "rmsnorm"):
            raise ValueError(f"use_rms_norm: true and norm_type: {norm_type} name two norms; keep norm_type")
        norm_type = config["norm_type"] = "rmsnorm"
    for key in HARDWARE_KEYS:
        if config[key] not in (None, False) and key not in _logged:
            _logged.add(key)
            logger.info("model.%s: %s", key, HARDWARE_KEYS[key])
    # --- values cs-run cannot honour: one error naming the key ---
    _refuse("position_embedding_type", position_embedding_type, position_embedding_type != "relative",
            "T5-style relative position buckets are an encoder feature; use learned, fixed, rotary or alibi")
    _refuse("constant_pos_embedding", constant_pos_embedding, constant_pos_embedding is None,
            "it needs a multimodal constant_pos_mask input")
    _refuse("attention_vertical_column_spacing", attention_vertical_column_spacing,
            attention_vertical_column_spacing is None and attention_vertical_column_width is None,
            "vertical-column sparse masks are not implemented")
    _refuse("attention_chunk_size", attention_chunk_size, attention_chunk_size is None,
            "chunked attention masks are not implemented")
    _refuse("attention_qk_norm_layer", attention_qk_norm_layer, attention_qk_norm_layer is None,
            "the Model Zoo builds q/k norms without applying them; no equivalent to match")
    _refuse("fixed_sparse_attention", fixed_sparse_attention, not fixed_sparse_attention,
            "fixed sparse attention masks are not implemented")
    _refuse("memory_tokens", memory_tokens, not (memory_tokens or {}).get("memory_tokens_enabled"),
            "memory tokens are not implemented")
    _refuse("cross_attention_layers", cross_attention_layers, not cross_attention_layers,
            "cross-attention (multimodal) layers are not implemented")
    _refuse("rel_distance_mode", rel_distance_mode, rel_distance_mode == "default",
            "capped/grouped RoPE distances are not implemented")
    _refuse("extra_ffn_params", extra_ffn_params, not extra_ffn_params, "no FFN variants are implemented")
    _refuse("lr_adjustment_groups", lr_adjustment_groups, lr_adjustment_groups is None,
            "custom groups are not implemented; the muP default groups apply")
    _refuse("dtype", dtype, dtype is None, "the embedding dtype follows the run's precision")
    extra_attention_params = dict(extra_attention_params or {})
    extra_attention_params.pop("attention_kernel", None)
    num_kv_groups = extra_attention_params.pop("num_kv_groups", None)
    for key in extra_attention_params:
        raise ValueError(f"extra_attention_params.{key}: unknown; the decoder's attention takes num_kv_groups")
    # --- ranges and consistency ---
    for key, value in (("vocab_size", vocab_size), ("hidden_size", hidden_size), ("num_heads", num_heads),
                       ("filter_size", filter_size), ("max_position_embeddings", max_position_embeddings)):
        if value < 1:
            raise ValueError(f"{key}: must be >= 1, got {value}")
    if num_hidden_layers < 0:
        raise ValueError(f"num_hidden_layers: must be >= 0, got {num_hidden_layers}")
    if vocab_size > 512000:
        raise ValueError(f"vocab_size: must be <= 512000 (the Model Zoo's limit), got {vocab_size}")
    inner_dim = attention_inner_dim or hidden_size
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size: {hidden_size} is not divisible by num_heads ({num_heads})")
    if inner_dim % num_heads:
        raise ValueError(f"attention_inner_dim: {inner_dim} is not divisible by num_heads ({num_heads})")
    if attention_module == "multiquery_attention":
        num_kv_groups = 1 if num_kv_groups is None else num_kv_groups
        if num_kv_groups < 1 or num_heads % num_kv_groups:
            raise ValueError(f"extra_attention_params.num_kv_groups: num_heads ({num_heads}) must be a multiple of "
                             f"it, got {num_kv_groups}")
    elif num_kv_groups is not None and num_kv_groups != num_heads:
        raise ValueError("extra_attention_params.num_kv_groups: set attention_module: multiquery_attention to "
                         "group keys and values")
    else:
        num_kv_groups = None
    _rate(dropout_rate=dropout_rate, embedding_dropout_rate=embedding_dropout_rate,
          attention_dropout_rate=attention_dropout_rate)
    _positive(layer_norm_epsilon=layer_norm_epsilon, rope_theta=rope_theta, pos_scaling_factor=pos_scaling_factor,
              attention_logit_softcapping=attention_logit_softcapping,
              final_logit_softcapping=final_logit_softcapping, attention_sliding_window_length=
              attention_sliding_window_length, mup_base_hidden_size=mup_base_hidden_size,
              mup_base_filter_size=mup_base_filter_size, initializer_range=initializer_range)
    if position_embedding_offset < 0:
        raise ValueError(f"position_embedding_offset: must be >= 0, got {position_embedding_offset}")
    if position_embedding_offset and position_embedding_type != "learned":
        raise ValueError("position_embedding_offset: applies to learned position embeddings only")
    if position_embedding_type == "fixed" and hidden_size < 4:
        raise ValueError("hidden_size: fixed position embeddings need hidden_size >= 4")
    if sliding_window_every_other_decoder_layer and attention_sliding_window_length is None:
        raise ValueError("sliding_window_every_other_decoder_layer: needs attention_sliding_window_length")
    if (sliding_window_every_other_decoder_layer_pattern not in (None, "full_attention_first")
            and not sliding_window_every_other_decoder_layer):
        raise ValueError("sliding_window_every_other_decoder_layer_pattern: only applies with "
                         "sliding_window_every_other_decoder_layer: true")
    if attention_sink_tokens is not None and attention_sliding_window_length is None:
        raise ValueError("attention_sink_tokens: needs attention_sliding_window_length")
    kind = check_scaling(pos_scaling_type, pos_scaling_extra_args)
    if position_embedding_type not in ("rotary", "alibi") and (pos_scaling_factor != 1.0 or kind != "linear"):
        raise ValueError("pos_scaling_factor: position scaling applies to rotary and alibi only")
    if position_embedding_type == "alibi" and kind != "linear":
        raise ValueError(f"pos_scaling_type: alibi takes linear scaling only, got {pos_scaling_type!r}")
    if position_embedding_type == "rotary":
        head_dim = inner_dim // num_heads
        if rotary_dim is None:
            rotary_dim = int(hidden_size // num_heads * 0.25)  # the Model Zoo config's default
        if rotary_dim > head_dim or rotary_dim % 2 or rotary_dim < 2:
            raise ValueError(f"rotary_dim: must be even, >= 2 and <= head_dim ({head_dim}), got {rotary_dim}")
    loss_scaling = loss_scaling.lower()
    if loss_scaling == "num_tokens" and loss_weight != 1.0:
        logger.warning("model.loss_weight=%s has no effect with loss_scaling 'num_tokens'; using 1.0, as the "
                       "Model Zoo does", loss_weight)
        loss_weight = 1.0
    if loss_weight <= 0:
        raise ValueError(f"loss_weight: must be > 0, got {loss_weight}")
    moe_cfg = moe_config(moe or {})
    if moe_cfg.enabled and parallel_attention:
        raise ValueError("moe: experts are not supported with parallel attention blocks (GPT-J/NeoX/Falcon)")
    # --- muP ---
    mup = bool(mup_base_hidden_size or mup_base_filter_size)
    if mup and not (mup_base_hidden_size and mup_base_filter_size):
        raise ValueError("mup_base_hidden_size: muP needs both mup_base_hidden_size and mup_base_filter_size")
    if mup and output_logits_scale:
        raise ValueError("output_logits_scale: the deprecated muP scale cannot be combined with mup_base_* keys; "
                         "use output_logits_alpha")
    if scale_qk_dot_by_d is None:
        scale_qk_dot_by_d = mup
    specs = {k: initializer_spec(v, k) if v is not None else None for k, v in (
        ("initializer", initializer), ("embedding_initializer", embedding_initializer),
        ("output_layer_initializer", output_layer_initializer), ("ffn_initializer", ffn_initializer),
        ("ffn_output_layer_initializer", ffn_output_layer_initializer))}
    rules = _gptj_initializers if initializer_rules == "gptj" else _gpt2_initializers
    width = hidden_size / mup_base_hidden_size if mup_base_hidden_size else None
    filter_mult = filter_size / mup_base_filter_size if mup_base_filter_size else None
    emb_init, attn_init, out_init, ffn_init, ffn_out_init = rules(specs, truncated_normal(initializer_range),
                                                                  num_hidden_layers, width, filter_mult)
    # the router's gate (gpt2_model.py): the given ``initializer`` as written, else moe.gate_initializer, else
    # the default truncated normal
    gate_init = specs["initializer"] or (initializer_spec(moe_cfg.gate_initializer, "moe.gate_initializer")
                                         if moe_cfg.gate_initializer is not None else truncated_normal(initializer_range))
    logits_scale, groups = output_logits_scale, default_lr_adjustment_groups()
    if width:
        alpha = output_logits_alpha or 1.0
        logits_scale = alpha / width if scale_output_logits_by_d else alpha / width ** 0.5
        for name in ("decoder_attention", "decoder_input_ffn"):
            groups[name] = (groups[name][0], 1 / width)
    if filter_mult:
        groups["decoder_output_ffn"] = (groups["decoder_output_ffn"][0], 1 / filter_mult)
    # --- build ---
    norm_class = get_norm(norm_type)

    def norm(size: int) -> nn.Module:
        return norm_class(size, eps=layer_norm_epsilon)

    attention_dropout_rate = dropout_rate if attention_dropout_rate is None else attention_dropout_rate
    layers = []
    for _ in range(num_hidden_layers):
        attention = MultiheadAttention(
            hidden_size, num_heads, inner_dim=attention_inner_dim, num_kv_groups=num_kv_groups,
            dropout=attention_dropout_rate, use_projection_bias=use_projection_bias_in_attention,
            use_ffn_bias=use_ffn_bias_in_attention, attention_type=attention_type,
            scale_qk_dot_by_d=scale_qk_dot_by_d, attention_logits_alpha=attention_logits_alpha or 1.0,
            scale_qk_dot_by_layer_idx=scale_qk_dot_by_layer_idx, logit_softcapping=attention_logit_softcapping,
            softmax_fp32=attention_softmax_fp32, use_sink_token=use_sink_token, initializer=attn_init,
            output_initializer=out_init)
        if moe_cfg.enabled:
            ffn = SparseMoEBlock(moe_cfg, hidden_size, filter_size, nonlinearity, dropout_rate, use_ffn_bias, ffn_init,
                                 ffn_out_init, gate_init)
        else:
            ffn = FeedForwardNetwork(hidden_size, filter_size, nonlinearity, dropout_rate, use_ffn_bias, ffn_init,
                                     ffn_out_init)
        layers.append(TransformerDecoderLayer(hidden_size, norm, attention, ffn, dropout_rate, norm_first_sandwich,
                                              parallel=parallel_attention, ffn_norm=untied_layer_norm))
    embedding = EmbeddingLayer(
        vocab_size + num_extra_input_vocab_tokens, hidden_size, max_position_embeddings, position_embedding_type,
        emb_init, position_embedding_offset, num_heads, rotary_dim, rope_theta, alibi_trainable_slopes, attn_init,
        pos_scaling_factor, kind, pos_scaling_extra_args)
    decoder = DecoderLM(
        embedding_layer=embedding, layers=layers, norm=norm, hidden_size=hidden_size, vocab_size=vocab_size,
        embedding_layer_norm=embedding_layer_norm,
        embedding_dropout=dropout_rate if embedding_dropout_rate is None else embedding_dropout_rate,
        embeddings_scale=float(1.0 if embeddings_scale is None else embeddings_scale),
        share_embedding_weights=share_embedding_weights, use_bias_in_output=use_bias_in_output,
        lm_head_std=initializer_range, output_logits_scale=logits_scale,
        final_logit_softcapping=final_logit_softcapping, sliding_window=attention_sliding_window_length,
        sliding_window_every_other_layer=sliding_window_every_other_decoder_layer,
        sliding_window_first=(sliding_window_every_other_decoder_layer
                              and sliding_window_every_other_decoder_layer_pattern == "sliding_window_first"),
        sink_tokens=attention_sink_tokens)
    # the moe section with every default filled in (what the block computes; the HF adapters compare it)
    config.update(rotary_dim=rotary_dim, scale_qk_dot_by_d=scale_qk_dot_by_d, loss_scaling=loss_scaling,
                  loss_weight=loss_weight, num_kv_groups=num_kv_groups, output_logits_scale_applied=logits_scale,
                  moe=asdict(moe_cfg) if moe_cfg.enabled else None)
    return DecoderLMModel(decoder, vocab_size=vocab_size, loss_scaling=loss_scaling, loss_weight=float(loss_weight),
                          compute_eval_metrics=compute_eval_metrics, moe=moe_cfg if moe_cfg.enabled else None,
                          lr_adjustment_groups=groups, config=config)



def model_defaults(model: dict) -> None:
    """The Model Zoo decoders' params defaults (gpt2/utils.py set_defaults): mixed precision is bfloat16."""
    if model.get("mixed_precision"):
        model.setdefault("use_bfloat16", True)


def build_model(**keys: Any) -> DecoderLMModel:
    """Model function of the decoder families (``model.name: gpt2``, ``llama``, ...): :func:`assemble`
    without its family-only arguments, so its parameters, the schema of the ``model:`` keys, are the
    Model Zoo's GPT-2 config keys."""
    return assemble(**keys)


build_model.__signature__ = inspect.signature(assemble).replace(parameters=[
    p for p in inspect.signature(assemble).parameters.values() if p.name not in _FAMILY_ARGS])
build_model.__annotations__ = {k: v for k, v in assemble.__annotations__.items() if k not in _FAMILY_ARGS}
