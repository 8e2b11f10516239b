"""The vision_transformer ``model:`` keys, declared once: their names, types and Model Zoo 2.10 defaults
(ViTModel.ViTModelConfig, ViTClassificationModel.ViTClassificationModelConfig, model.py's
VisionTransformerModelConfig). :class:`ViTModelConfig` is the trunk's (dino, llava and multimodal_simple
reuse it); :class:`VisionTransformerConfig` adds the classifier's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from cs_run.models.common.activations import ACTIVATIONS
from cs_run.models.common.initializers import initializer_spec, truncated_normal

__all__ = ["ViTModelConfig", "VisionTransformerConfig"]

Initializer = Optional[Union[str, dict]]
_EMBEDDING_INITS = ("projection_initializer", "position_embedding_initializer", "cls_token_initializer")


@dataclass
class ViTModelConfig:
    """The ViT trunk: patch embedding, encoder, optional pooler."""

    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_heads: int = 12
    filter_size: int = 3072
    image_size: list = field(default_factory=lambda: [224, 224])
    patch_size: list = field(default_factory=lambda: [16, 16])
    num_channels: int = 3
    layer_norm_epsilon: float = 1.0e-5
    nonlinearity: str = "gelu"
    pooler_nonlinearity: Optional[str] = None
    """None: ``nonlinearity``."""
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.0
    embedding_dropout_rate: float = 0.0
    attention_module: str = "aiayn_attention"
    extra_attention_params: dict = field(default_factory=dict)
    """``num_kv_groups`` with ``attention_module: multiquery_attention``."""
    attention_type: str = "scaled_dot_product"
    attention_softmax_fp32: bool = True
    use_projection_bias_in_attention: bool = True
    use_ffn_bias_in_attention: bool = True
    use_ffn_bias: bool = True
    norm_first: bool = True
    use_final_layer_norm: bool = True
    position_embedding_type: Optional[str] = "learned"
    """``learned`` or None here (the vendor's ``fixed`` sin-cos table is not built)."""
    interpolate_position_embedding: Optional[dict] = None
    use_conv_patchified_embedding: bool = False
    """A Conv2d over patches; else a Linear over patches flattened as (row, column, channel)."""
    prepend_cls_token: bool = True
    use_post_embed_layer_norm: bool = False
    use_embed_proj_bias: bool = True
    use_encoder_pooler_layer: bool = False
    use_masked_patches: bool = False
    initializer_range: float = 0.02
    default_initializer: Initializer = None
    """None: truncated normal, std ``initializer_range``, cut at two std (the other initializers' default)."""
    attention_initializer: Initializer = None
    ffn_initializer: Initializer = None
    pooler_initializer: Initializer = None
    projection_initializer: Initializer = None
    position_embedding_initializer: Initializer = None
    cls_token_initializer: Initializer = None
    image_layer_idx: Optional[int] = None
    layerscale_value: Optional[float] = None
    stochastic_depth_drop_prob: float = 0.0
    stochastic_depth_drop_prob_schedule: str = "linear"
    stochastic_depth_mode: str = "batch"

    def __post_init__(self) -> None:
        """Every check once, naming its key (ValueError: the registry words it as a params error)."""
        for key in ("image_size", "patch_size"):
            value = getattr(self, key)
            if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value)):
                raise ValueError(f"{key}: expected [height, width] of positive integers, got {value!r}")
        for i, (size, patch) in enumerate(zip(self.image_size, self.patch_size)):
            if size % patch:
                raise ValueError(f"patch_size: {self.patch_size} does not divide image_size {self.image_size} "
                                 f"({'height' if i == 0 else 'width'})")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads: {self.num_heads} does not divide hidden_size {self.hidden_size}")
        for key in ("dropout_rate", "attention_dropout_rate", "embedding_dropout_rate", "stochastic_depth_drop_prob"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"{key}: must be in [0, 1], got {getattr(self, key)}")
        for key in ("nonlinearity", "pooler_nonlinearity"):
            value = getattr(self, key)
            if value is not None and value.lower() not in ACTIVATIONS:
                raise ValueError(f"{key}: unknown {value!r}; expected one of {', '.join(ACTIVATIONS)}")
        choices = {"attention_module": ("aiayn_attention", "multiquery_attention"),
                   "attention_type": ("dot_product", "scaled_dot_product"),
                   "position_embedding_type": ("learned", None),
                   "stochastic_depth_drop_prob_schedule": ("linear", "constant"),
                   "stochastic_depth_mode": ("batch", "row")}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                extra = " (the vendor's fixed sin-cos table is not built here)" if key == "position_embedding_type" \
                    else ""
                raise ValueError(f"{key}: {getattr(self, key)!r} is not one of "
                                 f"{', '.join(str(a) for a in allowed)}{extra}")
        if self.interpolate_position_embedding is not None:
            raise ValueError("interpolate_position_embedding: position-embedding interpolation is not built in "
                             "cs-run; leave it null")
        if self.image_layer_idx is not None:
            if not -self.num_hidden_layers <= self.image_layer_idx < self.num_hidden_layers:
                raise ValueError(f"image_layer_idx: {self.image_layer_idx} is not a layer of num_hidden_layers "
                                 f"{self.num_hidden_layers}")
            self.image_layer_idx %= self.num_hidden_layers
        if self.default_initializer is None:
            self.default_initializer = truncated_normal(self.initializer_range)
        for key in ("default_initializer", "attention_initializer", "ffn_initializer", "pooler_initializer",
                    "projection_initializer", "position_embedding_initializer", "cls_token_initializer"):
            value = getattr(self, key)
            # the embedding's three default to its own truncated normal, not default_initializer (the vendor's)
            fallback = truncated_normal(self.initializer_range) if key in _EMBEDDING_INITS else self.default_initializer
            setattr(self, key, initializer_spec(fallback if value is None else value, key))

    @property
    def num_kv_groups(self) -> Optional[int]:
        if self.attention_module != "multiquery_attention":
            return None
        groups = (self.extra_attention_params or {}).get("num_kv_groups")
        if not isinstance(groups, int) or groups < 1 or self.num_heads % groups:
            raise ValueError(f"extra_attention_params.num_kv_groups: multiquery_attention needs a divisor of "
                             f"num_heads {self.num_heads}, got {groups!r}")
        return groups


@dataclass
class VisionTransformerConfig(ViTModelConfig):
    """``model.name: vision_transformer``: the trunk, a linear classifier on the pooled state, cross entropy."""

    num_classes: int = 2
    attention_dropout_rate: float = 0.1
    use_bias_in_output: bool = True
    use_dinov2_classifier: bool = False
    """Classify the cls token concatenated with the patch tokens' mean."""
    freeze: Optional[list] = None
    """Regular expressions; parameters whose names match one are not trained."""
    compute_eval_metrics: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_classes < 1:
            raise ValueError(f"num_classes: must be >= 1, got {self.num_classes}")
        if self.use_dinov2_classifier and not self.prepend_cls_token:
            raise ValueError("use_dinov2_classifier: needs prepend_cls_token: true")
