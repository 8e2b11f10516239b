"""vision_transformer <-> Hugging Face CLIP vision (``CLIPVisionModelWithProjection``, model_type
``clip_vision_model``), and the CLIP tower's tensor map that llava's adapter (and any model holding a CLIP
tower) uses, as the vendor's clip_vit converter maps it (CLIPVisionModelWithProjection <-> ViTClassificationModel); the
adapter (:class:`cs_run.models.common.hf.HFAdapter`) of these functions is vision_transformer's hf module's.

CLIP's settings on the ViT keys (:data:`CLIP_KEYS`): ``use_post_embed_layer_norm: true`` (HF's
``pre_layrnorm``), ``use_embed_proj_bias: false``, the conv patch embedding, ``nonlinearity: quick_gelu``
(CLIP's usual ``hidden_act``), a cls token whose position row is last here and first in HF, and HF's
``post_layernorm`` as the trunk's final norm (``encoder.transformer_encoder.norm``). The classifier is HF's
``visual_projection`` (no bias, ``num_classes`` = ``projection_dim``): the vision_transformer's logits are
CLIP's ``image_embeds`` (the projection of the normed cls state). Per layer ``self_attn.q/k/v_proj`` ->
``self_attn.proj_q/k/v_dense_layer``, ``out_proj`` -> ``proj_output_dense_layer``, ``mlp.fc1/fc2`` ->
``ffn.ffn.0/1.linear_layer``, ``layer_norm1/2`` -> ``norm1/2``.
"""

from __future__ import annotations

import torch

from cs_run.errors import CheckpointError
from cs_run.models.common.hf import Taker, assign, give_renamed

__all__ = ["CLIP_KEYS", "vision_keys_from_hf", "hf_vision_config", "vision_from_hf", "vision_to_hf",
           "model_keys_from_hf_config", "from_hf_state_dict", "to_hf_state_dict", "hf_config", "is_clip"]

_TRUNK, _HEAD = "model.vit_model.", "model.classifier.classifier.ffn.0.linear_layer.weight"


CLIP_KEYS = {"use_post_embed_layer_norm": True, "use_embed_proj_bias": False, "use_conv_patchified_embedding": True,
             "prepend_cls_token": True, "position_embedding_type": "learned", "norm_first": True,
             "use_final_layer_norm": True, "use_encoder_pooler_layer": False, "use_projection_bias_in_attention": True,
             "use_ffn_bias_in_attention": True, "use_ffn_bias": True, "attention_type": "scaled_dot_product"}
"""The ViT keys every HF CLIP vision tower has (a model with another value is not a CLIP tower)."""

_LAYER_MAP = (("self_attn.q_proj", "self_attn.proj_q_dense_layer"), ("self_attn.k_proj", "self_attn.proj_k_dense_layer"),
              ("self_attn.v_proj", "self_attn.proj_v_dense_layer"),
              ("self_attn.out_proj", "self_attn.proj_output_dense_layer"),
              ("mlp.fc1", "ffn.ffn.0.linear_layer"), ("mlp.fc2", "ffn.ffn.1.linear_layer"),
              ("layer_norm1", "norm1"), ("layer_norm2", "norm2"))
_SINGLE_MAP = (("embeddings.patch_embedding", "embedding_layer.linear_proj"),
               ("pre_layrnorm", "embedding_layer.post_embed_ln"), ("post_layernorm", "encoder.transformer_encoder.norm"))
_LAYER = "encoder.transformer_encoder.layers.{}."


def vision_keys_from_hf(cfg: dict) -> dict:
    """The ViT keys (``image_model:`` without its name) of an HF ``CLIPVisionConfig`` dict."""
    size, patch = int(cfg.get("image_size", 224)), int(cfg.get("patch_size", 32))
    return {
        "hidden_size": cfg["hidden_size"], "num_hidden_layers": cfg["num_hidden_layers"],
        "num_heads": cfg["num_attention_heads"], "filter_size": cfg["intermediate_size"],
        "nonlinearity": cfg.get("hidden_act", "quick_gelu"), "layer_norm_epsilon": float(cfg.get("layer_norm_eps", 1e-5)),
        "image_size": [size, size], "patch_size": [patch, patch], "num_channels": int(cfg.get("num_channels", 3)),
        "dropout_rate": 0.0, "embedding_dropout_rate": 0.0,
        "attention_dropout_rate": float(cfg.get("attention_dropout", 0.0)),
        "initializer_range": float(cfg.get("initializer_range", 0.02)), **CLIP_KEYS,
    }


def hf_vision_config(keys: dict) -> dict:
    """The HF ``CLIPVisionConfig`` dict of a tower's resolved ViT keys (square images and patches; the
    projection, when a model has one, is the caller's)."""
    return {"model_type": "clip_vision_model", "hidden_size": keys["hidden_size"],
            "num_hidden_layers": keys["num_hidden_layers"], "num_attention_heads": keys["num_heads"],
            "intermediate_size": keys["filter_size"], "hidden_act": keys["nonlinearity"],
            "layer_norm_eps": keys["layer_norm_epsilon"], "image_size": keys["image_size"][0],
            "patch_size": keys["patch_size"][0], "num_channels": keys["num_channels"],
            "attention_dropout": keys["attention_dropout_rate"], "dropout": 0.0,
            "initializer_range": keys["initializer_range"]}


def vision_from_hf(t: Taker, hf_prefix: str, our_prefix: str, have, num_layers: int) -> dict[str, torch.Tensor]:
    """Our names -> tensors of an HF CLIP vision tower under ``hf_prefix`` (``vision_model.``), for a trunk
    under ``our_prefix`` whose state-dict names are ``have``."""
    out = {our_prefix + "embedding_layer.cls_embedding": t(hf_prefix + "embeddings.class_embedding")}
    pos = t(hf_prefix + "embeddings.position_embedding.weight")
    out[our_prefix + "embedding_layer.position_embeddings.weight"] = torch.cat([pos[1:], pos[:1]])  # cls row last
    out.update(t.renamed(_SINGLE_MAP, have, hf_prefix, our_prefix))
    for i in range(num_layers):
        out.update(t.renamed(_LAYER_MAP, have, f"{hf_prefix}encoder.layers.{i}.", our_prefix + _LAYER.format(i)))
    return out


def vision_to_hf(sd: dict[str, torch.Tensor], hf_prefix: str, our_prefix: str, num_layers: int) -> dict[str, torch.Tensor]:
    """The inverse of :func:`vision_from_hf` over the state dict ``sd``."""
    pos = sd[our_prefix + "embedding_layer.position_embeddings.weight"]
    out = {hf_prefix + "embeddings.class_embedding": sd[our_prefix + "embedding_layer.cls_embedding"],
           hf_prefix + "embeddings.position_embedding.weight": torch.cat([pos[-1:], pos[:-1]])}
    out.update(give_renamed(sd, _SINGLE_MAP, hf_prefix, our_prefix))
    for i in range(num_layers):
        out.update(give_renamed(sd, _LAYER_MAP, f"{hf_prefix}encoder.layers.{i}.", our_prefix + _LAYER.format(i)))
    return out


def is_clip(model_keys: dict) -> bool:
    """Whether a vision_transformer's keys are a CLIP tower's (its post-embedding norm, no patch bias: HF's ViT
    has neither), so that ``--to hf`` writes CLIPVisionModelWithProjection."""
    return bool(model_keys.get("use_post_embed_layer_norm")) and model_keys.get("use_embed_proj_bias") is False


def model_keys_from_hf_config(cfg: dict) -> dict:
    """The ``model:`` section of an HF CLIPVisionConfig (with its projection: the classifier)."""
    return {"name": "vision_transformer", **vision_keys_from_hf(cfg), "num_classes": int(cfg.get("projection_dim", 512)),
            "use_bias_in_output": False}


def from_hf_state_dict(model, tensors: dict[str, torch.Tensor]) -> None:
    """Copy HF CLIPVisionModelWithProjection tensors into ``model`` (built of :func:`model_keys_from_hf_config`)."""
    if "visual_projection.weight" not in tensors:
        raise CheckpointError("Hugging Face weights: no visual_projection.weight; vision_transformer reads a "
                              "CLIPVisionModelWithProjection folder (its projection is the classifier)")
    t = Taker(tensors)
    out = vision_from_hf(t, "vision_model.", _TRUNK, model.state_dict(), model.config["num_hidden_layers"])
    out[_HEAD] = t("visual_projection.weight")
    t.check_all_used()
    assign(model, out)


def to_hf_state_dict(model) -> dict[str, torch.Tensor]:
    """HF CLIPVisionModelWithProjection tensors of a CLIP-keyed vision_transformer (the inverse of
    :func:`from_hf_state_dict`; the module names are the files' in every transformers version)."""
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    out = vision_to_hf(sd, "vision_model.", _TRUNK, model.config["num_hidden_layers"])
    out["visual_projection.weight"] = sd[_HEAD]
    return {k: v.contiguous().clone() for k, v in out.items()}


def hf_config(config: dict) -> dict:
    """The HF ``config.json`` (CLIPVisionModelWithProjection) of a vision_transformer's resolved keys."""
    return {"architectures": ["CLIPVisionModelWithProjection"], **hf_vision_config(config),
            "projection_dim": config["num_classes"], "torch_dtype": "float32"}
