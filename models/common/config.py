"""The decoder families' ``model:`` keys, declared once as typed dataclasses: each field is a key, its type
and default are the Model Zoo's, its metadata the release that introduced it (``since``) and what it means
(``doc``). The params check (:func:`cs_run.registry.check_config_keys`), the builders, the Hugging Face
adapters (through the builder) and ``docs/models.md`` (:func:`config_table`) all read these classes.

:class:`DecoderConfig` is the Model Zoo's GPT-2 config (Release 2.10 ``gpt2/gpt2_model.py``
GPT2LMHeadModelConfig and ``gpt2/model.py`` GPT2ModelConfig), which every sequential-block family is
under its own name; the GPT-J config (gptj, gpt-neox, falcon: ``models/common/parallel.py``) shares the
keys of :class:`BaseDecoderConfig` and has its own defaults and a few keys of its own.

``since`` is the first mirrored Model Zoo tag (R_1.6.0 is the oldest, so "1.6.0" means that release or
earlier) whose gpt2/gptj model code, layers or decoder params files name the key (a ``git grep -w`` of
each tag of github:Cerebras/modelzoo).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from cs_run.models.common.activations import ACTIVATIONS

__all__ = ["BaseDecoderConfig", "DecoderConfig", "key", "config_fields", "config_signature", "config_table", "Initializer", "NormType",
           "Activation"]

Initializer = Optional[Union[str, dict]]
NormType = Literal["layernorm", "rmsnorm", "biasless-layernorm", "nonparametric-layernorm"]
Activation = Literal[tuple(ACTIVATIONS)]
PositionType = Optional[Literal["learned", "fixed", "relative", "rotary", "alibi"]]
ScalingType = Literal["linear", "YaRN", "yarn", "llama3", "longrope"]
LossScaling = Literal["batch_size", "num_tokens", "BATCH_SIZE", "NUM_TOKENS"]


def key(default: Any, since: str, doc: str) -> Any:
    """A ``model:`` key's field: its default, the Model Zoo release that introduced it and its meaning. A list
    or dict default is copied for each config (a dataclass refuses a shared mutable default)."""
    metadata = {"since": since, "doc": doc}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(kw_only=True)
class BaseDecoderConfig:
    """The keys both Model Zoo decoders (GPT-2's and GPT-J's) take, with GPT-2's defaults."""

    # sizes and embeddings
    vocab_size: int = key(50257, "1.6.0", "vocabulary size (<= 512000)")
    hidden_size: int = key(768, "1.6.0", "model width")
    num_hidden_layers: int = key(12, "1.6.0", "decoder layers")
    num_heads: int = key(12, "1.6.0", "attention heads")
    filter_size: int = key(3072, "1.6.0", "FFN inner width")
    max_position_embeddings: int = key(1024, "1.6.0", "longest sequence")
    embedding_dropout_rate: Optional[float] = key(None, "1.7.0", "dropout after the embeddings; None: dropout_rate")
    position_embedding_type: PositionType = key("learned", "1.6.0", "learned, fixed (sinusoidal), rotary or alibi")
    share_embedding_weights: bool = key(True, "1.6.0", "tie the LM head to the token embedding")
    num_relative_attention_buckets: int = key(32, "1.6.0", "T5-style relative buckets (encoders; refused here)")
    rotary_dim: Optional[int] = key(None, "1.7.0", "rotated dims per head; None: a quarter of the head width")
    rope_theta: float = key(10000.0, "2.1.0", "rotary base")
    fold_rope_consts: bool = key(False, "2.4.0", "Cerebras compile-time rotary tables; no effect here")
    # decoder
    dropout_rate: float = key(0.1, "1.6.0", "residual and FFN dropout")
    norm_type: NormType = key("layernorm", "1.7.0", "the layers' norm")
    layer_norm_epsilon: float = key(1e-5, "1.6.0", "the norms' epsilon")
    # attention
    attention_type: Literal["dot_product", "scaled_dot_product"] = key(
        "scaled_dot_product", "1.6.0", "scaled_dot_product divides the scores by sqrt(head width)")
    attention_module: Literal["aiayn_attention", "multiquery_attention"] = key(
        "aiayn_attention", "1.9.1", "multiquery_attention groups keys and values (extra_attention_params)")
    attention_sliding_window_length: Optional[int] = key(None, "2.1.0", "sliding-window attention span")
    attention_sink_tokens: Optional[int] = key(None, "2.4.0", "first tokens every window also sees")
    extra_attention_params: Optional[dict] = key(None, "1.7.0", "num_kv_groups: key/value groups")
    use_projection_bias_in_attention: bool = key(True, "1.6.0", "biases of the q/k/v projections")
    use_ffn_bias_in_attention: bool = key(True, "1.6.0", "bias of the attention output projection")
    attention_dropout_rate: Optional[float] = key(None, "1.6.0", "attention-probability dropout; None: dropout_rate")
    attention_softmax_fp32: bool = key(True, "1.7.0", "softmax in float32 under mixed precision")
    attention_kernel: Optional[str] = key(None, "1.8.0", "a Cerebras attention kernel; same attention here")
    # ffn and head
    nonlinearity: Activation = key("gelu", "1.6.0", "FFN activation (a *glu name gates)")
    use_ffn_bias: bool = key(True, "1.6.0", "FFN biases")
    use_bias_in_output: bool = key(False, "1.6.0", "bias of the LM head")
    # initializers
    initializer_range: float = key(0.02, "1.6.0", "std of the default truncated-normal initializers")
    embedding_initializer: Initializer = key(None, "1.7.0", "token (and position) embedding initializer")
    initializer: Initializer = key(None, "1.6.0", "attention projections' initializer")
    output_layer_initializer: Initializer = key(None, "1.6.0", "attention output projection's initializer")
    ffn_initializer: Initializer = key(None, "1.6.0", "FFN input projection's initializer")
    ffn_output_layer_initializer: Initializer = key(None, "1.7.0", "FFN output projection's initializer")
    # muP
    lr_adjustment_groups: Optional[dict] = key(None, "2.3.0", "custom muP LR groups (refused: the defaults apply)")
    mup_base_hidden_size: Optional[float] = key(None, "2.3.0", "muP base width (with mup_base_filter_size)")
    mup_base_filter_size: Optional[float] = key(None, "2.3.0", "muP base FFN width")
    embeddings_scale: Optional[float] = key(1.0, "1.9.1", "factor on the embeddings' output")
    scale_qk_dot_by_d: Optional[bool] = key(None, "1.9.1", "scores / head width, not its root; None: muP on")
    attention_logits_alpha: Optional[float] = key(1.0, "2.3.0", "factor on the attention scores")
    scale_output_logits_by_d: Optional[bool] = key(True, "2.3.0", "muP logits / width (else / sqrt(width))")
    output_logits_alpha: Optional[float] = key(None, "2.3.0", "muP factor on the output logits")
    # position scaling
    alibi_trainable_slopes: bool = key(False, "1.8.0", "train the ALiBi slopes")
    pos_scaling_factor: float = key(1.0, "2.1.0", "rotary/alibi position scaling factor")
    pos_scaling_type: ScalingType = key("linear", "2.3.1", "rotary scaling rule")
    pos_scaling_extra_args: Optional[dict] = key(None, "2.3.1", "the scaling rule's arguments")
    moe: Optional[dict] = key(None, "2.3.0", "mixture-of-experts section (num_experts, top_k, ...)")
    dtype: Optional[str] = key(None, "1.6.0", "embedding dtype (refused: it follows the run's precision)")
    # loss, inference, metrics
    loss_scaling: LossScaling = key("num_tokens", "1.7.0", "loss / unmasked tokens, or / batch size * loss_weight")
    loss_weight: float = key(1.0, "1.6.0", "factor of batch_size loss scaling")
    start_token: Optional[Union[int, list]] = key(None, "2.2.0", "inference: first token(s)")
    loop_dim: int = key(1, "2.2.0", "inference: the sequence dimension")
    stop_sequences: Optional[Union[int, list]] = key(None, "2.2.0", "inference: sequences that end generation")
    max_tokens: Optional[int] = key(None, "2.2.0", "inference: tokens to generate")
    temperature: Optional[float] = key(None, "2.3.0", "inference: sampling temperature")
    top_k: Optional[int] = key(None, "2.3.0", "inference: top-k sampling")
    top_p: Optional[float] = key(None, "2.3.0", "inference: nucleus sampling")
    compute_eval_metrics: bool = key(True, "1.6.0", "eval accuracy and perplexity")
    precision_opt_level: Optional[int] = key(None, "1.7.0", "Cerebras compiler precision level; no effect here")


@dataclass(kw_only=True)
class DecoderConfig(BaseDecoderConfig):
    """The Model Zoo's GPT-2 decoder config: every sequential-block family (gpt2, gpt3, llama, mistral,
    mixtral, gemma2, bloom, mpt, jais, btlm, starcoder, santacoder) is this config under its own name."""

    num_extra_input_vocab_tokens: int = key(0, "2.5.0", "input-only tokens beyond vocab_size")
    constant_pos_embedding: Optional[int] = key(None, "2.3.0", "multimodal constant positions (refused)")
    position_embedding_offset: int = key(0, "2.0.2", "offset of learned positions")
    embedding_layer_norm: bool = key(False, "1.8.0", "a norm after the embeddings (BLOOM)")
    sliding_window_every_other_decoder_layer: bool = key(False, "2.3.1", "sliding windows on every other layer")
    sliding_window_every_other_decoder_layer_pattern: Optional[
        Literal["sliding_window_first", "full_attention_first"]] = key(
        "full_attention_first", "2.10.0", "which layer of each pair has the window")
    attention_vertical_column_spacing: Optional[int] = key(None, "2.4.0", "vertical-column sparse mask (refused)")
    attention_vertical_column_width: Optional[int] = key(None, "2.4.0", "vertical-column sparse mask (refused)")
    attention_chunk_size: Optional[int] = key(None, "2.4.0", "chunked attention mask (refused)")
    attention_qk_norm_layer: Optional[str] = key(None, "2.5.0", "q/k norms (refused)")
    attention_qk_norm_eps: float = key(1e-5, "2.5.0", "q/k norms' epsilon")
    extra_ffn_params: Optional[dict] = key(None, "2.3.0", "FFN variants (refused)")
    attention_inner_dim: Optional[int] = key(None, "1.7.0", "q/k/v width; None: hidden_size")
    attention_logit_softcapping: Optional[float] = key(None, "2.3.1", "tanh cap on attention scores (Gemma 2)")
    fixed_sparse_attention: Optional[dict] = key(None, "1.7.0", "fixed sparse attention mask (refused)")
    memory_tokens: Optional[dict] = key(None, "2.4.0", "memory tokens (refused when enabled)")
    use_experimental_flex_api: bool = key(False, "2.5.0", "Cerebras mask sparsity hint; same mask here")
    use_sink_token: bool = key(False, "2.10.0", "a learned sink logit in every softmax")
    output_logits_scale: Optional[float] = key(None, "1.9.1", "deprecated muP logits factor")
    cross_attention_layers: Optional[list] = key(None, "2.5.0", "multimodal cross-attention layers (refused)")
    rel_distance_mode: Literal["default", "capped", "grouped"] = key("default", "2.4.0", "RoPE distance mode")
    rel_distance_extra_args: Optional[dict] = key(None, "2.4.0", "its arguments")
    scale_qk_dot_by_layer_idx: bool = key(False, "2.0.2", "scores / (layer index + 1)")
    norm_first_sandwich: bool = key(False, "2.3.1", "norms after attention and FFN too (Gemma 2)")
    final_logit_softcapping: Optional[float] = key(None, "2.3.1", "tanh cap on the output logits (Gemma 2)")
    boundary_casting: Optional[bool] = key(False, "1.7.0", "Cerebras precision boundary; no effect here")
    # Release 1.x spellings
    use_position_embedding: bool = key(True, "1.6.0", "false: position_embedding_type null (Release 1.x)")
    use_rms_norm: Optional[bool] = key(None, "1.9.1", "true: norm_type rmsnorm (Release 1.9)")
    allow_multireplica: Optional[bool] = key(None, "1.6.1", "Cerebras multi-replica; no effect here")
    alibi_implementation: Optional[Literal["expand", "embedding"]] = key(None, "1.8.0", "same ALiBi bias either way")
    tf_summary: Optional[bool] = key(None, "1.7.0", "read by no Model Zoo PyTorch code; no effect")
    scale_by_layer_index: Optional[bool] = key(None, "2.1.0", "read by no Model Zoo code; no effect")


def config_fields(config_class: type) -> dict[str, dataclasses.Field]:
    """A config class's keys (name -> field), in declaration order."""
    return {f.name: f for f in dataclasses.fields(config_class)}


def config_signature(config_class: type) -> inspect.Signature:
    """A model function's signature: one keyword-only parameter per key of ``config_class`` (its default and
    type), so that the registry checks a params file's ``model:`` keys against the config class they build."""
    return inspect.Signature([
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY,
                          default=f.default if f.default is not dataclasses.MISSING else f.default_factory(),
                          annotation=f.type) for f in dataclasses.fields(config_class)])


def _type_text(hint: Any) -> str:
    text = str(hint).replace("typing.", "").replace("NoneType", "None")
    return text.replace("<class '", "").replace("'>", "")


def config_table(config_class: type) -> str:
    """A markdown table of a config class's keys: type, default, release, meaning (for docs/models.md)."""
    hints = typing.get_type_hints(config_class)
    rows = ["| key | type | default | since | meaning |", "|---|---|---|---|---|"]
    for name, f in config_fields(config_class).items():
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # a list's copy
        rows.append(f"| `{name}` | `{_type_text(hints[name])}` | `{default!r}` | {f.metadata.get('since', '')} "
                    f"| {f.metadata.get('doc', '')} |")
    return "\n".join(rows) + "\n"
