"""The Model Zoo's GPT-J decoder (gptj/gptj_model.py GPTJSubModelConfig + gptj/model.py), which
``gptj``, ``gpt-neox`` and ``falcon`` are: parallel blocks (attention and FFN both read the layer
input, ``use_untied_layer_norm`` gives the FFN its own norm), rotary positions, its own defaults
(``use_ffn_bias: false``, dropout under the name ``residual_dropout_rate``) and initializer rules.
``build_model``'s parameters are those keys with the Model Zoo's defaults; it assembles the shared
decoder LM (:func:`cs_run.models.common.lm.assemble`).
"""

from __future__ import annotations

from typing import Literal, Optional, Union

from cs_run.models.common.activations import ACTIVATIONS
from cs_run.models.common.lm import DecoderLMModel, assemble

__all__ = ["build_model"]

Initializer = Optional[Union[str, dict]]


def build_model(
    hidden_size: int = 768, vocab_size: int = 50257, max_position_embeddings: int = 1024,
    embedding_dropout_rate: Optional[float] = None, share_embedding_weights: bool = True,
    position_embedding_type: Optional[Literal["learned", "fixed", "relative", "rotary"]] = "rotary",
    rotary_dim: Optional[int] = None, rope_theta: float = 10000.0, fold_rope_consts: bool = False,
    num_relative_attention_buckets: Optional[int] = None, num_hidden_layers: int = 12, filter_size: int = 3072,
    residual_dropout_rate: Optional[float] = None, dropout_rate: Optional[float] = None,
    nonlinearity: Literal[tuple(ACTIVATIONS)] = "gelu",
    norm_type: Literal["layernorm", "rmsnorm", "biasless-layernorm", "nonparametric-layernorm"] = "layernorm",
    layer_norm_epsilon: float = 1e-5, use_ffn_bias: bool = False, use_untied_layer_norm: bool = False,
    num_heads: int = 12, attention_module: Literal["aiayn_attention", "multiquery_attention"] = "aiayn_attention",
    attention_sliding_window_length: Optional[int] = None, attention_sink_tokens: Optional[int] = None,
    extra_attention_params: Optional[dict] = None,
    attention_type: Literal["dot_product", "scaled_dot_product"] = "scaled_dot_product",
    attention_dropout_rate: Optional[float] = 0.1, attention_softmax_fp32: bool = True,
    attention_kernel: Optional[str] = None, use_projection_bias_in_attention: bool = True,
    use_ffn_bias_in_attention: bool = True, initializer_range: float = 0.02, use_bias_in_output: bool = False,
    embedding_initializer: Initializer = None, initializer: Initializer = None,
    attention_initializer: Initializer = None, output_layer_initializer: Initializer = None,
    ffn_initializer: Initializer = None, ffn_output_layer_initializer: Initializer = None,
    lr_adjustment_groups: Optional[dict] = None, mup_base_hidden_size: Optional[float] = None,
    mup_base_filter_size: Optional[float] = None, embeddings_scale: Optional[float] = 1.0,
    scale_qk_dot_by_d: bool = False, attention_logits_alpha: Optional[float] = 1.0,
    scale_output_logits_by_d: Optional[bool] = True, output_logits_alpha: Optional[float] = None,
    alibi_trainable_slopes: bool = False, pos_scaling_factor: float = 1.0,
    pos_scaling_type: Literal["linear", "YaRN", "yarn", "longrope"] = "linear",
    pos_scaling_extra_args: Optional[dict] = None, moe: Optional[dict] = None, dtype: Optional[str] = None,
    loss_scaling: Literal["batch_size", "num_tokens", "BATCH_SIZE", "NUM_TOKENS"] = "num_tokens",
    loss_weight: float = 1.0, start_token: Optional[Union[int, list]] = None, loop_dim: int = 1,
    stop_sequences: Optional[Union[int, list]] = None, max_tokens: Optional[int] = None,
    temperature: Optional[float] = None, top_k: Optional[int] = None, top_p: Optional[float] = None,
    compute_eval_metrics: bool = True,
    # Releases 1.7-1.9 (their gpt-neox, gptj and falcon files)
    precision_opt_level: Optional[int] = None,
) -> DecoderLMModel:
    """Model function of ``gptj``, ``gpt-neox`` and ``falcon``. Raises ValueError naming the key."""
    if position_embedding_type == "alibi":
        raise ValueError("position_embedding_type: alibi is not supported by the Model Zoo's gptj")
    if residual_dropout_rate is not None and dropout_rate is not None and residual_dropout_rate != dropout_rate:
        raise ValueError("residual_dropout_rate: dropout_rate names the same value; give one")
    if initializer is not None and attention_initializer is not None:
        raise ValueError("attention_initializer: initializer names the same value; give one")
    dropout = next((v for v in (residual_dropout_rate, dropout_rate) if v is not None), 0.1)
    return assemble(
        vocab_size=vocab_size, max_position_embeddings=max_position_embeddings,
        embedding_dropout_rate=embedding_dropout_rate, position_embedding_type=position_embedding_type,
        hidden_size=hidden_size, share_embedding_weights=share_embedding_weights,
        num_relative_attention_buckets=num_relative_attention_buckets or 32, rotary_dim=rotary_dim,
        rope_theta=rope_theta, fold_rope_consts=fold_rope_consts, num_hidden_layers=num_hidden_layers,
        dropout_rate=dropout, norm_type=norm_type, layer_norm_epsilon=layer_norm_epsilon, num_heads=num_heads,
        attention_type=attention_type, attention_module=attention_module,
        attention_sliding_window_length=attention_sliding_window_length, attention_sink_tokens=attention_sink_tokens,
        extra_attention_params=extra_attention_params, use_projection_bias_in_attention=use_projection_bias_in_attention,
        use_ffn_bias_in_attention=use_ffn_bias_in_attention, attention_dropout_rate=attention_dropout_rate,
        attention_softmax_fp32=attention_softmax_fp32, attention_kernel=attention_kernel, filter_size=filter_size,
        nonlinearity=nonlinearity, use_ffn_bias=use_ffn_bias, use_bias_in_output=use_bias_in_output,
        initializer_range=initializer_range, embedding_initializer=embedding_initializer,
        initializer=initializer if initializer is not None else attention_initializer,
        output_layer_initializer=output_layer_initializer, ffn_initializer=ffn_initializer,
        ffn_output_layer_initializer=ffn_output_layer_initializer, lr_adjustment_groups=lr_adjustment_groups,
        mup_base_hidden_size=mup_base_hidden_size, mup_base_filter_size=mup_base_filter_size,
        embeddings_scale=embeddings_scale, scale_qk_dot_by_d=scale_qk_dot_by_d,
        attention_logits_alpha=attention_logits_alpha, scale_output_logits_by_d=scale_output_logits_by_d,
        output_logits_alpha=output_logits_alpha, alibi_trainable_slopes=alibi_trainable_slopes,
        pos_scaling_factor=pos_scaling_factor, pos_scaling_type=pos_scaling_type,
        pos_scaling_extra_args=pos_scaling_extra_args, moe=moe, dtype=dtype, loss_scaling=loss_scaling,
        loss_weight=loss_weight, start_token=start_token, loop_dim=loop_dim, stop_sequences=stop_sequences,
        max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
        compute_eval_metrics=compute_eval_metrics, precision_opt_level=precision_opt_level,
        parallel_attention=True, untied_layer_norm=use_untied_layer_norm, initializer_rules="gptj")
