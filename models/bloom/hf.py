"""bloom <-> Hugging Face BLOOM (``BloomForCausalLM``), as the Model Zoo's bloom_hf_cs converter maps it:
``word_embeddings`` -> ``embedding_layer.word_embeddings``, ``word_embeddings_layernorm`` ->
``embedding_ln_f``; per layer ``input_layernorm`` / ``post_attention_layernorm`` -> ``norm1`` /
``norm3``, the fused ``self_attention.query_key_value`` (rows per head: q, k, v) ->
``proj_q/k/v_dense_layer``, ``self_attention.dense`` -> ``proj_output_dense_layer``,
``mlp.dense_h_to_4h`` / ``dense_4h_to_h`` -> ``ffn.ffn.0`` / ``ffn.ffn.1``; ``ln_f``. ALiBi slopes are not
stored by HF: the model's own fixed slopes are the paper's, as BLOOM's.

BLOOM's GELU is the tanh approximation written as ``gelu_fast`` here (same formula); the Model Zoo's
bloom files say ``gelu`` (erf), an approximation its converter accepts and this adapter does not.
"""

from __future__ import annotations

import torch

from cs_run.errors import CheckpointError
from cs_run.models.common.hf import HFAdapter, Taker, assign, fuse_qkv_per_head, give_renamed, split_qkv_per_head

__all__ = ["model_keys_from_hf_config", "from_hf_state_dict", "to_hf_state_dict", "hf_config", "from_hf", "to_hf", "ADAPTER"]

_LAYER = (("input_layernorm", "norm1"), ("post_attention_layernorm", "norm3"),
          ("self_attention.dense", "self_attn.proj_output_dense_layer"),
          ("mlp.dense_h_to_4h", "ffn.ffn.0.linear_layer"), ("mlp.dense_4h_to_h", "ffn.ffn.1.linear_layer"))
_TOP = (("transformer.word_embeddings", "model.embedding_layer.word_embeddings"),
        ("transformer.word_embeddings_layernorm", "model.embedding_ln_f"), ("transformer.ln_f", "model.ln_f"))
_QKV = ("proj_q_dense_layer", "proj_k_dense_layer", "proj_v_dense_layer")


def model_keys_from_hf_config(cfg: dict) -> dict:
    """The ``model:`` section (Model Zoo bloom keys) of an HF BLOOM config."""
    if cfg.get("apply_residual_connection_post_layernorm"):
        raise CheckpointError("config.json: apply_residual_connection_post_layernorm=true has no cs-run equivalent")
    hidden = cfg.get("hidden_size", cfg.get("n_embed"))
    return {
        "name": "bloom", "vocab_size": cfg["vocab_size"], "hidden_size": hidden, "num_hidden_layers": cfg["n_layer"],
        "num_heads": cfg["n_head"], "filter_size": 4 * hidden, "max_position_embeddings": cfg.get("seq_length", 2048),
        "position_embedding_type": "alibi", "embedding_layer_norm": True, "nonlinearity": "gelu_fast",
        "layer_norm_epsilon": cfg["layer_norm_epsilon"], "use_projection_bias_in_attention": True,
        "use_ffn_bias_in_attention": True, "use_ffn_bias": True, "use_bias_in_output": False,
        "share_embedding_weights": bool(cfg.get("tie_word_embeddings", True)), "dropout_rate": 0.0,
        "embedding_dropout_rate": 0.0, "attention_dropout_rate": 0.0,
    }


def from_hf_state_dict(lm, tensors: dict[str, torch.Tensor]) -> None:
    t, have = Taker(tensors), lm.state_dict()
    heads = lm.config["num_heads"]
    out = {**t.renamed(_TOP, have), **t.lm_head(lm)}
    for i in range(lm.config["num_hidden_layers"]):
        h, c = f"transformer.h.{i}.", f"model.transformer_decoder.layers.{i}."
        out.update(t.renamed(_LAYER, have, h, c))
        for kind in ("weight", "bias"):
            for name, part in zip(_QKV, split_qkv_per_head(t(f"{h}self_attention.query_key_value.{kind}"), heads)):
                out[f"{c}self_attn.{name}.{kind}"] = part
    t.check_all_used()
    assign(lm, out)


def to_hf_state_dict(lm) -> dict[str, torch.Tensor]:
    heads, sd = lm.config["num_heads"], lm.state_dict()
    out = {**give_renamed(sd, _TOP), "lm_head.weight": sd["model.lm_head.weight"]}
    for i in range(lm.config["num_hidden_layers"]):
        h, c = f"transformer.h.{i}.", f"model.transformer_decoder.layers.{i}."
        out.update(give_renamed(sd, _LAYER, h, c))
        for kind in ("weight", "bias"):
            out[f"{h}self_attention.query_key_value.{kind}"] = fuse_qkv_per_head(
                *(sd[f"{c}self_attn.{n}.{kind}"] for n in _QKV), heads)
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def hf_config(config: dict) -> dict:
    """The HF BLOOM ``config.json`` of a model's resolved keys (``seq_length`` carries the positions)."""
    return {
        "architectures": ["BloomForCausalLM"], "model_type": "bloom", "vocab_size": config["vocab_size"],
        "hidden_size": config["hidden_size"], "n_layer": config["num_hidden_layers"], "n_head": config["num_heads"],
        "layer_norm_epsilon": config["layer_norm_epsilon"], "seq_length": config["max_position_embeddings"],
        "tie_word_embeddings": config["share_embedding_weights"], "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "apply_residual_connection_post_layernorm": False, "torch_dtype": "float32",
    }


ADAPTER = HFAdapter(model_keys_from_hf_config, hf_config, from_hf_state_dict, to_hf_state_dict)
from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf
