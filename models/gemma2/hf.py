"""gemma2 <-> Hugging Face Gemma 2 (``Gemma2ForCausalLM``), as the Model Zoo's gemma2 converter maps
it: Llama's names for attention and MLP, four norms per layer (``input_layernorm`` -> ``norm1``,
``post_attention_layernorm`` -> ``norm1_post``, ``pre_feedforward_layernorm`` -> ``norm3``,
``post_feedforward_layernorm`` -> ``norm3_post``: sandwich norms), every RMSNorm weight plus one (Gemma
scales by 1 + weight). Keys: embeddings times sqrt(hidden_size), attention logits and final logits
softcapped, sliding windows on every other layer starting with the first, and
``attention_logits_alpha = sqrt(head_dim / query_pre_attn_scalar)`` where the two differ.
"""

from __future__ import annotations

import torch

from cs_run.errors import CheckpointError
from cs_run.models.common.hf import HFAdapter
from cs_run.models.llama import hf as llama_hf

__all__ = ["model_keys_from_hf_config", "from_hf_state_dict", "to_hf_state_dict", "hf_config", "from_hf", "to_hf", "ADAPTER"]

NORMS = (("input_layernorm", "norm1"), ("post_attention_layernorm", "norm1_post"),
         ("pre_feedforward_layernorm", "norm3"), ("post_feedforward_layernorm", "norm3_post"))
_ACTIVATIONS = {"gelu": "geglu", "gelu_pytorch_tanh": "geglu_tanh"}
"""HF hidden_activation -> nonlinearity. gelu_pytorch_tanh (transformers' default, every published Gemma 2)
has no Model Zoo GLU (the vendor's converter makes it the erf geglu, a different model): geglu_tanh is exact."""


def model_keys_from_hf_config(cfg: dict) -> dict:
    act = cfg.get("hidden_activation") or cfg.get("hidden_act")
    if act not in _ACTIVATIONS:
        raise CheckpointError(f"config.json: hidden_activation {act!r}: gemma2 gates with geglu (erf GELU) or "
                              f"geglu_tanh (gelu_pytorch_tanh); only {' and '.join(map(repr, _ACTIVATIONS))} "
                              "convert exactly")
    layer_types = cfg.get("layer_types") or []
    if layer_types and layer_types[0] != "sliding_attention":
        raise CheckpointError("config.json: layer_types must alternate starting with sliding_attention")
    keys = llama_hf.model_keys_from_hf_config({**cfg, "hidden_act": "silu"}, name="gemma2")
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    keys.update(nonlinearity=_ACTIVATIONS[act], embeddings_scale=cfg["hidden_size"] ** 0.5, norm_first_sandwich=True,
                attention_logit_softcapping=cfg.get("attn_logit_softcapping"),
                final_logit_softcapping=cfg.get("final_logit_softcapping"), share_embedding_weights=True,
                sliding_window_every_other_decoder_layer=True,
                sliding_window_every_other_decoder_layer_pattern="sliding_window_first")
    scalar = cfg.get("query_pre_attn_scalar", head_dim)
    if scalar != head_dim:
        keys["attention_logits_alpha"] = (head_dim / scalar) ** 0.5
    return keys


def from_hf_state_dict(lm, tensors: dict[str, torch.Tensor]) -> None:
    llama_hf.from_hf_state_dict(lm, tensors, norms=NORMS, norm_offset=1.0)


def to_hf_state_dict(lm) -> dict[str, torch.Tensor]:
    return llama_hf.to_hf_state_dict(lm, norms=NORMS, norm_offset=1.0)


def hf_config(config: dict) -> dict:
    """The HF Gemma 2 ``config.json`` of a model's resolved keys."""
    out = llama_hf.hf_config({**config, "name": "llama"})
    head_dim = out["head_dim"]
    alpha = config["attention_logits_alpha"] or 1.0
    activation = {v: k for k, v in _ACTIVATIONS.items()}.get(config["nonlinearity"])
    if activation is None:
        raise CheckpointError(f"params: model.nonlinearity: {config['nonlinearity']!r} has no Hugging Face Gemma 2 "
                              f"activation; gemma2 exports {' and '.join(_ACTIVATIONS.values())}")
    out.update(architectures=["Gemma2ForCausalLM"], model_type="gemma2", hidden_activation=activation,
               hidden_act=activation, query_pre_attn_scalar=round(head_dim / alpha ** 2),  # HF: an int
               attn_logit_softcapping=config["attention_logit_softcapping"],
               final_logit_softcapping=config["final_logit_softcapping"],
               sliding_window=config["attention_sliding_window_length"])
    return out


ADAPTER = HFAdapter(model_keys_from_hf_config, hf_config, from_hf_state_dict, to_hf_state_dict)
from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf
