"""mpt <-> Hugging Face MPT (``MptForCausalLM``), as the Model Zoo's converter
(tools/checkpoint_converters/mpt.py, Releases 2.1-2.3) maps it.

Names: ``transformer.wte`` -> ``embedding_layer.word_embeddings``; per block ``norm_1`` / ``norm_2`` ->
``norm1`` / ``norm3``, the fused ``attn.Wqkv`` (rows: all of q, then k, then v; not per head) ->
``proj_q/k/v_dense_layer``, ``attn.out_proj`` -> ``proj_output_dense_layer``, ``ffn.up_proj`` /
``ffn.down_proj`` -> ``ffn.ffn.0`` / ``ffn.ffn.1``; ``transformer.norm_f`` -> ``ln_f``. ALiBi slopes are
not stored: HF's MPT slopes (``1 / 2**(i * alibi_bias_max / n)``, a non-power-of-two head count taking
the odd then even ones of the next power) are the paper's, which the model computes, for
``alibi_bias_max`` 8. HF adds ``slope * (k - (S - 1))`` where the model adds ``-slope * (q - k)``: the
two differ by a constant per query row, which softmax ignores.

transformers' MPT computes one model whatever its config says: ALiBi, no biases, LayerNorm without
bias, exact GELU, a 4 x d_model FFN, no q/k norm, no clipping, no logit scale. A config.json whose keys
ask for anything else (``attn_config.alibi: false``, ``clip_qkv``, ``qk_ln``, ``alibi_bias_max`` other
than 8, ``no_bias: false``, ``expansion_ratio`` other than 4, ``logit_scale``, ...) describes a model
that transformers does not compute either: one error naming the key. ``softmax_scale`` null or 1.0 map
to ``attention_type`` scaled_dot_product / dot_product, as the Model Zoo's converter maps them.
"""

from __future__ import annotations

import torch

from cs_run.errors import CheckpointError
from cs_run.models.common.hf import HFAdapter, Taker, assign, give_lm_head, give_renamed

__all__ = ["model_keys_from_hf_config", "from_hf_state_dict", "to_hf_state_dict", "hf_config", "from_hf", "to_hf", "ADAPTER"]

_TOP = (("transformer.wte", "model.embedding_layer.word_embeddings"), ("transformer.norm_f", "model.ln_f"))
_LAYER = (("norm_1", "norm1"), ("norm_2", "norm3"), ("attn.out_proj", "self_attn.proj_output_dense_layer"),
          ("ffn.up_proj", "ffn.ffn.0.linear_layer"), ("ffn.down_proj", "ffn.ffn.1.linear_layer"))
_QKV = ("proj_q_dense_layer", "proj_k_dense_layer", "proj_v_dense_layer")
# (key, the one value that converts, what another value means); transformers' MPT ignores all but clip_qkv
_FIXED = (("no_bias", True, "biases"), ("expansion_ratio", 4, "an FFN other than 4 x d_model"),
          ("logit_scale", None, "scaled logits"), ("embedding_fraction", 1.0, "scaled embedding gradients"),
          ("attn_config.alibi", True, "learned positions"), ("attn_config.alibi_bias_max", 8, "other ALiBi slopes"),
          ("attn_config.clip_qkv", None, "q/k/v clipping"), ("attn_config.qk_ln", False, "q/k LayerNorm"),
          ("attn_config.prefix_lm", False, "a prefix-LM mask"),
          ("attn_config.attn_uses_sequence_id", False, "per-sequence masks"),
          ("attn_config.attn_type", "multihead_attention", "multi-query attention"))
_NORMS = ("layernorm", "low_precision_layernorm")


def _attn(cfg: dict) -> dict:
    attn = cfg.get("attn_config") or {}
    return attn if isinstance(attn, dict) else vars(attn)


def model_keys_from_hf_config(cfg: dict) -> dict:
    """The ``model:`` section (Model Zoo mpt keys) of an HF MPT config."""
    attn = _attn(cfg)
    defaults = {"no_bias": True, "expansion_ratio": 4, "logit_scale": None, "embedding_fraction": 1.0}
    attn_defaults = {"alibi": True, "alibi_bias_max": 8, "clip_qkv": None, "qk_ln": False, "prefix_lm": False,
                     "attn_uses_sequence_id": False, "attn_type": "multihead_attention"}
    for key, want, needs in _FIXED:
        section, name = (attn, key.split(".")[1]) if key.startswith("attn_config.") else (cfg, key)
        value = section.get(name, {**defaults, **attn_defaults}[name])
        if value != want:
            raise CheckpointError(f"config.json: {key}: {value!r} means {needs}, which cs-run's mpt does not "
                                  f"compute; only {want!r} converts")
    norm = cfg.get("norm_type", "low_precision_layernorm")
    if norm not in _NORMS:
        raise CheckpointError(f"config.json: norm_type: {norm!r}: transformers' MPT normalizes with LayerNorm; only "
                              f"{' or '.join(_NORMS)} converts")
    scale = attn.get("softmax_scale")
    if scale not in (None, 1.0):
        raise CheckpointError(f"config.json: attn_config.softmax_scale: {scale!r}: only null (1/sqrt(head_dim)) or "
                              "1.0 convert, as in the Model Zoo's converter")
    hidden = cfg["d_model"]
    return {
        "name": "mpt", "vocab_size": cfg["vocab_size"], "hidden_size": hidden, "num_hidden_layers": cfg["n_layers"],
        "num_heads": cfg["n_heads"], "filter_size": 4 * hidden, "max_position_embeddings": cfg["max_seq_len"],
        "position_embedding_type": "alibi", "norm_type": "biasless-layernorm",
        "layer_norm_epsilon": cfg.get("layer_norm_epsilon", 1e-5), "nonlinearity": "gelu",
        "attention_type": "scaled_dot_product" if scale is None else "dot_product",
        "use_projection_bias_in_attention": False, "use_ffn_bias_in_attention": False, "use_ffn_bias": False,
        "use_bias_in_output": False, "share_embedding_weights": bool(cfg.get("tie_word_embeddings", True)),
        "embedding_layer_norm": False, "dropout_rate": 0.0, "embedding_dropout_rate": 0.0,
        "attention_dropout_rate": 0.0,
    }


def from_hf_state_dict(lm, tensors: dict[str, torch.Tensor]) -> None:
    """Copy HF MPT tensors into ``lm`` (a DecoderLMModel built from :func:`model_keys_from_hf_config`)."""
    t, have = Taker(tensors), lm.state_dict()
    out = {**t.renamed(_TOP, have), **t.lm_head(lm)}
    for i in range(lm.config["num_hidden_layers"]):
        h, c = f"transformer.blocks.{i}.", f"model.transformer_decoder.layers.{i}."
        out.update(t.renamed(_LAYER, have, h, c))
        for name, part in zip(_QKV, t(h + "attn.Wqkv.weight").chunk(3, dim=0)):
            out[c + f"self_attn.{name}.weight"] = part
    t.check_all_used()
    assign(lm, out)


def to_hf_state_dict(lm) -> dict[str, torch.Tensor]:
    """HF MPT tensors of an mpt DecoderLMModel (the inverse of :func:`from_hf_state_dict`)."""
    sd = lm.state_dict()
    out = {**give_renamed(sd, _TOP), **give_lm_head(lm, sd)}
    for i in range(lm.config["num_hidden_layers"]):
        h, c = f"transformer.blocks.{i}.", f"model.transformer_decoder.layers.{i}."
        out.update(give_renamed(sd, _LAYER, h, c))
        out[h + "attn.Wqkv.weight"] = torch.cat([sd[c + f"self_attn.{name}.weight"] for name in _QKV])
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def hf_config(config: dict) -> dict:
    """The HF MPT ``config.json`` of a model's resolved keys (the one model transformers' MPT computes;
    anything else comes back different and is refused by name)."""
    return {
        "architectures": ["MptForCausalLM"], "model_type": "mpt", "vocab_size": config["vocab_size"],
        "d_model": config["hidden_size"], "n_heads": config["num_heads"], "n_layers": config["num_hidden_layers"],
        "expansion_ratio": 4, "max_seq_len": config["max_position_embeddings"],
        "layer_norm_epsilon": config["layer_norm_epsilon"], "no_bias": True, "learned_pos_emb": False,
        "norm_type": "low_precision_layernorm", "logit_scale": None, "embedding_fraction": 1.0,
        "tie_word_embeddings": config["share_embedding_weights"], "resid_pdrop": 0.0, "emb_pdrop": 0.0,
        "attn_config": {"attn_type": "multihead_attention", "attn_pdrop": 0,  # an int in MptAttentionConfig "attn_impl": "torch",
                        "softmax_scale": None if config["attention_type"] == "scaled_dot_product" else 1.0,
                        "alibi": True, "alibi_bias_max": 8, "clip_qkv": None, "qk_ln": False, "prefix_lm": False,
                        "attn_uses_sequence_id": False},
        "torch_dtype": "float32",
    }


ADAPTER = HFAdapter(model_keys_from_hf_config, hf_config, from_hf_state_dict, to_hf_state_dict)
from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf
