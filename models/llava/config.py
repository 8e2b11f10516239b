"""The llava ``model:`` keys, declared once (Model Zoo 2.10 ``models/multimodal/llava/model.py``
LlavaModelConfig): its own keys, and its three sections checked against their families' schemas:
``image_model`` (``name: ViTModel``, the ViT trunk's keys: :class:`ViTModelConfig`), ``text_model``
(``name: LlamaModel``, the decoder's keys: :class:`DecoderConfig`) and ``projector.image_model``
(``name: FeedForwardNetwork``: :class:`ProjectorConfig`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Literal, Optional

from cs_run.models.common.config import DecoderConfig, key
from cs_run.models.common.sections import current_spelling, section_keys
from cs_run.models.vision_transformer.config import ViTModelConfig
from cs_run.models.vision_transformer.vision_tower import FeedForwardNetworkConfig

__all__ = ["LlavaConfig", "ProjectorConfig", "IMAGE_MODEL", "TEXT_MODEL", "PROJECTOR"]

IMAGE_MODEL, TEXT_MODEL, PROJECTOR = ("ViTModel",), ("LlamaModel", "llama"), ("FeedForwardNetwork",)
"""The ``name`` each section takes (the vendor's discriminators that the 2.10 llava builds)."""


@dataclass
class ProjectorConfig(FeedForwardNetworkConfig):
    """``projector.image_model``: the vendor's FeedForwardNetwork (its keys and checks:
    :class:`FeedForwardNetworkConfig`), with llava's defaults. Its weights start kaiming-uniform with a =
    sqrt(5) and its biases zero whatever the file says (the vendor's ``update_projector`` overrides both)."""

    input_unit: int = key(1024, "2.2.0", "input width (image_model.hidden_size)")
    layers_units: list = key([4096, 4096], "2.2.0", "output width of each layer (the last: text_model.hidden_size)")
    use_bias: bool = key(True, "2.2.0", "the layers' biases")
    kernel_initializer: object = key("xavier_uniform", "2.2.0", "replaced by kaiming_uniform(a=sqrt(5)) in llava")
    bias_initializer: object = key("zeros", "2.2.0", "replaced by zeros in llava")
    output_layer_initializer: object = key(None, "2.2.0", "unused by llava's projector")

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ValueError as e:
            raise ValueError(f"projector.image_model.{e}") from None
        self.kernel_initializer = {"name": "kaiming_uniform", "a": math.sqrt(5)}
        self.bias_initializer = "zeros"
        self.output_layer_initializer = None


@dataclass
class LlavaConfig:
    """``model.name: llava``: a ViT image model, a projector, a Llama text model."""

    image_model: dict = key({}, "2.2.0", "the image tower's keys (name: ViTModel, CLIP's settings)")
    text_model: dict = key({}, "2.2.0", "the language model's keys (name: LlamaModel)")
    projector: Optional[dict] = key(None, "2.2.0", "image_model: the projector's keys (name: FeedForwardNetwork)")
    freeze: Optional[list] = key(None, "2.2.0", "regular expressions: matching modules and parameters are frozen")
    image_feature_select_layer_idx: Optional[int] = key(-1, "2.2.0", "the image layer whose output is used (negative from the end)")
    image_start_idx: int = key(1, "2.2.0", "the text position where the image features start")
    image_feature_select_mode: Literal["patch", "cls_patch"] = key("patch", "2.2.0", "patch: drop the cls token's feature")
    loss_scaling: Literal["num_tokens", "batch_size"] = key("num_tokens", "2.2.0", "loss / scored tokens, or / batch size * loss_weight")
    loss_weight: float = key(1.0, "2.2.0", "factor of batch_size loss scaling")
    moe: Optional[dict] = key(None, "2.4.0", "the text model's experts (refused: Llama here)")
    def __post_init__(self) -> None:
        """Each section built as its family's config (``vit``, ``text``, ``projector_config``), every check once."""
        if self.moe:
            raise ValueError("moe: a mixture-of-experts text model is not built for llava here; leave it unset")
        self.vit = ViTModelConfig(**section_keys(self.image_model, "image_model", IMAGE_MODEL, ViTModelConfig, "llava"))
        text = section_keys(current_spelling(self.text_model), "text_model", TEXT_MODEL, DecoderConfig, "llava")
        text["compute_eval_metrics"] = False  # the vendor's llava reports no text metrics
        self.text = DecoderConfig(**text)
        self.projector_config = None
        if self.projector is not None:
            if not isinstance(self.projector, dict) or set(self.projector) - {"image_model"}:
                raise ValueError(f"projector: expected {{image_model: {{name: {PROJECTOR[0]}, ...}}}}, got "
                                 f"{self.projector!r} (a text_model projector is not built here)")
            if "image_model" in self.projector:
                keys = section_keys(self.projector["image_model"], "projector.image_model", PROJECTOR, ProjectorConfig,
                                    "llava")
                self.projector_config = ProjectorConfig(**keys)
        width = self.projector_config.layers_units[-1] if self.projector_config else self.vit.hidden_size
        if self.projector_config and self.projector_config.input_unit != self.vit.hidden_size:
            raise ValueError(f"projector.image_model.input_unit: {self.projector_config.input_unit} but "
                             f"image_model.hidden_size is {self.vit.hidden_size}")
        if width != self.text.hidden_size:
            what = "projector.image_model.layers_units[-1]" if self.projector_config else \
                "projector: none, and image_model.hidden_size"
            raise ValueError(f"{what}: {width} but text_model.hidden_size is {self.text.hidden_size}; the model "
                             "needs a projector onto the text width")
        n = self.vit.num_hidden_layers
        idx = -1 if self.image_feature_select_layer_idx is None else self.image_feature_select_layer_idx
        if not -n <= idx < n:
            raise ValueError(f"image_feature_select_layer_idx: {idx} is not a layer of image_model's {n}")
        self.image_feature_select_layer_idx = idx % n
        if self.loss_weight <= 0:
            raise ValueError(f"loss_weight: must be > 0, got {self.loss_weight}")
        if self.image_start_idx < 0:
            raise ValueError(f"image_start_idx: must be >= 0, got {self.image_start_idx}")

    @property
    def num_patches(self) -> int:
        """Image features per sample: the patches, plus the cls token's with ``cls_patch``."""
        v = self.vit
        patches = (v.image_size[0] // v.patch_size[0]) * (v.image_size[1] // v.patch_size[1])
        return patches + int(self.image_feature_select_mode == "cls_patch" and v.prepend_cls_token)

    def keys(self) -> dict:
        """The resolved keys (what the run's params and the HF adapter read)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
