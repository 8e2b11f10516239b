"""falcon <-> Hugging Face Falcon (``FalconForCausalLM``), as the Model Zoo's falcon converters map it:
``transformer.word_embeddings`` -> ``embedding_layer.word_embeddings``; per layer ``input_layernorm``
(7B: one norm) -> ``norm1``, or ``ln_attn`` / ``ln_mlp`` (new decoder architecture, 40B/180B) ->
``norm1`` / ``norm3`` (``use_untied_layer_norm``); the fused ``self_attention.query_key_value`` ->
``proj_q/k/v_dense_layer`` (7B multi-query: all q rows, then one k head, one v head; new architecture:
per kv group, its q heads then its k and v head), q and k rows permuted from rotate-half to
interleaved RoPE; ``self_attention.dense`` -> ``proj_output_dense_layer``; ``mlp.dense_h_to_4h`` /
``dense_4h_to_h`` -> ``ffn.ffn.0`` / ``ffn.ffn.1``; ``transformer.ln_f`` -> ``ln_f``.
"""

from __future__ import annotations

import torch

from cs_run.errors import CheckpointError
from cs_run.models.common.hf import HFAdapter, Taker, assign, deinterleave_rotary, give_renamed, interleave_rotary

__all__ = ["model_keys_from_hf_config", "from_hf_state_dict", "to_hf_state_dict", "hf_config", "from_hf", "to_hf", "ADAPTER"]


def model_keys_from_hf_config(cfg: dict) -> dict:
    for key, ok in (("parallel_attn", cfg.get("parallel_attn", True)), ("alibi", not cfg.get("alibi")),
                    ("bias", not cfg.get("bias"))):
        if not ok:
            raise CheckpointError(f"config.json: {key}={cfg.get(key)!r} has no cs-run falcon equivalent")
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    new = bool(cfg.get("new_decoder_architecture"))
    kv = cfg.get("num_kv_heads") or heads if new else (1 if cfg.get("multi_query", True) else heads)
    untied = new and (cfg.get("num_ln_in_parallel_attn") or 2) == 2
    rope = cfg.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
        raise CheckpointError("config.json: rope scaling has no cs-run falcon equivalent here")
    return {
        "name": "falcon", "vocab_size": cfg["vocab_size"], "hidden_size": hidden,
        "num_hidden_layers": cfg["num_hidden_layers"], "num_heads": heads,
        "filter_size": cfg.get("ffn_hidden_size") or 4 * hidden,
        "max_position_embeddings": cfg.get("max_position_embeddings", 2048), "position_embedding_type": "rotary",
        "rotary_dim": hidden // heads, "rope_theta": float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        "attention_module": "multiquery_attention", "extra_attention_params": {"num_kv_groups": kv},
        "use_untied_layer_norm": untied, "nonlinearity": cfg.get("activation", "gelu"),
        "layer_norm_epsilon": cfg["layer_norm_epsilon"], "use_projection_bias_in_attention": False,
        "use_ffn_bias_in_attention": False, "use_ffn_bias": False, "use_bias_in_output": False,
        "share_embedding_weights": bool(cfg.get("tie_word_embeddings", True)), "residual_dropout_rate": 0.0,
        "embedding_dropout_rate": 0.0, "attention_dropout_rate": 0.0,
    }


def _dims(lm) -> tuple[int, int, int]:
    c = lm.config
    return c["num_heads"], c["num_kv_groups"], c["hidden_size"] // c["num_heads"]


def _split(qkv: torch.Tensor, heads: int, kv: int, head_dim: int, grouped: bool) -> list[torch.Tensor]:
    if not grouped:
        return list(qkv.split([heads * head_dim, kv * head_dim, kv * head_dim]))
    g = qkv.reshape(kv, heads // kv + 2, head_dim, -1)
    return [g[:, :-2].reshape(heads * head_dim, -1), g[:, -2].reshape(kv * head_dim, -1),
            g[:, -1].reshape(kv * head_dim, -1)]


def _fuse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, kv: int, head_dim: int,
          grouped: bool) -> torch.Tensor:
    if not grouped:
        return torch.cat([q, k, v])
    parts = [q.reshape(kv, heads // kv, head_dim, -1), k.reshape(kv, 1, head_dim, -1), v.reshape(kv, 1, head_dim, -1)]
    return torch.cat(parts, dim=1).reshape(-1, q.shape[-1])


def _untied(lm) -> bool:
    layers = lm.model.transformer_decoder.layers
    return len(layers) > 0 and layers[0].norm3 is not None


_TOP = (("transformer.word_embeddings", "model.embedding_layer.word_embeddings"), ("transformer.ln_f", "model.ln_f"))
_DENSE = (("self_attention.dense", "self_attn.proj_output_dense_layer"), ("mlp.dense_h_to_4h", "ffn.ffn.0.linear_layer"),
          ("mlp.dense_4h_to_h", "ffn.ffn.1.linear_layer"))


def _layer(lm) -> tuple:
    """Per layer, HF module -> ours, but for the fused qkv: the norms (two when untied) and the dense layers."""
    return ((("ln_attn", "norm1"), ("ln_mlp", "norm3")) if _untied(lm) else (("input_layernorm", "norm1"),)) + _DENSE


def from_hf_state_dict(lm, tensors: dict[str, torch.Tensor]) -> None:
    t, have = Taker(tensors), lm.state_dict()
    heads, kv, head_dim = _dims(lm)
    grouped = "transformer.h.0.ln_attn.weight" in t or kv not in (1, heads)
    out = {**t.renamed(_TOP, have), **t.lm_head(lm)}
    for i in range(lm.config["num_hidden_layers"]):
        h, c = f"transformer.h.{i}.", f"model.transformer_decoder.layers.{i}."
        out.update(t.renamed(_layer(lm), have, h, c))
        q, k, v = _split(t(f"{h}self_attention.query_key_value.weight"), heads, kv, head_dim, grouped)
        out[f"{c}self_attn.proj_q_dense_layer.weight"] = interleave_rotary(q, heads, head_dim)
        out[f"{c}self_attn.proj_k_dense_layer.weight"] = interleave_rotary(k, kv, head_dim)
        out[f"{c}self_attn.proj_v_dense_layer.weight"] = v
    t.check_all_used()
    assign(lm, out)


def to_hf_state_dict(lm, grouped: bool | None = None) -> dict[str, torch.Tensor]:
    """HF Falcon tensors; ``grouped`` (the new decoder architecture's qkv layout) defaults to untied norms
    or a group count other than 1 and num_heads."""
    heads, kv, head_dim = _dims(lm)
    if grouped is None:
        grouped = _untied(lm) or kv not in (1, heads)
    sd = lm.state_dict()
    out = {**give_renamed(sd, _TOP), "lm_head.weight": sd["model.lm_head.weight"]}
    for i in range(lm.config["num_hidden_layers"]):
        h, c = f"transformer.h.{i}.", f"model.transformer_decoder.layers.{i}."
        out.update(give_renamed(sd, _layer(lm), h, c))
        q = deinterleave_rotary(sd[f"{c}self_attn.proj_q_dense_layer.weight"], heads, head_dim)
        k = deinterleave_rotary(sd[f"{c}self_attn.proj_k_dense_layer.weight"], kv, head_dim)
        out[f"{h}self_attention.query_key_value.weight"] = _fuse(q, k, sd[f"{c}self_attn.proj_v_dense_layer.weight"],
                                                                 heads, kv, head_dim, grouped)
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def hf_config(config: dict) -> dict:
    """The HF Falcon ``config.json`` of a model's resolved keys (the new decoder architecture for two norms
    or grouped-query attention, as :func:`to_hf_state_dict` lays out the qkv rows)."""
    heads, kv = config["num_heads"], config["num_kv_groups"] or config["num_heads"]
    untied = bool(config.get("use_untied_layer_norm"))
    new = untied or kv not in (1, heads)
    return {
        "architectures": ["FalconForCausalLM"], "model_type": "falcon", "vocab_size": config["vocab_size"],
        "hidden_size": config["hidden_size"], "num_hidden_layers": config["num_hidden_layers"],
        "num_attention_heads": heads, "num_kv_heads": kv, "new_decoder_architecture": new, "multi_query": kv == 1,
        "num_ln_in_parallel_attn": 2 if untied else 1, "parallel_attn": True, "bias": False, "alibi": False,
        "ffn_hidden_size": config["filter_size"], "activation": config["nonlinearity"],
        "layer_norm_epsilon": config["layer_norm_epsilon"], "rope_theta": config["rope_theta"],
        "max_position_embeddings": config["max_position_embeddings"],
        "tie_word_embeddings": config["share_embedding_weights"], "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "torch_dtype": "float32",
    }


ADAPTER = HFAdapter(model_keys_from_hf_config, hf_config, from_hf_state_dict, to_hf_state_dict)
from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf
