"""starcoder / santacoder <-> Hugging Face GPTBigCode (``GPTBigCodeForCausalLM``, multi-query), as the
Model Zoo's starcoder converter maps it: ``transformer.wte`` / ``wpe`` -> ``embedding_layer.word_embeddings``
/ ``position_embeddings.embed``; per layer ``ln_1`` / ``ln_2`` -> ``norm1`` / ``norm3``, the fused
``attn.c_attn`` (q: hidden rows, then one head of k and one of v) -> ``proj_q/k/v_dense_layer``,
``attn.c_proj`` -> ``proj_output_dense_layer``, ``mlp.c_fc`` / ``c_proj`` -> ``ffn.ffn.0`` / ``ffn.ffn.1``;
``transformer.ln_f`` -> ``ln_f``. GPTBigCode's ``gelu_pytorch_tanh`` is the tanh GELU, ``gelu_new`` here.
"""

from __future__ import annotations

import torch

from cs_run.errors import CheckpointError
from cs_run.models.common.hf import HFAdapter, Taker, assign, give_renamed

__all__ = ["model_keys_from_hf_config", "from_hf_state_dict", "to_hf_state_dict", "hf_config", "from_hf", "to_hf", "ADAPTER"]

_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_new", "gelu_new": "gelu_new", "gelu": "gelu", "relu": "relu"}
_LAYER = (("ln_1", "norm1"), ("ln_2", "norm3"), ("attn.c_proj", "self_attn.proj_output_dense_layer"),
          ("mlp.c_fc", "ffn.ffn.0.linear_layer"), ("mlp.c_proj", "ffn.ffn.1.linear_layer"))
_TOP = (("transformer.wte", "model.embedding_layer.word_embeddings"),
        ("transformer.wpe", "model.embedding_layer.position_embeddings.embed"), ("transformer.ln_f", "model.ln_f"))
_QKV = ("proj_q_dense_layer", "proj_k_dense_layer", "proj_v_dense_layer")


def model_keys_from_hf_config(cfg: dict, name: str = "starcoder") -> dict:
    if not cfg.get("multi_query", True):
        raise CheckpointError("config.json: multi_query=false: cs-run's starcoder adapter reads multi-query models")
    act = cfg.get("activation_function", "gelu_pytorch_tanh")
    if act not in _ACTIVATIONS:
        raise CheckpointError(f"config.json: activation_function {act!r} has no cs-run equivalent")
    hidden = cfg["n_embd"]
    return {
        "name": name, "vocab_size": cfg["vocab_size"], "hidden_size": hidden, "num_hidden_layers": cfg["n_layer"],
        "num_heads": cfg["n_head"], "filter_size": cfg.get("n_inner") or 4 * hidden,
        "max_position_embeddings": cfg["n_positions"], "position_embedding_type": "learned",
        "attention_module": "multiquery_attention", "extra_attention_params": {"num_kv_groups": 1},
        "attention_type": "scaled_dot_product" if cfg.get("scale_attn_weights", True) else "dot_product",
        "nonlinearity": _ACTIVATIONS[act], "layer_norm_epsilon": cfg["layer_norm_epsilon"],
        "use_projection_bias_in_attention": True, "use_ffn_bias_in_attention": True, "use_ffn_bias": True,
        "use_bias_in_output": False, "share_embedding_weights": bool(cfg.get("tie_word_embeddings", True)),
        "dropout_rate": 0.0, "embedding_dropout_rate": 0.0, "attention_dropout_rate": 0.0,
    }


def from_hf_state_dict(lm, tensors: dict[str, torch.Tensor]) -> None:
    t, have = Taker(tensors, ignore=(".attn.bias", ".attn.masked_bias")), lm.state_dict()
    hidden = lm.config["hidden_size"]
    head_dim = hidden // lm.config["num_heads"]
    out = {**t.renamed(_TOP, have), **t.lm_head(lm)}
    for i in range(lm.config["num_hidden_layers"]):
        h, c = f"transformer.h.{i}.", f"model.transformer_decoder.layers.{i}."
        out.update(t.renamed(_LAYER, have, h, c))
        for kind in ("weight", "bias"):
            for name, part in zip(_QKV, t(f"{h}attn.c_attn.{kind}").split([hidden, head_dim, head_dim])):
                out[f"{c}self_attn.{name}.{kind}"] = part
    t.check_all_used()
    assign(lm, out)


def to_hf_state_dict(lm) -> dict[str, torch.Tensor]:
    sd = lm.state_dict()
    out = {**give_renamed(sd, _TOP), "lm_head.weight": sd["model.lm_head.weight"]}
    for i in range(lm.config["num_hidden_layers"]):
        h, c = f"transformer.h.{i}.", f"model.transformer_decoder.layers.{i}."
        out.update(give_renamed(sd, _LAYER, h, c))
        for kind in ("weight", "bias"):
            out[f"{h}attn.c_attn.{kind}"] = torch.cat([sd[f"{c}self_attn.{n}.{kind}"] for n in _QKV])
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def hf_config(config: dict) -> dict:
    """The HF GPTBigCode ``config.json`` of a model's resolved keys."""
    act = {"gelu_new": "gelu_pytorch_tanh"}.get(config["nonlinearity"], config["nonlinearity"])
    return {
        "architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode", "vocab_size": config["vocab_size"],
        "n_embd": config["hidden_size"], "n_layer": config["num_hidden_layers"], "n_head": config["num_heads"],
        "n_inner": config["filter_size"], "n_positions": config["max_position_embeddings"], "multi_query": True,
        "activation_function": act, "layer_norm_epsilon": config["layer_norm_epsilon"],
        "scale_attn_weights": config["attention_type"] == "scaled_dot_product",
        "tie_word_embeddings": config["share_embedding_weights"], "resid_pdrop": 0.0, "embd_pdrop": 0.0,
        "attn_pdrop": 0.0, "torch_dtype": "float32",
    }


ADAPTER = HFAdapter(model_keys_from_hf_config, hf_config, from_hf_state_dict, to_hf_state_dict)
from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf
