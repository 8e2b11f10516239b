"""llava <-> Hugging Face LLaVA (``LlavaForConditionalGeneration``, model_type ``llava``): the model keys of an
HF config and the tensor map, through the decoders' adapter (:class:`cs_run.models.common.hf.HFAdapter`).

Names (transformers 5's modules; its save_pretrained, as transformers 4, writes ``language_model.model.*``,
``language_model.lm_head``, ``vision_tower.*`` (older files ``vision_tower.vision_model.*``) and
``multi_modal_projector.*``, which both ways read and ``--to hf`` writes):
``model.vision_tower.*`` -> ``model.image_model.*`` (the CLIP tower's map:
:mod:`cs_run.models.vision_transformer.clip`), ``model.multi_modal_projector.linear_1`` / ``linear_2`` ->
``model.projector_image_model.ffn.0`` / ``ffn.1.linear_layer``, ``model.language_model.*`` and ``lm_head``
-> ``model.text_model.*`` (llama's map, q/k rows permuted to interleaved RoPE).

HF splices the image features at its ``image_token_id`` tokens wherever they are; the Model Zoo's llava at
``image_start_idx`` (1 from an HF folder, the vendor converter's default), so the two agree on samples
whose placeholders start there. ``vision_feature_layer`` L (an index of HF's hidden states, whose first
is the embeddings) is block ``L - 1`` (L > 0) or ``N + L`` (L < 0) of an N-block tower here;
``vision_feature_select_strategy`` ``default`` is ``image_feature_select_mode: patch``, ``full`` is
``cls_patch``. HF's projector is two layers of the text width with one activation between; a model
outside that (another layer count, a different projector width) is refused by the key that differs.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from cs_run.errors import CheckpointError, ParamsError
from cs_run.models.common.hf import NOT_COMPUTED, HFAdapter, Taker, assign, build, check_weights, params_file_text
from cs_run.models.llama import hf as llama_hf
from cs_run.models.vision_transformer.clip import hf_vision_config, vision_from_hf, vision_keys_from_hf, vision_to_hf

__all__ = ["model_keys_from_hf_config", "from_hf_state_dict", "to_hf_state_dict", "hf_config", "runnable_params",
           "from_hf", "to_hf", "ADAPTER"]

# transformers 5's module prefixes; the files' (what save_pretrained writes, and transformers 4's)
_PREFIXES = {"vision": "model.vision_tower.", "projector": "model.multi_modal_projector.",
             "text": "model.language_model.", "head": "lm_head."}
_LEGACY = {"vision": "vision_tower.", "projector": "multi_modal_projector.",
           "text": "language_model.model.", "head": "language_model.lm_head."}
_VISION_MODEL = "vision_tower.vision_model."  # older files (the llava-hf hub folders): CLIPVisionModel's own prefix
_OURS = "model.image_model."


def model_keys_from_hf_config(cfg: dict) -> dict:
    """The ``model:`` section (Model Zoo keys) of an HF LLaVA config."""
    vision, text = cfg["vision_config"], cfg["text_config"]
    if text.get("model_type", "llama") != "llama":
        raise ValueError(f"'text_config.model_type' {text.get('model_type')!r} (cs-run's llava reads a llama text model)")
    if vision.get("model_type", "clip_vision_model") != "clip_vision_model":
        raise ValueError(f"'vision_config.model_type' {vision.get('model_type')!r} (cs-run's llava reads a CLIP tower)")
    layer = cfg.get("vision_feature_layer", -2)
    n = int(vision["num_hidden_layers"])
    if not isinstance(layer, int) or not (1 <= layer <= n or -n <= layer <= -1):
        raise ValueError(f"'vision_feature_layer' {layer!r} (one block's output: 1 .. {n} or -{n} .. -1)")
    strategy = cfg.get("vision_feature_select_strategy", "default")
    if strategy not in ("default", "full"):
        raise ValueError(f"'vision_feature_select_strategy' {strategy!r} (default or full)")
    text_keys = llama_hf.model_keys_from_hf_config(text)
    text_keys["name"] = "LlamaModel"
    text_keys["share_embedding_weights"] = bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    bias = bool(cfg.get("multimodal_projector_bias", True))
    width = text_keys["hidden_size"]
    return {
        "name": "llava", "image_model": {"name": "ViTModel", **vision_keys_from_hf(vision)}, "text_model": text_keys,
        "projector": {"image_model": {"name": "FeedForwardNetwork", "input_unit": vision["hidden_size"],
                                      "layers_units": [width, width],
                                      "layers_activation": [cfg.get("projector_hidden_act", "gelu"), None],
                                      "use_bias": bias}},
        "image_feature_select_layer_idx": layer - 1 if layer > 0 else n + layer,
        "image_feature_select_mode": "patch" if strategy == "default" else "cls_patch",
        "image_start_idx": 1, "loss_scaling": "num_tokens", "loss_weight": 1.0,
    }


class _Text(nn.Module):
    """The text model as llama's adapter sees a decoder LM: ``.model`` (the DecoderLM) and ``.config``."""

    def __init__(self, llava) -> None:
        super().__init__()
        self.model = llava.model.text_model
        self.config = llava.model.text_config


def _current_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A file's names (either layout of :func:`_layout`) as transformers 5's modules'."""
    out = {}
    for name, value in tensors.items():
        if name.startswith(_VISION_MODEL):
            name = _LEGACY["vision"] + name[len(_VISION_MODEL):]
        for part, old in _LEGACY.items():
            if name.startswith(old):
                name = _PREFIXES[part] + name[len(old):]
                break
        out[name] = value
    return out


def from_hf_state_dict(model, tensors: dict[str, torch.Tensor]) -> None:
    """Copy HF LlavaForConditionalGeneration tensors into ``model`` (built of :func:`model_keys_from_hf_config`)."""
    tensors = _current_names(tensors)
    text_prefix, head = _PREFIXES["text"], _PREFIXES["head"]
    text = {("model." + k[len(text_prefix):] if k.startswith(text_prefix) else k): v for k, v in tensors.items()
            if k.startswith((text_prefix, head))}
    llama_hf.from_hf_state_dict(_Text(model), text)
    t = Taker({k: v for k, v in tensors.items() if not k.startswith((text_prefix, head))})
    have = model.state_dict()
    out = vision_from_hf(t, _PREFIXES["vision"], _OURS, have, len(model.model.image_model.encoder.transformer_encoder
                                                                   .layers))
    projector = _projector_layers(model)
    out.update(t.renamed(projector, have, _PREFIXES["projector"], "model.projector_image_model."))
    t.check_all_used()
    # the text model's own parameters (llama's adapter assigned them above) complete the check of every one
    out.update({f"model.text_model.{k}": v.detach() for k, v in model.model.text_model.named_parameters()})
    assign(model, out)


def _projector_layers(model) -> tuple:
    projector = model.model.projector_image_model
    if projector is None or len(projector.ffn) != 2:
        raise CheckpointError("llava: Hugging Face's projector is two linear layers (linear_1, linear_2); this model's "
                              f"has {0 if projector is None else len(projector.ffn)}")
    return (("linear_1", "ffn.0.linear_layer"), ("linear_2", "ffn.1.linear_layer"))


def _layout(names) -> dict:
    """to_hf_state_dict's keywords for a file of these names: transformers 5's modules' (``legacy`` false), the
    files save_pretrained writes, or with ``vision_model`` the older files' tower prefix."""
    names = list(names)
    return {"legacy": not any(n.startswith(tuple(_PREFIXES.values())) for n in names),
            "vision_model": any(n.startswith(_VISION_MODEL) for n in names)}


def to_hf_state_dict(model, legacy: bool = True, vision_model: bool = False) -> dict[str, torch.Tensor]:
    """HF LlavaForConditionalGeneration tensors of a llava model (the inverse of :func:`from_hf_state_dict`),
    named as save_pretrained writes them (``legacy``; ``vision_model``: the tower under
    ``vision_tower.vision_model.``), else as transformers 5's modules."""
    prefixes = dict(_LEGACY if legacy else _PREFIXES)
    if legacy and vision_model:
        prefixes["vision"] = _VISION_MODEL
    text = llama_hf.to_hf_state_dict(_Text(model))
    out = {}
    for name, value in text.items():
        out[prefixes["head"] + name[len("lm_head."):] if name.startswith("lm_head.")
            else prefixes["text"] + name[len("model."):]] = value
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    n = len(model.model.image_model.encoder.transformer_encoder.layers)
    out.update(vision_to_hf(sd, prefixes["vision"], _OURS, n))
    for hf, ours in _projector_layers(model):
        for kind in ("weight", "bias"):
            if f"model.projector_image_model.{ours}.{kind}" in sd:
                out[f"{prefixes['projector']}{hf}.{kind}"] = sd[f"model.projector_image_model.{ours}.{kind}"]
    return {k: v.contiguous().clone() for k, v in out.items()}


def hf_config(config: dict) -> dict:
    """The HF ``config.json`` (LlavaForConditionalGeneration) of a llava model's keys."""
    r = build({**config, "name": "llava"}, meta=True).model.resolved
    vision = hf_vision_config(r["image_model"])
    text = llama_hf.hf_config({**r["text_model"], "name": "llama"})
    projector = r["projector"] or {}
    acts = projector.get("layers_activation") or [None]
    n = vision["num_hidden_layers"]
    return {
        "architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
        "vision_config": vision, "text_config": text,
        "projector_hidden_act": acts[0] or "linear", "multimodal_projector_bias": bool(projector.get("use_bias", True)),
        "vision_feature_layer": r["image_feature_select_layer_idx"] - n,
        "vision_feature_select_strategy": "default" if r["image_feature_select_mode"] == "patch" else "full",
        "tie_word_embeddings": text["tie_word_embeddings"], "image_token_index": text["vocab_size"] - 1,
        "image_seq_length": (vision["image_size"] // vision["patch_size"]) ** 2, "torch_dtype": "float32",
    }


def _differences(ours: dict, theirs: dict, path: str = ""):
    """``(key path, ours, theirs)`` of each computed key whose value differs (dropout and initializers aside)."""
    for key, value in ours.items():
        if any(word in key for word in NOT_COMPUTED):
            continue
        other = theirs.get(key) if isinstance(theirs, dict) else None
        if isinstance(value, dict) and isinstance(other, dict):
            yield from _differences(value, other, f"{path}{key}.")
        elif value != other:
            yield f"{path}{key}", value, other


class LlavaAdapter(HFAdapter):
    """The adapter with llava's own header check (two towers' layer counts) and read-back."""

    def check_header(self, found: dict[str, tuple], keys: dict, where: str) -> None:
        """``found`` (the file's names -> shapes) are the tensors of the model ``keys`` describe, each tower's
        layers counted (capped by the file's tensor count, so an absurd config allocates nothing)."""
        cap = len(found)
        small = {**keys, **{tower: {**keys[tower], "num_hidden_layers": min(keys[tower]["num_hidden_layers"], cap)}
                            for tower in ("image_model", "text_model")}}
        small["image_feature_select_layer_idx"] = min(keys["image_feature_select_layer_idx"],
                                                      small["image_model"]["num_hidden_layers"] - 1)
        expected = {k: tuple(v.shape) for k, v in
                    self.to_state_dict(build(small, meta=True), **self.file_layout(found)).items()}
        towers = {"image_model": (re.compile(r"vision_tower\.(?:vision_model\.)?encoder\.layers\.(\d+)\."),
                                  "vision_config"),
                  "text_model": (re.compile(r"language_model\.(?:model\.)?layers\.(\d+)\."), "text_config")}
        for tower, (layer, section) in towers.items():
            n = keys[tower]["num_hidden_layers"]
            in_file = sorted({int(m.group(1)) for name in found if (m := layer.search(name))})
            check_weights({k: v for k, v in found.items() if layer.search(k)},
                          {k: v for k, v in expected.items() if layer.search(k)}, {}, in_file,
                          f"{section}.num_hidden_layers {n}", n, where, f"{section}.num_hidden_layers")
        other = re.compile(r"layers\.\d+\.")
        text = keys["text_model"]
        head = (_LEGACY if self.file_layout(found)["legacy"] else _PREFIXES)["head"] + "weight"
        optional = {head: (text["vocab_size"], text["hidden_size"])} if text.get("share_embedding_weights") else {}
        check_weights({k: v for k, v in found.items() if not other.search(k)},
                      {k: v for k, v in expected.items() if not other.search(k)}, optional, [0], "", 1, where,
                      "the hidden sizes, vocab_size, image_size, patch_size, multimodal_projector_bias")

    def check_expressible(self, model, model_keys: dict, config: dict) -> None:
        """The HF ``config`` read back builds a model computing the same: else a ParamsError naming the key."""
        back = build(model_keys_from_hf_config(config), meta=True).model.resolved
        ours = {k: v for k, v in model.model.resolved.items() if k != "image_start_idx"}
        for key, value, theirs in _differences(ours, back):
            raise ParamsError(f"params: model.{key}: {value!r} has no Hugging Face llava equivalent (its config "
                              f"gives {theirs!r}); convert a model without it")


def runnable_params(model_keys: dict, hf_dir: Path, checkpoint: Path) -> str:
    """The params file ``--from hf`` writes beside the checkpoint: the folder's ``model:`` keys plus
    LlavaHDF5MapDataProcessor inputs at the tower's image size (the vendor llava files' transforms), AdamW and
    a runconfig; it runs once the data_dir and img_data_dir placeholders name llava samples and images."""
    size = model_keys["image_model"]["image_size"]

    def data(shuffle: bool) -> dict:
        transforms = [{"name": "expand_to_square", "background_color": [122, 116, 104]},
                      {"name": "resize", "size": size[0], "interpolation": "bicubic"},
                      {"name": "center_crop", "size": size[0]}, {"name": "to_tensor"},
                      {"name": "normalize", "mean": [0.48145466, 0.4578275, 0.40821073],
                       "std": [0.26862954, 0.26130258, 0.27577711]}]
        return {"data_processor": "LlavaHDF5MapDataProcessor", "data_dir": None, "img_data_dir": None,
                "image_data_size": [model_keys["image_model"]["num_channels"], *size], "transforms": transforms,
                "batch_size": 8, "shuffle": shuffle, **({"shuffle_seed": 1} if shuffle else {}), "num_workers": 0}
    sections = {
        "train_input": data(True), "eval_input": data(False), "model": model_keys,
        "optimizer": {"optimizer_type": "AdamW", "betas": [0.9, 0.999], "eps": 1.0e-8, "max_gradient_norm": 1.0,
                      "learning_rate": 2.0e-5},
        "runconfig": {"max_steps": 1000, "log_steps": 10, "checkpoint_steps": 200, "seed": 1},
    }
    return params_file_text(model_keys["name"], hf_dir, checkpoint, sections,
                            "data_dir (llava samples: *.h5 of data [n, 4, msl] and img_path) and img_data_dir\n"
                            "# (the images they name) in both inputs.", "a folder of llava *.h5 samples",
                            img_data_dir="the folder of their images")


ADAPTER = LlavaAdapter(model_keys_from_hf_config, hf_config, from_hf_state_dict, to_hf_state_dict,
                       file_layout=_layout, label="LLaVA", params_text=runnable_params)
from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf
