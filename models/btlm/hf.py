"""btlm and jais <-> their Hugging Face folders (remote-code models, ``model_type`` btlm / jais), as the Model
Zoo's btlm_hf_cs.py and jais_hf_cs.py (Release 2.10) map them: GPT-2's layout (``transformer.wte``, per layer
``ln_1`` / ``ln_2``, the fused Conv1D ``attn.c_attn`` [in, 3 * out] of q, k, v, ``attn.c_proj``, ``mlp.c_fc`` /
``mlp.c_proj``, ``transformer.ln_f``, ``lm_head``) plus the SwiGLU gate ``mlp.c_fc2`` (-> ``ffn.ffn.0
.linear_layer_for_glu``; SwiGLU is ``c_fc(x) * silu(c_fc2(x))``) and the ALiBi slopes ``transformer.relative_pe
.slopes`` (-> ``embedding_layer.position_embed_helper.slopes``). Every dense weight is a Conv1D ``[in, out]``.

The config is GPT-2's with the muP keys of the vendor's config converter: ``mup_embeddings_scale`` ->
``embeddings_scale``, ``mup_scale_qk_dot_by_d`` -> ``scale_qk_dot_by_d``, ``alibi_scaling`` {type linear,
factor} -> ``pos_scaling_factor`` and the output logits times ``mup_output_alpha * mup_width_scale``. The
vendor writes that product as its deprecated ``output_logits_scale`` and the width into the optimizer; here a
width scale other than 1 is the Release 2.10 muP keys that compute the same logits and LR groups
(``mup_base_hidden_size`` / ``mup_base_filter_size`` = the sizes times ``mup_width_scale``, as the Model Zoo's
btlm and jais files have it, ``output_logits_alpha`` = ``mup_output_alpha``).

transformers has no class for either (their modeling code lives on the Hub), so the reference is the vendor
converter's mapping; ``--to hf`` reads its own config back and refuses, by key, a model it would not rebuild.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cs_run.errors import CheckpointError
from cs_run.models.common.alibi import alibi_slopes
from cs_run.models.common.hf import HFAdapter, Taker, assign, give_renamed

__all__ = ["model_keys_from_hf_config", "hf_config", "from_hf_state_dict", "to_hf_state_dict", "adapter", "ADAPTER",
           "from_hf", "to_hf"]

# activation_function values (GPT-2's ACT2FN names and BTLM/JAIS's swiglu) cs-run computes under that name
_ACTIVATIONS = ("swiglu", "gelu", "gelu_new", "gelu_fast", "quick_gelu", "relu", "silu", "tanh")
_POSITIONS = ("alibi", "learned")
_LAYER = (("ln_1", "norm1"), ("ln_2", "norm3"))
_TOP = (("transformer.wte", "model.embedding_layer.word_embeddings"),
        ("transformer.wpe", "model.embedding_layer.position_embeddings.embed"), ("transformer.ln_f", "model.ln_f"))
# Conv1D modules of a layer ([in, out], the transpose of nn.Linear) and ours
_CONV = (("attn.c_proj", "self_attn.proj_output_dense_layer"), ("mlp.c_fc", "ffn.ffn.0.linear_layer"),
         ("mlp.c_fc2", "ffn.ffn.0.linear_layer_for_glu"), ("mlp.c_proj", "ffn.ffn.1.linear_layer"))
_QKV = ("proj_q_dense_layer", "proj_k_dense_layer", "proj_v_dense_layer")
_SLOPES = ("transformer.relative_pe.slopes", "model.embedding_layer.position_embed_helper.slopes")


@dataclass(frozen=True)
class _Family:
    """What the two families' folders differ in: the model_type and the remote-code names the vendor writes."""

    name: str
    architecture: str
    auto_map: dict


_FAMILIES = {
    "btlm": _Family("btlm", "BTLMLMHeadModel", {
        "AutoConfig": "cerebras/btlm-3b-8k-base--configuration_btlm.BTLMConfig",
        "AutoModel": "cerebras/btlm-3b-8k-base--modeling_btlm.BTLMModel",
        "AutoModelForCausalLM": "cerebras/btlm-3b-8k-base--modeling_btlm.BTLMLMHeadModel"}),
    "jais": _Family("jais", "JAISLMHeadModel", {
        "AutoConfig": "inceptionai/jais-30b-v3--configuration_jais.JAISConfig",
        "AutoModel": "inceptionai/jais-30b-v3--modeling_jais.JAISModel",
        "AutoModelForCausalLM": "inceptionai/jais-30b-v3--modeling_jais.JAISLMHeadModel"}),
}


def _number(cfg: dict, key: str, default: float) -> float:
    value = cfg.get(key, default)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise CheckpointError(f"config.json: {key}: expected a positive number, got {value!r}")
    return float(value)


def _decimal(x: float) -> float:
    """``x`` to 12 significant digits: a base width as a params file writes it (13653 * 0.05 is
    682.6500000000001 in binary, jais-13b's file says 682.65), so that ``--to hf`` reads its own width back."""
    return float(f"{x:.12g}")


def _pos_scaling(cfg: dict) -> float:
    """``alibi_scaling`` as the vendor reads it: null is 1, {type linear, factor} the factor; its dynamic form
    (``train_seq_len``) is refused, as the vendor refuses it."""
    scaling = cfg.get("alibi_scaling")
    if scaling is None:
        return 1.0
    if not isinstance(scaling, dict) or scaling.get("train_seq_len") is not None or \
            scaling.get("type", "linear") != "linear":
        raise CheckpointError(f"config.json: alibi_scaling: {scaling!r}: only the fixed linear scaling "
                              "{type: linear, factor: F} has a cs-run equivalent (dynamic scaling, train_seq_len, "
                              "does not)")
    return _number(scaling, "factor", 1.0)


def model_keys_from_hf_config(cfg: dict, name: str = "btlm") -> dict:
    """The ``model:`` section (Model Zoo keys) of a BTLM or JAIS ``config.json``.

    Raises:
        CheckpointError: naming the config.json key that has no cs-run equivalent.
    """
    if cfg.get("model_type") != name:
        raise CheckpointError(f"config.json: model_type {cfg.get('model_type')!r} is not {name!r}")
    for key in ("add_cross_attention", "reorder_and_upcast_attn"):
        if cfg.get(key):
            raise CheckpointError(f"config.json: {key}=true has no cs-run {name} equivalent")
    position = cfg.get("position_embedding_type", "learned")
    if position not in _POSITIONS:
        raise CheckpointError(f"config.json: position_embedding_type {position!r} has no cs-run {name} equivalent "
                              f"(one of {', '.join(_POSITIONS)})")
    act = cfg.get("activation_function", "gelu_new")
    if act not in _ACTIVATIONS:
        raise CheckpointError(f"config.json: activation_function {act!r} has no cs-run {name} equivalent "
                              f"(one of {', '.join(_ACTIVATIONS)})")
    hidden = cfg["n_embd"]
    inner = cfg.get("n_inner") or 4 * hidden
    width, alpha = _number(cfg, "mup_width_scale", 1.0), _number(cfg, "mup_output_alpha", 1.0)
    keys = {
        "name": name, "vocab_size": cfg["vocab_size"], "hidden_size": hidden, "num_hidden_layers": cfg["n_layer"],
        "num_heads": cfg["n_head"], "filter_size": inner, "max_position_embeddings": cfg["n_positions"],
        "position_embedding_type": position, "nonlinearity": act, "norm_type": "layernorm",
        "layer_norm_epsilon": cfg.get("layer_norm_epsilon", 1e-5),
        "attention_type": "scaled_dot_product" if cfg.get("scale_attn_weights", True) else "dot_product",
        "scale_qk_dot_by_layer_idx": bool(cfg.get("scale_attn_by_inverse_layer_idx", False)),
        "use_projection_bias_in_attention": True, "use_ffn_bias_in_attention": True, "use_ffn_bias": True,
        "use_bias_in_output": False, "share_embedding_weights": bool(cfg.get("tie_word_embeddings", True)),
        "embeddings_scale": _number(cfg, "mup_embeddings_scale", 1.0),
        "scale_qk_dot_by_d": bool(cfg.get("mup_scale_qk_dot_by_d", False)),
        "dropout_rate": 0.0, "embedding_dropout_rate": 0.0, "attention_dropout_rate": 0.0,
    }
    if position == "alibi":
        keys["pos_scaling_factor"] = _pos_scaling(cfg)
    if width != 1.0:  # muP: the logits times alpha / (hidden / base) = alpha * width scale
        keys.update(mup_base_hidden_size=_decimal(hidden * width), mup_base_filter_size=_decimal(inner * width),
                    output_logits_alpha=alpha)
    elif alpha != 1.0:
        keys["output_logits_scale"] = alpha
    return keys


def hf_config(config: dict) -> dict:
    """The ``config.json`` the vendor's converter writes for a btlm or jais model's resolved keys (what it
    cannot say, the read-back of ``--to hf`` refuses by key)."""
    family = _FAMILIES[config["name"]]
    base = config.get("mup_base_hidden_size")
    width = base / config["hidden_size"] if base else 1.0
    applied = config.get("output_logits_scale_applied")
    alpha = (config.get("output_logits_alpha") or 1.0) if base else (applied or 1.0)
    factor = config.get("pos_scaling_factor", 1.0)
    return {
        "architectures": [family.architecture], "auto_map": family.auto_map, "model_type": family.name,
        "vocab_size": config["vocab_size"], "n_positions": config["max_position_embeddings"],
        "n_embd": config["hidden_size"], "n_layer": config["num_hidden_layers"], "n_head": config["num_heads"],
        "n_inner": config["filter_size"], "activation_function": config["nonlinearity"],
        "layer_norm_epsilon": config["layer_norm_epsilon"],
        "scale_attn_weights": config["attention_type"] == "scaled_dot_product",
        "scale_attn_by_inverse_layer_idx": bool(config["scale_qk_dot_by_layer_idx"]),
        "reorder_and_upcast_attn": False, "tie_word_embeddings": config["share_embedding_weights"],
        "position_embedding_type": config["position_embedding_type"],
        "alibi_scaling": None if factor == 1.0 else {"type": "linear", "factor": factor},
        "mup_width_scale": width, "mup_output_alpha": alpha,
        "mup_embeddings_scale": 1.0 if config.get("embeddings_scale") is None else config["embeddings_scale"],
        "mup_scale_qk_dot_by_d": bool(config["scale_qk_dot_by_d"]),
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": 0.02, "use_cache": True,
        "torch_dtype": "float32",
    }


def from_hf_state_dict(lm, tensors: dict[str, torch.Tensor]) -> None:
    """Copy a BTLM / JAIS folder's tensors into ``lm`` (built of :func:`model_keys_from_hf_config`'s keys).

    Raises:
        CheckpointError: a tensor is missing, unused or misshapen, or the ALiBi slopes are not the paper's
            (cs-run's fixed slopes; the folder's would be silently replaced).
    """
    t, have = Taker(tensors), lm.state_dict()
    hidden = lm.config["hidden_size"]
    out = {**t.renamed(_TOP, have), **t.lm_head(lm)}
    if _SLOPES[1] in have:
        slopes = t(_SLOPES[0])
        want = torch.tensor(alibi_slopes(lm.config["num_heads"])).unsqueeze(-1)
        if slopes.shape != want.shape or not torch.allclose(slopes, want, rtol=1e-6, atol=0):
            raise CheckpointError(f"Hugging Face weights: {_SLOPES[0]} are not ALiBi's slopes for "
                                  f"{lm.config['num_heads']} heads; cs-run's btlm and jais use those")
    for i in range(lm.config["num_hidden_layers"]):
        h, c = f"transformer.h.{i}.", f"model.transformer_decoder.layers.{i}."
        out.update(t.renamed(_LAYER, have, h, c))
        for hf, ours in _CONV:
            if f"{c}{ours}.weight" in have:
                out[f"{c}{ours}.weight"] = t(f"{h}{hf}.weight").t()
                out[f"{c}{ours}.bias"] = t(f"{h}{hf}.bias")
        for kind in ("weight", "bias"):
            fused = t(f"{h}attn.c_attn.{kind}")
            parts = (fused.t() if kind == "weight" else fused).split(hidden)
            if len(parts) != 3:
                raise CheckpointError(f"Hugging Face weights: {h}attn.c_attn.{kind} has shape {list(fused.shape)}, "
                                      f"expected q, k and v of {hidden} each")
            for name, part in zip(_QKV, parts):
                out[f"{c}self_attn.{name}.{kind}"] = part
    t.check_all_used()
    assign(lm, out)


def to_hf_state_dict(lm) -> dict[str, torch.Tensor]:
    """The BTLM / JAIS folder's tensors of ``lm``: the inverse of :func:`from_hf_state_dict`."""
    sd = lm.state_dict()
    out = {**give_renamed(sd, _TOP), "lm_head.weight": sd["model.lm_head.weight"]}
    if _SLOPES[1] in sd:
        out[_SLOPES[0]] = sd[_SLOPES[1]]
    for i in range(lm.config["num_hidden_layers"]):
        h, c = f"transformer.h.{i}.", f"model.transformer_decoder.layers.{i}."
        out.update(give_renamed(sd, _LAYER, h, c))
        for hf, ours in _CONV:
            if f"{c}{ours}.weight" in sd:
                out[f"{h}{hf}.weight"] = sd[f"{c}{ours}.weight"].t()
                out[f"{h}{hf}.bias"] = sd[f"{c}{ours}.bias"]
        out[f"{h}attn.c_attn.weight"] = torch.cat([sd[f"{c}self_attn.{n}.weight"] for n in _QKV]).t()
        out[f"{h}attn.c_attn.bias"] = torch.cat([sd[f"{c}self_attn.{n}.bias"] for n in _QKV])
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def adapter(name: str) -> HFAdapter:
    """The converter of family ``name`` (btlm or jais): the same mapping, its own model_type."""
    return HFAdapter(lambda cfg: model_keys_from_hf_config(cfg, name), hf_config, from_hf_state_dict,
                     to_hf_state_dict, label=name.upper(), what=name)


ADAPTER = adapter("btlm")
from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf
