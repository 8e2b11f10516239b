"""gptj <-> Hugging Face GPT-J (``GPTJForCausalLM``), as the Model Zoo's gptj_hf_cs converter maps it:
``transformer.wte`` -> ``embedding_layer.word_embeddings``; per layer ``ln_1`` -> ``norm1``,
``attn.q/k/v_proj`` -> ``proj_q/k/v_dense_layer``, ``attn.out_proj`` -> ``proj_output_dense_layer``,
``mlp.fc_in`` / ``mlp.fc_out`` -> ``ffn.ffn.0`` / ``ffn.ffn.1.linear_layer``; ``transformer.ln_f`` ->
``ln_f``. GPT-J's rotary is already interleaved (rotate_every_two), so rows map as they are.
"""

from __future__ import annotations

import torch

from cs_run.errors import CheckpointError
from cs_run.models.common.hf import HFAdapter, Taker, assign, give_renamed

__all__ = ["model_keys_from_hf_config", "from_hf_state_dict", "to_hf_state_dict", "hf_config", "from_hf", "to_hf", "ADAPTER"]

_LAYER = (("ln_1", "norm1"), ("attn.q_proj", "self_attn.proj_q_dense_layer"),
          ("attn.k_proj", "self_attn.proj_k_dense_layer"), ("attn.v_proj", "self_attn.proj_v_dense_layer"),
          ("attn.out_proj", "self_attn.proj_output_dense_layer"), ("mlp.fc_in", "ffn.ffn.0.linear_layer"),
          ("mlp.fc_out", "ffn.ffn.1.linear_layer"))
_TOP = (("transformer.wte", "model.embedding_layer.word_embeddings"), ("transformer.ln_f", "model.ln_f"),
        ("lm_head", "model.lm_head"))


def model_keys_from_hf_config(cfg: dict) -> dict:
    """The ``model:`` section (Model Zoo gptj keys) of an HF GPT-J config."""
    hidden = cfg["n_embd"]
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
    return {
        "name": "gptj", "vocab_size": cfg["vocab_size"], "hidden_size": hidden, "num_hidden_layers": cfg["n_layer"],
        "num_heads": cfg["n_head"], "filter_size": cfg.get("n_inner") or 4 * hidden,
        "max_position_embeddings": cfg["n_positions"], "position_embedding_type": "rotary",
        "rotary_dim": cfg["rotary_dim"] or hidden // cfg["n_head"], "rope_theta": float(theta),
        "nonlinearity": cfg.get("activation_function", "gelu_new"), "layer_norm_epsilon": cfg["layer_norm_epsilon"],
        "use_projection_bias_in_attention": False, "use_ffn_bias_in_attention": False, "use_ffn_bias": True,
        "use_bias_in_output": True, "share_embedding_weights": bool(cfg.get("tie_word_embeddings", False)),
        "residual_dropout_rate": 0.0, "embedding_dropout_rate": 0.0, "attention_dropout_rate": 0.0,
    }


def from_hf_state_dict(lm, tensors: dict[str, torch.Tensor]) -> None:
    t = Taker(tensors, ignore=(".attn.bias", ".attn.masked_bias", ".embed_positions"))
    if lm.config["share_embedding_weights"]:
        raise CheckpointError("gptj: tied embeddings are not a GPT-J checkpoint layout")
    have = lm.state_dict()
    out = t.renamed(_TOP, have)
    for i in range(lm.config["num_hidden_layers"]):
        out.update(t.renamed(_LAYER, have, f"transformer.h.{i}.", f"model.transformer_decoder.layers.{i}."))
    t.check_all_used()
    assign(lm, out)


def to_hf_state_dict(lm) -> dict[str, torch.Tensor]:
    sd = lm.state_dict()
    out = give_renamed(sd, _TOP)
    for i in range(lm.config["num_hidden_layers"]):
        out.update(give_renamed(sd, _LAYER, f"transformer.h.{i}.", f"model.transformer_decoder.layers.{i}."))
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def hf_config(config: dict) -> dict:
    """The HF GPT-J ``config.json`` of a model's resolved keys (HF's GPT-J rotary base is 10000)."""
    return {
        "architectures": ["GPTJForCausalLM"], "model_type": "gptj", "vocab_size": config["vocab_size"],
        "n_embd": config["hidden_size"], "n_layer": config["num_hidden_layers"], "n_head": config["num_heads"],
        "n_inner": config["filter_size"], "n_positions": config["max_position_embeddings"],
        "rotary_dim": config["rotary_dim"], "activation_function": config["nonlinearity"],
        "layer_norm_epsilon": config["layer_norm_epsilon"], "tie_word_embeddings": config["share_embedding_weights"],
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "torch_dtype": "float32",
    }


ADAPTER = HFAdapter(model_keys_from_hf_config, hf_config, from_hf_state_dict, to_hf_state_dict)
from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf
