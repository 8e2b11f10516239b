"""llama <-> Hugging Face Llama (``LlamaForCausalLM``): the model keys of an HF config and the tensor
map, as the Model Zoo's converter (tools/checkpoint_converters/llama.py) has them.

Names: ``model.embed_tokens`` -> ``embedding_layer.word_embeddings``; per layer ``input_layernorm`` ->
``norm1``, ``post_attention_layernorm`` -> ``norm3``, ``q/k/v/o_proj`` -> ``proj_q/k/v/output_dense_layer``,
``mlp.up_proj`` -> ``ffn.ffn.0.linear_layer``, ``mlp.gate_proj`` -> ``ffn.ffn.0.linear_layer_for_glu``,
``mlp.down_proj`` -> ``ffn.ffn.1.linear_layer``; ``model.norm`` -> ``ln_f``. q and k rows are permuted
from HF's rotate-half RoPE to the Model Zoo's interleaved one. Mistral shares this layout.
"""

from __future__ import annotations

from typing import Callable

import torch

from cs_run.errors import CheckpointError
from cs_run.models.common.hf import HFAdapter, Taker, assign, deinterleave_rotary, give_lm_head, give_renamed, interleave_rotary

__all__ = ["model_keys_from_hf_config", "from_hf_state_dict", "to_hf_state_dict", "LLAMA_NORMS", "hf_config", "from_hf", "to_hf", "ADAPTER"]


def _rope_keys(cfg: dict) -> dict:
    """rope_theta and the scaling keys, from ``rope_parameters`` (transformers 5) or the older
    top-level ``rope_theta`` + ``rope_scaling``."""
    scaling = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = scaling.get("rope_theta", cfg.get("rope_theta", 10000.0))
    return {"rope_theta": float(theta), **_scaling_keys(scaling)}


def _scaling_keys(scaling: dict) -> dict:
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return {}
    if kind == "linear":
        return {"pos_scaling_type": "linear", "pos_scaling_factor": float(scaling["factor"])}
    if kind == "llama3":
        return {"pos_scaling_type": "llama3", "pos_scaling_factor": float(scaling["factor"]),
                "pos_scaling_extra_args": {k: scaling[k] for k in ("low_freq_factor", "high_freq_factor",
                                                                   "original_max_position_embeddings")}}
    raise CheckpointError(f"config.json: rope_scaling type {kind!r} has no cs-run llama equivalent here "
                          "(default, linear, llama3)")


def model_keys_from_hf_config(cfg: dict, name: str = "llama") -> dict:
    """The ``model:`` section (Model Zoo keys) of an HF Llama/Mistral config."""
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    kv = cfg.get("num_key_value_heads") or heads
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"config.json: hidden_act {act!r}: cs-run's llama gates with silu (swiglu)")
    bias = bool(cfg.get("attention_bias", False))
    keys = {
        "name": name, "vocab_size": cfg["vocab_size"], "hidden_size": hidden,
        "num_hidden_layers": cfg["num_hidden_layers"], "num_heads": heads, "filter_size": cfg["intermediate_size"],
        "max_position_embeddings": cfg.get("max_position_embeddings", 2048), "position_embedding_type": "rotary",
        "rotary_dim": int(head_dim * cfg.get("partial_rotary_factor", 1.0)),
        "norm_type": "rmsnorm", "layer_norm_epsilon": cfg.get("rms_norm_eps", 1e-6), "nonlinearity": "swiglu",
        "use_ffn_bias": bool(cfg.get("mlp_bias", False)), "use_projection_bias_in_attention": bias,
        "use_ffn_bias_in_attention": bias, "share_embedding_weights": bool(cfg.get("tie_word_embeddings", False)),
        "dropout_rate": 0.0, "embedding_dropout_rate": 0.0,
        "attention_dropout_rate": float(cfg.get("attention_dropout", 0.0)),
        "attention_type": "scaled_dot_product", "use_bias_in_output": False,
    }
    if head_dim * heads != hidden:
        keys["attention_inner_dim"] = head_dim * heads
    if kv != heads:
        keys.update(attention_module="multiquery_attention", extra_attention_params={"num_kv_groups": kv})
    if cfg.get("sliding_window"):
        keys["attention_sliding_window_length"] = cfg["sliding_window"]
    keys.update(_rope_keys(cfg))
    return keys


def _shape(lm) -> tuple[int, int, int]:
    c = lm.config
    return c["num_heads"], c["num_kv_groups"] or c["num_heads"], c["rotary_dim"]


LLAMA_NORMS = (("input_layernorm", "norm1"), ("post_attention_layernorm", "norm3"))
_MLP = (("up_proj", "ffn.ffn.0.linear_layer"), ("gate_proj", "ffn.ffn.0.linear_layer_for_glu"),
        ("down_proj", "ffn.ffn.1.linear_layer"))


def _take_mlp(t: Taker, lm, h: str, c: str) -> dict[str, torch.Tensor]:
    return t.renamed(_MLP, lm.state_dict(), h + "mlp.", c)


def _give_mlp(sd: dict[str, torch.Tensor], lm, h: str, c: str) -> dict[str, torch.Tensor]:
    return give_renamed(sd, _MLP, h + "mlp.", c)


def from_hf_state_dict(lm, tensors: dict[str, torch.Tensor], norms: tuple = LLAMA_NORMS,
                       norm_offset: float = 0.0, ffn: Callable = _take_mlp) -> None:
    """Copy HF Llama tensors into ``lm`` (a DecoderLMModel built from :func:`model_keys_from_hf_config`).
    ``norms`` maps the layer norms' names; ``norm_offset`` is added to every RMSNorm weight (Gemma's
    norms scale by 1 + weight); ``ffn(t, lm, h, c)`` maps a layer's FFN, HF prefix ``h``, ours ``c``
    (Mixtral's experts)."""
    t = Taker(tensors, ignore=(".rotary_emb.inv_freq",))
    heads, kv, rot = _shape(lm)
    out = {"model.embedding_layer.word_embeddings.weight": t("model.embed_tokens.weight"),
           "model.ln_f.weight": t("model.norm.weight") + norm_offset}
    out.update(t.lm_head(lm))
    for i in range(lm.config["num_hidden_layers"]):
        h, c = f"model.layers.{i}.", f"model.transformer_decoder.layers.{i}."
        for hf, ours in norms:
            out[c + ours + ".weight"] = t(h + hf + ".weight") + norm_offset
        for hf, ours, n in (("q_proj", "proj_q_dense_layer", heads), ("k_proj", "proj_k_dense_layer", kv),
                            ("v_proj", "proj_v_dense_layer", None), ("o_proj", "proj_output_dense_layer", None)):
            for kind in ("weight", "bias"):
                if kind == "bias" and h + f"self_attn.{hf}.bias" not in t:
                    continue
                value = t(h + f"self_attn.{hf}.{kind}")
                out[c + f"self_attn.{ours}.{kind}"] = interleave_rotary(value, n, rot) if n else value
        out.update(ffn(t, lm, h, c))
    t.check_all_used()
    assign(lm, out)


def to_hf_state_dict(lm, norms: tuple = LLAMA_NORMS, norm_offset: float = 0.0,
                     ffn: Callable = _give_mlp) -> dict[str, torch.Tensor]:
    """HF Llama tensors of a llama DecoderLMModel (the inverse of :func:`from_hf_state_dict`; ``ffn(sd, lm,
    h, c)`` gives a layer's FFN tensors of the state dict ``sd``, names without ``model.``)."""
    heads, kv, rot = _shape(lm)
    sd = {k.removeprefix("model."): v.detach() for k, v in lm.state_dict().items()}
    out = {"model.embed_tokens.weight": sd["embedding_layer.word_embeddings.weight"],
           "model.norm.weight": sd["ln_f.weight"] - norm_offset, **give_lm_head(lm, sd, ours="lm_head.weight")}
    for i in range(lm.config["num_hidden_layers"]):
        h, c = f"model.layers.{i}.", f"transformer_decoder.layers.{i}."
        for hf, ours in norms:
            out[h + hf + ".weight"] = sd[c + ours + ".weight"] - norm_offset
        for hf, ours, n in (("q_proj", "proj_q_dense_layer", heads), ("k_proj", "proj_k_dense_layer", kv),
                            ("v_proj", "proj_v_dense_layer", None), ("o_proj", "proj_output_dense_layer", None)):
            for kind in ("weight", "bias"):
                if c + f"self_attn.{ours}.{kind}" in sd:
                    value = sd[c + f"self_attn.{ours}.{kind}"]
                    out[h + f"self_attn.{hf}.{kind}"] = deinterleave_rotary(value, n, rot) if n else value
        out.update(ffn(sd, lm, h, c))
    return {k: v.contiguous().clone() for k, v in out.items()}


def hf_config(config: dict) -> dict:
    """The HF ``config.json`` (Llama, or Mistral for model.name mistral) of a model's resolved keys."""
    heads = config["num_heads"]
    head_dim = (config["attention_inner_dim"] or config["hidden_size"]) // heads
    mistral = config["name"] == "mistral"
    scaling = None
    if config["pos_scaling_type"] == "llama3":
        scaling = {"rope_type": "llama3", "factor": config["pos_scaling_factor"], **config["pos_scaling_extra_args"]}
    elif config["pos_scaling_factor"] != 1.0:
        scaling = {"rope_type": config["pos_scaling_type"], "factor": config["pos_scaling_factor"]}
    out = {
        "architectures": ["MistralForCausalLM" if mistral else "LlamaForCausalLM"],
        "model_type": "mistral" if mistral else "llama", "vocab_size": config["vocab_size"],
        "hidden_size": config["hidden_size"], "intermediate_size": config["filter_size"],
        "num_hidden_layers": config["num_hidden_layers"], "num_attention_heads": heads,
        "num_key_value_heads": config["num_kv_groups"] or heads, "head_dim": head_dim,
        "max_position_embeddings": config["max_position_embeddings"], "rms_norm_eps": config["layer_norm_epsilon"],
        "hidden_act": "silu", "attention_bias": config["use_projection_bias_in_attention"],
        "mlp_bias": config["use_ffn_bias"], "tie_word_embeddings": config["share_embedding_weights"],
        "rope_theta": config["rope_theta"], "rope_scaling": scaling, "attention_dropout": 0.0,
        "torch_dtype": "float32",
    }
    if mistral or config["attention_sliding_window_length"]:
        out["sliding_window"] = config["attention_sliding_window_length"]
    return out


def _keys(cfg: dict) -> dict:
    return model_keys_from_hf_config(cfg, name="mistral" if cfg.get("model_type") == "mistral" else "llama")


ADAPTER = HFAdapter(_keys, hf_config, from_hf_state_dict, to_hf_state_dict)
from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf
