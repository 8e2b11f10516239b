"""mixtral <-> Hugging Face Mixtral (``MixtralForCausalLM``): the model keys of an HF config and the
tensor map, as the Model Zoo's converter (tools/checkpoint_converters/mixtral.py) has them.

Everything but the FFN is Llama's (models/llama/hf.py: embeddings, norms, attention with the q/k rows
permuted to interleaved RoPE). Per layer, the router ``mlp.gate.weight`` (``block_sparse_moe.gate``
before transformers 5) -> ``ffn.gate.weight``; expert i's ``w1`` (gate) -> ``ffn.experts.experts.i.0.
linear_layer_for_glu``, ``w3`` (up) -> ``...i.0.linear_layer``, ``w2`` (down) -> ``...i.1.linear_layer``.
transformers 5 stores the experts fused: ``mlp.experts.gate_up_proj`` [E, 2F, H] (w1 rows, then w3
rows) and ``mlp.experts.down_proj`` [E, H, F]; the older per-expert ``block_sparse_moe.experts.i.w1``
layout (which ``save_pretrained`` still writes, converting on save) is read too and is what
:func:`to_hf_state_dict` writes.

Routing agrees with HF's when the Model Zoo's defaults hold (softmax selection and weighting,
``expert_weighting_normalization``, ``null_expert_bias`` 0, no shared experts, no router bias,
``router_fp32``): both take the top-k of the fp32 softmax and divide the chosen probabilities by their
sum. Any other ``moe`` value, and biases anywhere (HF's Mixtral has none), has no HF config key:
``--to hf`` refuses it naming the key. ``router_aux_loss_coef`` <-> ``moe.load_balancing_loss_coef``, as
the Model Zoo's converter maps it, though the two losses average differently over a batch (HF over all
tokens at once, the Model Zoo per sequence, then over sequences): equal for one sequence, and training
only (``output_router_logits`` is written false, so HF's eval loss is the token loss, as ours is).
"""

from __future__ import annotations

import functools

import torch

from cs_run.errors import CheckpointError
from cs_run.models.common.hf import HFAdapter, Taker
from cs_run.models.llama import hf as llama_hf

__all__ = ["model_keys_from_hf_config", "from_hf_state_dict", "to_hf_state_dict", "hf_config", "from_hf", "to_hf", "ADAPTER"]

_EXPERT = (("w1", "0.linear_layer_for_glu"), ("w3", "0.linear_layer"), ("w2", "1.linear_layer"))


def model_keys_from_hf_config(cfg: dict) -> dict:
    """The ``model:`` section (Model Zoo keys) of an HF Mixtral config."""
    if cfg.get("router_jitter_noise"):
        raise CheckpointError("config.json: router_jitter_noise has no Model Zoo equivalent; set it to 0")
    keys = llama_hf.model_keys_from_hf_config(cfg, name="mixtral")
    keys["moe"] = {"num_experts": cfg["num_local_experts"], "top_k": cfg["num_experts_per_tok"],
                   "load_balancing_loss_coef": float(cfg.get("router_aux_loss_coef", 0.0)), "router_fp32": True}
    return keys


def _experts(t: Taker, h: str, experts: int) -> list[dict[str, torch.Tensor]]:
    """Per expert {w1, w2, w3} of layer prefix ``h`` in either HF layout."""
    if h + "mlp.experts.gate_up_proj" in t:
        gate_up, down = t(h + "mlp.experts.gate_up_proj"), t(h + "mlp.experts.down_proj")
        f = gate_up.shape[1] // 2
        return [{"w1": gate_up[i, :f], "w3": gate_up[i, f:], "w2": down[i]} for i in range(experts)]
    return [{w: t(h + f"block_sparse_moe.experts.{i}.{w}.weight") for w, _ in _EXPERT} for i in range(experts)]


def _take_moe(t: Taker, lm, h: str, c: str) -> dict[str, torch.Tensor]:
    """A layer's router and experts (HF prefix ``h``, ours ``c``), in either HF layout."""
    gate = h + "mlp.gate.weight" if h + "mlp.gate.weight" in t else h + "block_sparse_moe.gate.weight"
    out = {c + "ffn.gate.weight": t(gate)}
    for e, ws in enumerate(_experts(t, h, lm.config["moe"]["num_experts"])):
        for hf, ours in _EXPERT:
            out[c + f"ffn.experts.experts.{e}.{ours}.weight"] = ws[hf]
    return out


def _give_moe(sd: dict[str, torch.Tensor], lm, h: str, c: str, fused: bool = False) -> dict[str, torch.Tensor]:
    experts = lm.config["moe"]["num_experts"]
    w = {hf: [sd[c + f"ffn.experts.experts.{e}.{ours}.weight"] for e in range(experts)] for hf, ours in _EXPERT}
    if fused:
        return {h + "mlp.gate.weight": sd[c + "ffn.gate.weight"],
                h + "mlp.experts.gate_up_proj": torch.stack([torch.cat(p) for p in zip(w["w1"], w["w3"])]),
                h + "mlp.experts.down_proj": torch.stack(w["w2"])}
    return {h + "block_sparse_moe.gate.weight": sd[c + "ffn.gate.weight"],
            **{h + f"block_sparse_moe.experts.{e}.{hf}.weight": w[hf][e] for hf in w for e in range(experts)}}


def from_hf_state_dict(lm, tensors: dict[str, torch.Tensor]) -> None:
    """Copy HF Mixtral tensors into ``lm`` (a DecoderLMModel built from :func:`model_keys_from_hf_config`)."""
    llama_hf.from_hf_state_dict(lm, tensors, ffn=_take_moe)


def to_hf_state_dict(lm, fused: bool = False) -> dict[str, torch.Tensor]:
    """HF Mixtral tensors of a mixtral DecoderLMModel: the per-expert file layout that ``save_pretrained``
    writes (transformers 5 too) and every transformers version reads, or with ``fused`` the in-memory
    layout of transformers 5 (``mlp.experts.gate_up_proj``)."""
    return llama_hf.to_hf_state_dict(lm, ffn=functools.partial(_give_moe, fused=fused))


def hf_config(config: dict) -> dict:
    """The HF Mixtral ``config.json`` of a model's resolved keys (Mistral's, plus the experts; Mixtral has
    no bias keys: a model with biases comes back without them and is refused)."""
    out = llama_hf.hf_config({**config, "name": "mistral"})
    for key in ("attention_bias", "mlp_bias"):
        del out[key]
    moe = config["moe"]
    out.update(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=moe["num_experts"],
               num_experts_per_tok=moe["top_k"], router_aux_loss_coef=moe["load_balancing_loss_coef"],
               output_router_logits=False, router_jitter_noise=0.0)
    return out


def _file_layout(names) -> dict:
    """A file in transformers 5's in-memory layout (a state dict saved as is) has its experts fused."""
    return {"fused": any(k.endswith(".mlp.experts.gate_up_proj") for k in names)}


ADAPTER = HFAdapter(model_keys_from_hf_config, hf_config, from_hf_state_dict, to_hf_state_dict, file_layout=_file_layout)
from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf
