"""gpt-neox <-> Hugging Face GPT-NeoX (``GPTNeoXForCausalLM``), as the Model Zoo's gpt_neox_hf_cs
converter maps it: ``gpt_neox.embed_in`` -> ``embedding_layer.word_embeddings``; per layer
``input_layernorm`` / ``post_attention_layernorm`` -> ``norm1`` / ``norm3`` (untied), the fused
``attention.query_key_value`` (rows per head: q, k, v) -> ``proj_q/k/v_dense_layer`` with the rotary
part of q and k rows permuted from rotate-half to interleaved, ``attention.dense`` ->
``proj_output_dense_layer``, ``mlp.dense_h_to_4h`` / ``dense_4h_to_h`` -> ``ffn.ffn.0`` / ``ffn.ffn.1``;
``gpt_neox.final_layer_norm`` -> ``ln_f``; ``embed_out`` (``lm_head`` in transformers 5) -> ``lm_head``.
"""

from __future__ import annotations

import torch

from cs_run.errors import CheckpointError
from cs_run.models.common.hf import (
    HFAdapter,
    Taker,
    assign,
    deinterleave_rotary,
    fuse_qkv_per_head,
    give_lm_head,
    give_renamed,
    interleave_rotary,
    split_qkv_per_head,
)

__all__ = ["model_keys_from_hf_config", "from_hf_state_dict", "to_hf_state_dict", "hf_config", "from_hf", "to_hf", "ADAPTER"]


def model_keys_from_hf_config(cfg: dict) -> dict:
    """The ``model:`` section (Model Zoo gpt-neox keys) of an HF GPT-NeoX config."""
    if not cfg.get("use_parallel_residual", True):
        raise CheckpointError("config.json: use_parallel_residual=false has no cs-run gpt-neox equivalent")
    rope = cfg.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
        raise CheckpointError("config.json: rope scaling has no cs-run gpt-neox equivalent here")
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    pct = rope.get("partial_rotary_factor", cfg.get("rotary_pct", cfg.get("partial_rotary_factor", 0.25)))
    bias = bool(cfg.get("attention_bias", True))
    return {
        "name": "gpt-neox", "vocab_size": cfg["vocab_size"], "hidden_size": hidden,
        "num_hidden_layers": cfg["num_hidden_layers"], "num_heads": heads, "filter_size": cfg["intermediate_size"],
        "max_position_embeddings": cfg["max_position_embeddings"], "position_embedding_type": "rotary",
        "rotary_dim": int(hidden // heads * pct), "rope_theta": float(rope.get("rope_theta", cfg.get("rotary_emb_base", 10000))),
        "nonlinearity": cfg.get("hidden_act", "gelu"), "layer_norm_epsilon": cfg["layer_norm_eps"],
        "use_untied_layer_norm": True, "use_projection_bias_in_attention": bias, "use_ffn_bias_in_attention": bias,
        "use_ffn_bias": True, "use_bias_in_output": False,
        "share_embedding_weights": bool(cfg.get("tie_word_embeddings", False)),
        "residual_dropout_rate": 0.0, "embedding_dropout_rate": 0.0, "attention_dropout_rate": 0.0,
    }


def _dims(lm) -> tuple[int, int]:
    return lm.config["num_heads"], lm.config["rotary_dim"]


_TOP = (("gpt_neox.embed_in", "model.embedding_layer.word_embeddings"), ("gpt_neox.final_layer_norm", "model.ln_f"))
# per layer: HF module -> ours (weight and bias each, where the model has them)
_LAYER = (("input_layernorm", "norm1"), ("post_attention_layernorm", "norm3"),
          ("attention.dense", "self_attn.proj_output_dense_layer"),
          ("mlp.dense_h_to_4h", "ffn.ffn.0.linear_layer"), ("mlp.dense_4h_to_h", "ffn.ffn.1.linear_layer"))


def from_hf_state_dict(lm, tensors: dict[str, torch.Tensor]) -> None:
    t, have = Taker(tensors, ignore=(".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq")), lm.state_dict()
    heads, rot = _dims(lm)
    out = t.renamed(_TOP, have)
    if not lm.config["share_embedding_weights"]:  # transformers 5 names it lm_head
        out["model.lm_head.weight"] = t("embed_out.weight" if "embed_out.weight" in t else "lm_head.weight")
    for i in range(lm.config["num_hidden_layers"]):
        h, c = f"gpt_neox.layers.{i}.", f"model.transformer_decoder.layers.{i}."
        out.update(t.renamed(_LAYER, have, h, c))
        for kind in ("weight", "bias"):
            if f"{h}attention.query_key_value.{kind}" not in t:
                continue
            parts = split_qkv_per_head(t(f"{h}attention.query_key_value.{kind}"), heads)
            for j, name in enumerate(("proj_q_dense_layer", "proj_k_dense_layer", "proj_v_dense_layer")):
                out[f"{c}self_attn.{name}.{kind}"] = interleave_rotary(parts[j], heads, rot) if j < 2 else parts[j]
    t.check_all_used()
    assign(lm, out)


def to_hf_state_dict(lm) -> dict[str, torch.Tensor]:
    heads, rot = _dims(lm)
    sd = lm.state_dict()
    out = {**give_renamed(sd, _TOP), **give_lm_head(lm, sd, "embed_out.weight")}
    for i in range(lm.config["num_hidden_layers"]):
        h, c = f"gpt_neox.layers.{i}.", f"model.transformer_decoder.layers.{i}."
        out.update(give_renamed(sd, _LAYER, h, c))
        for kind in ("weight", "bias"):
            names = [f"{c}self_attn.{n}.{kind}" for n in ("proj_q_dense_layer", "proj_k_dense_layer",
                                                          "proj_v_dense_layer")]
            if names[0] not in sd:
                continue
            parts = [deinterleave_rotary(sd[n], heads, rot) if j < 2 else sd[n] for j, n in enumerate(names)]
            out[f"{h}attention.query_key_value.{kind}"] = fuse_qkv_per_head(*parts, heads)
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def hf_config(config: dict) -> dict:
    """The HF GPT-NeoX ``config.json`` of a model's resolved keys."""
    head_dim = config["hidden_size"] // config["num_heads"]
    return {
        "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "vocab_size": config["vocab_size"],
        "hidden_size": config["hidden_size"], "num_hidden_layers": config["num_hidden_layers"],
        "num_attention_heads": config["num_heads"], "intermediate_size": config["filter_size"],
        "max_position_embeddings": config["max_position_embeddings"],
        "rotary_pct": config["rotary_dim"] / head_dim, "partial_rotary_factor": config["rotary_dim"] / head_dim,
        "rotary_emb_base": config["rope_theta"], "rope_theta": config["rope_theta"],
        "hidden_act": config["nonlinearity"], "layer_norm_eps": config["layer_norm_epsilon"],
        "use_parallel_residual": True, "attention_bias": config["use_projection_bias_in_attention"],
        "tie_word_embeddings": config["share_embedding_weights"], "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "torch_dtype": "float32",
    }


ADAPTER = HFAdapter(model_keys_from_hf_config, hf_config, from_hf_state_dict, to_hf_state_dict)
from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf
