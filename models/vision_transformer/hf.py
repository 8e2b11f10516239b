"""vision_transformer <-> Hugging Face ViT (``ViTForImageClassification``): the model keys of an HF config and
the tensor map, through the decoders' adapter (:class:`cs_run.models.common.hf.HFAdapter`).

Names (transformers 5's modules; the files, of every version, hold transformers 4's
``vit.encoder.layer.N.attention.attention.query`` ..., which both ways read and ``--to hf`` writes: see
:data:`LEGACY_NAMES`): ``vit.embeddings.patch_embeddings.projection`` -> ``embedding_layer.linear_proj`` (the conv form,
``use_conv_patchified_embedding: true``), ``cls_token`` -> ``cls_embedding``, ``position_embeddings`` ->
``position_embeddings.weight`` with the cls row moved from first (HF) to last (the Model Zoo's); per layer
``attention.q/k/v_proj`` -> ``self_attn.proj_q/k/v_dense_layer``, ``attention.o_proj`` ->
``proj_output_dense_layer``, ``mlp.fc1`` / ``mlp.fc2`` -> ``ffn.ffn.0`` / ``ffn.ffn.1``,
``layernorm_before`` / ``layernorm_after`` -> ``norm1`` / ``norm2``; ``vit.layernorm`` ->
``transformer_encoder.norm``; ``classifier`` -> ``classifier.classifier.ffn.0.linear_layer``. HF's ViT is
square, pre-norm, conv-patched, cls-pooled without a pooler layer: a model outside that is refused by the
key that differs. A CLIP vision folder (``CLIPVisionModelWithProjection``) reads and writes through
:data:`CLIP_ADAPTER` (:mod:`cs_run.models.vision_transformer.clip`).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from cs_run.checkpoint.hf_folder import read_config
from cs_run.models.common.hf import HFAdapter, Taker, assign, params_file_text
from cs_run.models.vision_transformer import clip

__all__ = ["model_keys_from_hf_config", "from_hf_state_dict", "to_hf_state_dict", "hf_config", "runnable_params",
           "from_hf", "to_hf", "ADAPTER", "CLIP_ADAPTER"]

_TRUNK, _LAYER = "model.vit_model.", "model.vit_model.encoder.transformer_encoder.layers.{}."
_HEAD = "model.classifier.classifier.ffn.0.linear_layer"
# transformers 5's module names (vit.layers.N.); LEGACY_NAMES: those its save_pretrained writes (transformers 4's)
_LAYER_MAP = (("attention.q_proj", "self_attn.proj_q_dense_layer"), ("attention.k_proj", "self_attn.proj_k_dense_layer"),
              ("attention.v_proj", "self_attn.proj_v_dense_layer"),
              ("attention.o_proj", "self_attn.proj_output_dense_layer"),
              ("mlp.fc1", "ffn.ffn.0.linear_layer"), ("mlp.fc2", "ffn.ffn.1.linear_layer"),
              ("layernorm_before", "norm1"), ("layernorm_after", "norm2"))
LEGACY_NAMES = {"attention.q_proj": "attention.attention.query", "attention.k_proj": "attention.attention.key",
                "attention.v_proj": "attention.attention.value", "attention.o_proj": "attention.output.dense",
                "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}
_LEGACY_LAYER = re.compile(r"^vit\.encoder\.layer\.(\d+)\.(.*)$")
_SINGLE_MAP = (("vit.embeddings.patch_embeddings.projection", _TRUNK + "embedding_layer.linear_proj"),
               ("vit.layernorm", _TRUNK + "encoder.transformer_encoder.norm"), ("classifier", _HEAD))


def _square(value, key: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ValueError(f"{key} {value!r}")
        return [int(value[0]), int(value[1])]
    return [int(value), int(value)]


def model_keys_from_hf_config(cfg: dict) -> dict:
    """The ``model:`` section (Model Zoo keys) of an HF ViT config."""
    labels = cfg.get("id2label")
    dropout = float(cfg.get("hidden_dropout_prob", 0.0))
    return {
        "name": "vision_transformer", "num_classes": len(labels) if labels else int(cfg.get("num_labels", 2)),
        "hidden_size": cfg["hidden_size"], "num_hidden_layers": cfg["num_hidden_layers"],
        "num_heads": cfg["num_attention_heads"], "filter_size": cfg["intermediate_size"],
        "nonlinearity": cfg.get("hidden_act", "gelu"), "layer_norm_epsilon": float(cfg.get("layer_norm_eps", 1e-12)),
        "image_size": _square(cfg.get("image_size", 224), "image_size"),
        "patch_size": _square(cfg.get("patch_size", 16), "patch_size"), "num_channels": cfg.get("num_channels", 3),
        "use_projection_bias_in_attention": bool(cfg.get("qkv_bias", True)), "use_ffn_bias_in_attention": True,
        "use_ffn_bias": True, "use_bias_in_output": True, "use_conv_patchified_embedding": True,
        "prepend_cls_token": True, "position_embedding_type": "learned", "norm_first": True,
        "use_final_layer_norm": True, "use_encoder_pooler_layer": False, "use_post_embed_layer_norm": False,
        "dropout_rate": dropout, "embedding_dropout_rate": dropout,
        "attention_dropout_rate": float(cfg.get("attention_probs_dropout_prob", 0.0)),
        "initializer_range": float(cfg.get("initializer_range", 0.02)), "attention_type": "scaled_dot_product",
    }


def from_hf_state_dict(model, tensors: dict[str, torch.Tensor]) -> None:
    """Copy HF ViTForImageClassification tensors into ``model`` (built from :func:`model_keys_from_hf_config`)."""
    t = Taker(_current_names(tensors))
    have = model.state_dict()
    out = {_TRUNK + "embedding_layer.cls_embedding": t("vit.embeddings.cls_token").reshape(-1)}
    pos = t("vit.embeddings.position_embeddings")[0]
    out[_TRUNK + "embedding_layer.position_embeddings.weight"] = torch.cat([pos[1:], pos[:1]])  # cls row last
    out.update(t.renamed(_SINGLE_MAP, have))
    for i in range(model.config["num_hidden_layers"]):
        out.update(t.renamed(_LAYER_MAP, have, f"vit.layers.{i}.", _LAYER.format(i)))
    t.check_all_used()
    assign(model, out)


def _current_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transformers 4 folder's layer names (``vit.encoder.layer.N.attention.attention.query``, ...) as
    transformers 5's (``vit.layers.N.attention.q_proj``); others unchanged."""
    back = {old: new for new, old in LEGACY_NAMES.items()}
    out = {}
    for name, value in tensors.items():
        if m := _LEGACY_LAYER.match(name):
            rest = m.group(2)
            for old, new in back.items():
                if rest.startswith(old + "."):
                    rest = new + rest[len(old):]
            name = f"vit.layers.{m.group(1)}.{rest}"
        out[name] = value
    return out


def _layout(names) -> dict:
    """to_hf_state_dict's keywords for a file of these names: the legacy layout if it is one."""
    return {"legacy": any(_LEGACY_LAYER.match(n) for n in names)}


def to_hf_state_dict(model, legacy: bool = True) -> dict[str, torch.Tensor]:
    """HF ViTForImageClassification tensors of a vision_transformer model (the inverse of
    :func:`from_hf_state_dict`): with ``legacy`` named as the files are (transformers 5's save_pretrained
    still writes transformers 4's names, which every version reads), else as transformers 5's modules."""
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    pos = sd[_TRUNK + "embedding_layer.position_embeddings.weight"]
    out = {"vit.embeddings.cls_token": sd[_TRUNK + "embedding_layer.cls_embedding"].reshape(1, 1, -1),
           "vit.embeddings.position_embeddings": torch.cat([pos[-1:], pos[:-1]])[None]}
    for hf, ours in _SINGLE_MAP:
        out.update({f"{hf}.{kind}": sd[f"{ours}.{kind}"] for kind in ("weight", "bias") if f"{ours}.{kind}" in sd})
    for i in range(model.config["num_hidden_layers"]):
        prefix = f"vit.encoder.layer.{i}." if legacy else f"vit.layers.{i}."
        for hf, ours in _LAYER_MAP:
            hf = LEGACY_NAMES.get(hf, hf) if legacy else hf
            for kind in ("weight", "bias"):
                if f"{_LAYER.format(i)}{ours}.{kind}" in sd:
                    out[f"{prefix}{hf}.{kind}"] = sd[f"{_LAYER.format(i)}{ours}.{kind}"]
    return {k: v.contiguous().clone() for k, v in out.items()}


def hf_config(config: dict) -> dict:
    """The HF ``config.json`` (ViTForImageClassification) of a model's resolved keys."""
    n = config["num_classes"]
    return {
        "architectures": ["ViTForImageClassification"], "model_type": "vit",
        "hidden_size": config["hidden_size"], "num_hidden_layers": config["num_hidden_layers"],
        "num_attention_heads": config["num_heads"], "intermediate_size": config["filter_size"],
        "hidden_act": config["nonlinearity"], "hidden_dropout_prob": config["dropout_rate"],
        "attention_probs_dropout_prob": config["attention_dropout_rate"],
        "initializer_range": config["initializer_range"], "layer_norm_eps": config["layer_norm_epsilon"],
        # a non-square model reads back square and is refused by check_expressible, naming image_size
        "image_size": config["image_size"][0], "patch_size": config["patch_size"][0],
        "num_channels": config["num_channels"], "qkv_bias": config["use_projection_bias_in_attention"],
        "encoder_stride": config["patch_size"][0],
        "id2label": {str(i): f"LABEL_{i}" for i in range(n)}, "label2id": {f"LABEL_{i}": i for i in range(n)},
        "torch_dtype": "float32",
    }


def runnable_params(model_keys: dict, hf_dir: Path, checkpoint: Path) -> str:
    """The params file ``--from hf`` writes beside the checkpoint: the folder's ``model:`` keys plus
    ImageNet1KProcessor inputs at the model's image size, the vendor ViT files' Adam and a runconfig; it runs
    once the two data_dir placeholders name an ImageNet-layout folder."""
    size = model_keys["image_size"]

    def data(split: str) -> dict:
        train = split == "train"
        transforms = [{"name": "resize", "size": list(size)}, *([{"name": "random_horizontal_flip", "p": 0.5}] * train),
                      {"name": "to_tensor"}, {"name": "normalize", "mean": [0.5] * 3, "std": [0.5] * 3}]
        return {"data_processor": "ImageNet1KProcessor", "data_dir": None, "batch_size": 32, "image_size": list(size),
                "shuffle": train, **({"shuffle_seed": 1} if train else {}), "split": split,
                "transforms": transforms, "num_workers": 0}
    sections = {
        "train_input": data("train"), "eval_input": data("val"), "model": model_keys,
        "optimizer": {"optimizer_type": "Adam", "betas": [0.9, 0.999], "eps": 1.0e-8, "weight_decay": 0.0003,
                      "max_gradient_norm": 1.0, "learning_rate": 1.0e-4},
        "runconfig": {"max_steps": 1000, "log_steps": 10, "checkpoint_steps": 200, "seed": 1},
    }
    return params_file_text(model_keys["name"], hf_dir, checkpoint, sections,
                            "train_input.data_dir and eval_input.data_dir to an ImageNet-layout folder\n"
                            "# (DIR/train/<class>/<image>, DIR/val/<class>/<image>).", "an ImageNet-layout folder")


ADAPTER = HFAdapter(model_keys_from_hf_config, hf_config, from_hf_state_dict, to_hf_state_dict, file_layout=_layout,
                    label="ViT", params_text=runnable_params)
CLIP_ADAPTER = HFAdapter(clip.model_keys_from_hf_config, clip.hf_config, clip.from_hf_state_dict,
                         clip.to_hf_state_dict, label="CLIP vision", params_text=runnable_params)
"""CLIPVisionModelWithProjection folders (model_type clip_vision_model) and CLIP-keyed models (:func:`clip.is_clip`)."""


def from_hf(hf_dir: str | Path, dst: str | Path, params_out: str | Path | None = None) -> tuple[Path, Path]:
    """``--from hf`` of a ViT folder, or of a CLIP vision one (its config.json's model_type says which)."""
    cfg = Path(hf_dir) / "config.json"
    kind = read_config(cfg, "Hugging Face config").get("model_type") if cfg.is_file() else None
    return (CLIP_ADAPTER if kind == "clip_vision_model" else ADAPTER).from_hf(hf_dir, dst, params_out)


def to_hf(checkpoint: str | Path, out_dir: str | Path, model_keys: dict, side=(), prefix: str = "") -> Path:
    """``--to hf``: a CLIP vision folder for a CLIP-keyed model, else a ViT one."""
    return (CLIP_ADAPTER if clip.is_clip(model_keys) else ADAPTER).to_hf(checkpoint, out_dir, model_keys, side, prefix)
