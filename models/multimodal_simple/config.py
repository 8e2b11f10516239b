"""The multimodal_simple ``model:`` keys, declared once (Model Zoo 2.10 ``models/multimodal/multimodal_simple``:
model.py MultimodalDecoderModelConfig, modeling_mmsimple.py MultimodalImageModelList / MultimodalImageModel):
its own keys, and its sections checked against their families' schemas: each ``image_model_list.image_models``
entry's ``image_encoder`` (``name: ViTModel``: :class:`ViTModelConfig`) and ``projection_layer``, the
``global_image_projection`` (``name: FeedForwardNetwork``: :class:`FeedForwardNetworkConfig`) and the
``text_model`` (``name: LlamaModel``: :class:`DecoderConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, Optional

from cs_run.models.common.config import DecoderConfig, key
from cs_run.models.common.sections import current_spelling, section_keys
from cs_run.models.vision_transformer.config import ViTModelConfig
from cs_run.models.vision_transformer.vision_tower import FeedForwardNetworkConfig

__all__ = ["MultimodalSimpleConfig", "ImageEncoder"]

TEXT_MODEL = ("LlamaModel", "llama")
"""The text model's ``name`` built here (the vendor's T5ForConditionalGeneration choice is not)."""
_LIST_KEYS = {"image_feature_select_mode": "patch", "image_models": [], "global_image_projection": None}
"""MultimodalImageModelList: its keys and defaults."""


def _named(value: object, where: str, name: str, config_class: type) -> object:
    """A ``name: <name>`` section built as ``config_class`` (its errors start at ``where``)."""
    keys = section_keys(value, where, (name,), config_class, "multimodal_simple")
    try:
        return config_class(**keys)
    except ValueError as e:
        raise ValueError(f"{where}.{e}") from None


@dataclass
class ImageEncoder:
    """One ``image_models`` entry, built: its ViT, the block its features come from (``image_layer_idx``;
    None: every block and the final norm) and its projection (None: identity)."""

    vit: ViTModelConfig
    projection: Optional[FeedForwardNetworkConfig]

    @property
    def width(self) -> int:
        return self.projection.layers_units[-1] if self.projection else self.vit.hidden_size


def _check_static_dual_expert(text: dict) -> dict:
    """``extra_ffn_params: {static_dual_expert: false}`` (the vendor's files) is the plain FFN: dropped; true (a
    second FFN for the image tokens, chosen by token_modality_idx) is refused by name."""
    if not isinstance(text, dict):
        return text
    extra = text.get("extra_ffn_params")
    if isinstance(extra, dict) and set(extra) <= {"static_dual_expert"}:
        if extra.get("static_dual_expert"):
            raise ValueError("text_model.extra_ffn_params.static_dual_expert: true (an image expert FFN per layer) "
                             "is not built here; set it false")
        text = {k: v for k, v in text.items() if k != "extra_ffn_params"}
    return text


def _current_entry(entry: object, where: str) -> object:
    """Release 2.3's spelling of an ``image_models`` entry, ``{image_model: [encoder, projection]}`` (the
    projection optional; its modeling_mmsimple built the same pair), as 2.4's ``image_encoder`` /
    ``projection_layer``."""
    if not (isinstance(entry, dict) and set(entry) == {"image_model"}):
        return entry
    parts = entry["image_model"]
    if not isinstance(parts, list) or not 1 <= len(parts) <= 2:
        raise ValueError(f"{where}.image_model: expected [image encoder] or [image encoder, projection] (Release "
                         f"2.3's spelling), got {parts!r}")
    return {"image_encoder": parts[0], "projection_layer": parts[1] if len(parts) == 2 else None}


@dataclass
class MultimodalSimpleConfig:
    """``model.name: multimodal_simple``: image encoders (each a ViT and an optional projection), a global
    projection of their concatenated features, and a Llama text model that reads them where
    ``image_data_loc`` says."""

    image_model_list: dict = key({}, "2.3.0", "image_feature_select_mode, image_models (each image_encoder: "
                                 "ViTModel, projection_layer: FeedForwardNetwork; 2.3: image_model: [encoder, "
                                 "projection]), global_image_projection")
    text_model: dict = key({}, "2.3.0", "the language model's keys (name: LlamaModel)")
    freeze: Optional[list] = key(None, "2.3.0", "regular expressions: matching modules and parameters are frozen")
    output_list: Optional[list] = key(None, "2.3.0", "intermediate outputs to return (the vendor's model returns "
                                      "only the loss too)")
    loss_scaling: Literal["num_tokens", "batch_size"] = key("num_tokens", "2.3.0",
                                                            "loss / scored tokens, or / batch size * loss_weight")
    loss_weight: float = key(0.0, "2.3.0", "factor of batch_size loss scaling")

    def __post_init__(self) -> None:
        """The sections built (``encoders``, ``global_projection``, ``text``) and their widths checked once."""
        if not isinstance(self.image_model_list, dict):
            raise ValueError(f"image_model_list: expected a mapping of {', '.join(_LIST_KEYS)}, got "
                             f"{self.image_model_list!r}")
        unknown = sorted(set(self.image_model_list) - set(_LIST_KEYS))
        if unknown:
            raise ValueError(f"image_model_list.{unknown[0]}: unknown key; expected one of {', '.join(_LIST_KEYS)}")
        keys = {**_LIST_KEYS, **self.image_model_list}
        self.image_feature_select_mode = keys["image_feature_select_mode"]
        if self.image_feature_select_mode not in ("patch", "cls_patch"):
            raise ValueError(f"image_model_list.image_feature_select_mode: {self.image_feature_select_mode!r}; "
                             "expected patch or cls_patch")
        models = keys["image_models"]
        if not isinstance(models, list) or not models:
            raise ValueError(f"image_model_list.image_models: expected a list of image_encoder / projection_layer "
                             f"entries, got {models!r}")
        self.encoders = []
        for i, entry in enumerate(models):
            where = f"image_model_list.image_models[{i}]"
            entry = _current_entry(entry, where)
            if not isinstance(entry, dict) or set(entry) - {"image_encoder", "projection_layer"} \
                    or "image_encoder" not in entry:
                raise ValueError(f"{where}: expected {{image_encoder: {{name: ViTModel, ...}}, projection_layer: "
                                 f"...}}, got keys {sorted(entry) if isinstance(entry, dict) else entry!r}")
            vit = _named(entry["image_encoder"], f"{where}.image_encoder", "ViTModel", ViTModelConfig)
            projection = None
            if entry.get("projection_layer") is not None:
                projection = _named(entry["projection_layer"], f"{where}.projection_layer", "FeedForwardNetwork",
                                    FeedForwardNetworkConfig)
                if projection.input_unit != vit.hidden_size:
                    raise ValueError(f"{where}.projection_layer.input_unit: {projection.input_unit} but its "
                                     f"image_encoder.hidden_size is {vit.hidden_size}")
            if self.image_feature_select_mode == "patch" and not vit.prepend_cls_token:
                raise ValueError(f"{where}.image_encoder.prepend_cls_token: false, but image_feature_select_mode "
                                 "patch drops the first feature as the cls token's; set it true or use cls_patch")
            self.encoders.append(ImageEncoder(vit, projection))
        sizes = {(e.vit.num_channels, *e.vit.image_size) for e in self.encoders}
        if len(sizes) > 1:
            raise ValueError(f"image_model_list.image_models: the encoders read one image but their num_channels, "
                             f"image_size differ ({sorted(sizes)})")
        widths = [e.width for e in self.encoders]
        if len(set(widths)) > 1:
            raise ValueError(f"image_model_list.image_models: their features are concatenated, but their widths "
                             f"differ ({widths}); project them to one width")
        self.global_projection = None
        if keys["global_image_projection"] is not None:
            self.global_projection = _named(keys["global_image_projection"], "image_model_list.global_image_projection",
                                            "FeedForwardNetwork", FeedForwardNetworkConfig)
            if self.global_projection.input_unit != widths[0]:
                raise ValueError(f"image_model_list.global_image_projection.input_unit: {self.global_projection.input_unit}"
                                 f" but the image features are {widths[0]} wide")
        text = section_keys(current_spelling(_check_static_dual_expert(self.text_model)), "text_model", TEXT_MODEL,
                            DecoderConfig, "multimodal_simple")
        text["compute_eval_metrics"] = False  # the vendor's multimodal_simple reports no text metrics
        self.text = DecoderConfig(**text)
        width = self.global_projection.layers_units[-1] if self.global_projection else widths[0]
        if width != self.text.hidden_size:
            raise ValueError(f"image_model_list: the image features are {width} wide but text_model.hidden_size is "
                             f"{self.text.hidden_size}; project them onto the text width")
        if self.loss_weight < 0:
            raise ValueError(f"loss_weight: must be >= 0, got {self.loss_weight}")

    @property
    def num_patches(self) -> int:
        """Image features per image (every encoder's, concatenated): what ``image_data_loc`` places."""
        total = 0
        for e in self.encoders:
            v = e.vit
            total += (v.image_size[0] // v.patch_size[0]) * (v.image_size[1] // v.patch_size[1]) + \
                int(self.image_feature_select_mode == "cls_patch")
        return total

    def keys(self) -> dict:
        """The resolved keys (what the run's params read)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
