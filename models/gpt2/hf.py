"""gpt2 checkpoints <-> the Hugging Face GPT-2 layout (``config.json`` + ``model.safetensors``).

HF's GPT-2 keeps the q, k and v projections in one ``c_attn`` and stores every dense weight as a
``Conv1D`` of shape ``[in, out]`` (the transpose of ``nn.Linear``); its biases always exist. So:
q/k/v are concatenated and transposed, absent biases are written as zeros, and the HF config
carries the sizes, epsilon, activation and attention scaling. Features HF's GPT-2 cannot express
(fixed or no position embeddings, an LM-head bias, an embedding LayerNorm, muP scales, activations
it lacks) stop the conversion with an error naming the model key.

The cs-run side needs the model keys (``checkpoint convert`` reads ``--params`` or the
``params_resolved.yaml`` that every run writes next to its checkpoints). ``--from hf`` writes a cs-run checkpoint and, beside it, a params
file whose ``model:`` section describes it.

``--from hf`` checks ``config.json`` against the weights both ways before it builds anything: every
tensor the config calls for is present with the config's shape, and every tensor of the file is one
the config calls for (weights for more layers than ``n_layer`` would otherwise be dropped silently).
The shapes come from the safetensors header, so a config whose sizes the file does not hold is
refused without allocating the model it describes.
"""

from __future__ import annotations

import re
from typing import Optional

import torch

from cs_run.errors import CheckpointError, ParamsError
from cs_run.models.common.hf import HFAdapter, build, check_weights

__all__ = ["to_hf", "from_hf", "hf_config", "to_hf_state_dict", "from_hf_state_dict", "model_keys_from_hf_config",
           "hf_shapes", "ADAPTER"]

# Our nonlinearity names that HF's ACT2FN knows under the same name and formula.
_HF_ACTIVATIONS = ("gelu", "gelu_new", "gelu_fast", "quick_gelu", "relu", "silu", "swish", "tanh", "mish", "linear",
                   "leaky_relu")
_IGNORED = (".attn.bias", ".attn.masked_bias")  # HF's causal-mask buffers, not weights
_SIZES = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")  # config.json keys that must be >= 1


# Keys whose value HF's GPT-2 cannot express otherwise, with the value it has and why.
_HF_FIXED = (
    ("position_embedding_type", "learned", "HF GPT-2 has learned positions"),
    ("position_embedding_offset", 0, "HF GPT-2 positions start at 0"),
    ("use_bias_in_output", False, "HF GPT-2's lm_head has no bias"),
    ("embedding_layer_norm", False, "HF GPT-2 has no embedding LayerNorm"),
    ("embeddings_scale", 1.0, "HF GPT-2 does not scale embeddings"),
    ("output_logits_scale_applied", None, "HF GPT-2 does not scale logits (muP)"),
    ("norm_type", "layernorm", "HF GPT-2 uses LayerNorm"),
    ("attention_module", "aiayn_attention", "HF GPT-2 has multi-head attention"),
    ("attention_inner_dim", None, "HF GPT-2's attention width is the hidden size"),
    ("scale_qk_dot_by_d", False, "HF GPT-2 scales logits by 1/sqrt(d)"),
    ("attention_logits_alpha", 1.0, "HF GPT-2 does not scale logits"),
    ("attention_sliding_window_length", None, "HF GPT-2 attends to all earlier tokens"),
    ("attention_logit_softcapping", None, "HF GPT-2 has no softcapping"),
    ("final_logit_softcapping", None, "HF GPT-2 has no softcapping"),
    ("norm_first_sandwich", False, "HF GPT-2 has no sandwich norms"),
    ("use_sink_token", False, "HF GPT-2 has no attention sinks"),
    ("num_extra_input_vocab_tokens", 0, "HF GPT-2 has one vocabulary"),
)


def hf_config(config: dict) -> dict:
    """The HF ``config.json`` of a gpt2 model's resolved keys (:attr:`DecoderLMModel.config`)."""
    for key, value, why in _HF_FIXED:
        if config[key] != value and not (value is None and not config[key]):
            raise ParamsError(f"params: model.{key}: {config[key]!r} has no Hugging Face GPT-2 equivalent ({why})")
    if config["nonlinearity"] not in _HF_ACTIVATIONS:
        raise ParamsError(f"params: model.nonlinearity: {config['nonlinearity']!r} has no Hugging Face GPT-2 "
                          f"equivalent (HF knows {', '.join(_HF_ACTIVATIONS)} under these names)")
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": config["vocab_size"], "n_positions": config["max_position_embeddings"],
        "n_embd": config["hidden_size"], "n_layer": config["num_hidden_layers"], "n_head": config["num_heads"],
        "n_inner": config["filter_size"], "activation_function": config["nonlinearity"],
        "layer_norm_epsilon": config["layer_norm_epsilon"],
        "scale_attn_weights": config["attention_type"] == "scaled_dot_product",
        "tie_word_embeddings": config["share_embedding_weights"],
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "summary_first_dropout": 0.0,
        "scale_attn_by_inverse_layer_idx": config["scale_qk_dot_by_layer_idx"], "reorder_and_upcast_attn": False,
        "use_cache": True, "initializer_range": 0.02,
    }


def model_keys_from_hf_config(cfg: dict) -> dict:
    """The ``model:`` section (Model Zoo keys) of an HF GPT-2 config.

    Raises:
        CheckpointError: naming the config.json key that is not GPT-2's or not a usable size.
    """
    if cfg.get("model_type") != "gpt2":
        raise CheckpointError(f"config.json: model_type {cfg.get('model_type')!r} is not 'gpt2'")
    for key in ("add_cross_attention",):
        if cfg.get(key):
            raise CheckpointError(f"config.json: {key}=true has no cs-run gpt2 equivalent")
    for key in _SIZES + ("n_inner",):
        value = cfg.get(key)
        if key not in cfg or key == "n_inner" and value is None:  # absent: HF's default; n_inner null: 4 * n_embd
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise CheckpointError(f"config.json: {key}: expected a positive integer, got {value!r}")
    if cfg.get("n_embd", 768) % cfg.get("n_head", 12):
        raise CheckpointError(f"config.json: n_embd {cfg.get('n_embd', 768)} is not a multiple of n_head "
                              f"{cfg.get('n_head', 12)}")
    act = cfg.get("activation_function", "gelu_new")
    if act not in _HF_ACTIVATIONS:
        raise CheckpointError(f"config.json: activation_function {act!r} has no cs-run gpt2 equivalent "
                              f"(one of {', '.join(_HF_ACTIVATIONS)})")
    hidden = cfg.get("n_embd", 768)
    return {
        "name": "gpt2", "vocab_size": cfg.get("vocab_size", 50257), "hidden_size": hidden,
        "num_hidden_layers": cfg.get("n_layer", 12), "num_heads": cfg.get("n_head", 12),
        "filter_size": cfg.get("n_inner") or 4 * hidden, "max_position_embeddings": cfg.get("n_positions", 1024),
        "position_embedding_type": "learned", "share_embedding_weights": cfg.get("tie_word_embeddings", True),
        "nonlinearity": act, "layer_norm_epsilon": cfg.get("layer_norm_epsilon", 1e-5),
        "attention_type": "scaled_dot_product" if cfg.get("scale_attn_weights", True) else "dot_product",
        "dropout_rate": cfg.get("resid_pdrop", 0.1), "embedding_dropout_rate": cfg.get("embd_pdrop", 0.1),
        "attention_dropout_rate": cfg.get("attn_pdrop", 0.1), "use_bias_in_output": False,
        "scale_qk_dot_by_layer_idx": bool(cfg.get("scale_attn_by_inverse_layer_idx", False)),
    }


def hf_shapes(keys: dict, layers: int) -> dict[str, tuple]:
    """The HF GPT-2 tensors (bare names) and their shapes that model ``keys`` call for, for ``layers`` layers
    (given apart, so that a config's absurd layer count is compared before it is used to build anything)."""
    v, h, inner, pos = keys["vocab_size"], keys["hidden_size"], keys["filter_size"], keys["max_position_embeddings"]
    shapes = {"wte.weight": (v, h), "wpe.weight": (pos, h), "ln_f.weight": (h,), "ln_f.bias": (h,)}
    per_layer = {"ln_1.weight": (h,), "ln_1.bias": (h,), "attn.c_attn.weight": (h, 3 * h),
                 "attn.c_attn.bias": (3 * h,), "attn.c_proj.weight": (h, h), "attn.c_proj.bias": (h,),
                 "ln_2.weight": (h,), "ln_2.bias": (h,), "mlp.c_fc.weight": (h, inner), "mlp.c_fc.bias": (inner,),
                 "mlp.c_proj.weight": (inner, h), "mlp.c_proj.bias": (h,)}
    for i in range(layers):
        shapes.update({f"h.{i}.{name}": shape for name, shape in per_layer.items()})
    if not keys["share_embedding_weights"]:
        shapes["lm_head.weight"] = (v, h)
    return shapes


def _check_weights(found: dict[str, tuple], keys: dict, where: str) -> None:
    """``found`` (bare name -> shape) holds exactly the tensors ``keys`` call for, with their shapes.

    Raises:
        CheckpointError: one line listing the missing, unexpected and misshaped tensors, and what to fix.
    """
    in_file = sorted({int(m.group(1)) for name in found if (m := re.match(r"h\.(\d+)\.", name))})
    layers = keys["num_hidden_layers"]
    expected = hf_shapes(keys, min(layers, len(found)))  # never more entries than the file has tensors
    optional = {} if "lm_head.weight" in expected else {"lm_head.weight": (keys["vocab_size"], keys["hidden_size"])}
    check_weights(found, expected, optional, in_file, f"n_layer={layers}", layers, where,
                  "n_layer, n_embd, n_inner, n_positions, vocab_size, tie_word_embeddings", layer_prefix="h.")


def _bare(name: str) -> str:
    return name.removeprefix("transformer.")


def _zeros_if_none(t: Optional[torch.Tensor], size: int) -> torch.Tensor:
    return t if t is not None else torch.zeros(size)


def to_hf_state_dict(lm) -> dict[str, torch.Tensor]:
    """HF GPT2LMHeadModel tensors (``transformer.*`` names, Conv1D ``[in, out]`` weights) of a gpt2
    :class:`~cs_run.models.common.lm.DecoderLMModel`."""
    model, hidden = lm.model, lm.config["hidden_size"]
    out: dict[str, torch.Tensor] = {
        "transformer.wte.weight": model.embedding_layer.word_embeddings.weight,
        "transformer.wpe.weight": model.embedding_layer.position_embeddings.embed.weight,
        "transformer.ln_f.weight": model.ln_f.weight, "transformer.ln_f.bias": model.ln_f.bias,
    }
    for i, layer in enumerate(model.transformer_decoder.layers):
        p = f"transformer.h.{i}."
        a = layer.self_attn
        qkv = (a.proj_q_dense_layer, a.proj_k_dense_layer, a.proj_v_dense_layer)
        out[p + "ln_1.weight"], out[p + "ln_1.bias"] = layer.norm1.weight, layer.norm1.bias
        out[p + "attn.c_attn.weight"] = torch.cat([lin.weight for lin in qkv], dim=0).t()
        out[p + "attn.c_attn.bias"] = torch.cat([_zeros_if_none(lin.bias, hidden) for lin in qkv])
        out[p + "attn.c_proj.weight"] = a.proj_output_dense_layer.weight.t()
        out[p + "attn.c_proj.bias"] = _zeros_if_none(a.proj_output_dense_layer.bias, hidden)
        out[p + "ln_2.weight"], out[p + "ln_2.bias"] = layer.norm3.weight, layer.norm3.bias
        fc, proj = layer.ffn.ffn[0].linear_layer, layer.ffn.ffn[1].linear_layer
        out[p + "mlp.c_fc.weight"] = fc.weight.t()
        out[p + "mlp.c_fc.bias"] = _zeros_if_none(fc.bias, fc.out_features)
        out[p + "mlp.c_proj.weight"] = proj.weight.t()
        out[p + "mlp.c_proj.bias"] = _zeros_if_none(proj.bias, hidden)
    if not model.share_embedding_weights:
        out["lm_head.weight"] = model.lm_head.weight
    return {k: v.detach().cpu().contiguous().clone() for k, v in out.items()}


def from_hf_state_dict(lm, tensors: dict[str, torch.Tensor]) -> None:
    """Copy HF GPT-2 tensors into ``lm`` (a gpt2 DecoderLMModel built from the matching keys).

    Accepts ``transformer.``-prefixed names (save_pretrained) and bare ones (the original checkpoints);
    HF's causal-mask buffers are ignored.

    Raises:
        CheckpointError: a tensor is missing, has another shape, or a nonzero bias has nowhere to go.
    """
    t = {_bare(k): v for k, v in tensors.items() if not k.endswith(_IGNORED)}
    model, hidden = lm.model, lm.config["hidden_size"]
    _check_weights({k: tuple(v.shape) for k, v in t.items()}, lm.config, "Hugging Face weights")
    if lm.config["share_embedding_weights"] and "lm_head.weight" in t and not torch.equal(t["lm_head.weight"],
                                                                                        t["wte.weight"]):
        raise CheckpointError("Hugging Face weights: lm_head.weight differs from wte.weight, but config.json says "
                              "tie_word_embeddings=true (one tensor for both); set tie_word_embeddings to false")

    def take(key: str, shape: tuple) -> torch.Tensor:
        if key not in t:
            raise CheckpointError(f"Hugging Face weights: missing tensor {key!r}")
        value = t[key]
        if tuple(value.shape) != tuple(shape):
            raise CheckpointError(f"Hugging Face weights: {key!r} has shape {list(value.shape)}, the config says "
                                  f"{list(shape)}")
        return value.float()

    def put(param: Optional[torch.Tensor], value: torch.Tensor, key: str) -> None:
        if param is None:
            if value.abs().max() != 0:
                raise CheckpointError(f"Hugging Face weights: {key!r} is nonzero but the model has no such bias")
            return
        param.copy_(value)

    e = model.embedding_layer
    with torch.no_grad():
        e.word_embeddings.weight.copy_(take("wte.weight", e.word_embeddings.weight.shape))
        e.position_embeddings.embed.weight.copy_(take("wpe.weight", e.position_embeddings.embed.weight.shape))
        model.ln_f.weight.copy_(take("ln_f.weight", (hidden,)))
        model.ln_f.bias.copy_(take("ln_f.bias", (hidden,)))
        for i, layer in enumerate(model.transformer_decoder.layers):
            p = f"h.{i}."
            a = layer.self_attn
            layer.norm1.weight.copy_(take(p + "ln_1.weight", (hidden,)))
            layer.norm1.bias.copy_(take(p + "ln_1.bias", (hidden,)))
            w = take(p + "attn.c_attn.weight", (hidden, 3 * hidden)).t()
            b = take(p + "attn.c_attn.bias", (3 * hidden,))
            for j, lin in enumerate((a.proj_q_dense_layer, a.proj_k_dense_layer, a.proj_v_dense_layer)):
                lin.weight.copy_(w[j * hidden:(j + 1) * hidden])
                put(lin.bias, b[j * hidden:(j + 1) * hidden], p + "attn.c_attn.bias")
            a.proj_output_dense_layer.weight.copy_(take(p + "attn.c_proj.weight", (hidden, hidden)).t())
            put(a.proj_output_dense_layer.bias, take(p + "attn.c_proj.bias", (hidden,)), p + "attn.c_proj.bias")
            layer.norm3.weight.copy_(take(p + "ln_2.weight", (hidden,)))
            layer.norm3.bias.copy_(take(p + "ln_2.bias", (hidden,)))
            fc, proj = layer.ffn.ffn[0].linear_layer, layer.ffn.ffn[1].linear_layer
            fc.weight.copy_(take(p + "mlp.c_fc.weight", (hidden, fc.out_features)).t())
            put(fc.bias, take(p + "mlp.c_fc.bias", (fc.out_features,)), p + "mlp.c_fc.bias")
            proj.weight.copy_(take(p + "mlp.c_proj.weight", (fc.out_features, hidden)).t())
            put(proj.bias, take(p + "mlp.c_proj.bias", (hidden,)), p + "mlp.c_proj.bias")
        if not model.share_embedding_weights:
            model.lm_head.weight.copy_(take("lm_head.weight", model.lm_head.weight.shape))


def _build(model_keys: dict):
    return build({**model_keys, "name": "gpt2"})


class _GPT2Adapter(HFAdapter):
    """gpt2's own rules where the shared flow has the families': the file's shapes are compared with
    :func:`hf_shapes` by bare name (a meta model's :func:`to_hf_state_dict` cannot make its zero biases), and
    ``--to hf`` reads nothing back: :func:`hf_config` refuses what HF's GPT-2 cannot express by its own
    table, and a bias the model lacks is written as zeros, which a read-back would take for a bias."""

    def check_header(self, found: dict[str, tuple], keys: dict, where: str) -> None:
        _check_weights({_bare(k): shape for k, shape in found.items()}, keys, where)

    def build_model(self, keys: dict):
        return _build(keys)

    def check_expressible(self, model, model_keys: dict, config: dict) -> None:
        pass


ADAPTER = _GPT2Adapter(model_keys_from_hf_config, hf_config, from_hf_state_dict, to_hf_state_dict, buffers=_IGNORED,
                       label="GPT-2", what="gpt2")
from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf
