"""The vision_transformer ``model:`` keys, declared once: their names, types and Model Zoo 2.10 defaults
(ViTModel.ViTModelConfig, ViTClassificationModel.ViTClassificationModelConfig, model.py's
VisionTransformerModelConfig). :class:`ViTModelConfig` is the trunk's (dino, llava and multimodal_simple
reuse it); :class:`VisionTransformerConfig` adds the classifier's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from cs_run.models.common.activations import ACTIVATIONS
from cs_run.models.common.config import Initializer, key
from cs_run.models.common.initializers import initializer_spec, truncated_normal

__all__ = ["ViTModelConfig", "VisionTransformerConfig"]


_EMBEDDING_INITS = ("projection_initializer", "position_embedding_initializer", "cls_token_initializer")


_INTERPOLATION = {"antialias": False, "interpolate_offset": 0.1, "local_patch_dims": [7, 7]}
"""The vendor's InterpolatePositionEmbeddingConfig: its keys and defaults."""


def _interpolation(value: object, position_embedding_type: Optional[str]) -> dict:
    """``interpolate_position_embedding`` with its defaults filled in, every key checked."""
    where = "interpolate_position_embedding"
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a mapping of {', '.join(_INTERPOLATION)}, got {value!r}")
    unknown = sorted(set(value) - set(_INTERPOLATION))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown key; expected one of {', '.join(_INTERPOLATION)}")
    out = {**_INTERPOLATION, **value}
    dims = out["local_patch_dims"]
    if not (isinstance(dims, list) and len(dims) == 2 and all(isinstance(d, int) and d > 0 for d in dims)):
        raise ValueError(f"{where}.local_patch_dims: expected [rows, columns] of positive integers, got {dims!r}")
    if not isinstance(out["antialias"], bool):
        raise ValueError(f"{where}.antialias: expected true or false, got {out['antialias']!r}")
    if not isinstance(out["interpolate_offset"], (int, float)) or isinstance(out["interpolate_offset"], bool):
        raise ValueError(f"{where}.interpolate_offset: expected a number, got {out['interpolate_offset']!r}")
    if position_embedding_type != "learned":
        raise ValueError(f"{where}: interpolates a learned table; position_embedding_type is "
                         f"{position_embedding_type!r}")
    return out


@dataclass
class ViTModelConfig:
    """The ViT trunk: patch embedding, encoder, optional pooler."""

    hidden_size: int = key(768, "2.2.0", 'model width')
    num_hidden_layers: int = key(12, "2.2.0", 'encoder layers')
    num_heads: int = key(12, "2.2.0", 'attention heads')
    filter_size: int = key(3072, "2.2.0", 'FFN inner width')
    image_size: list = key([224, 224], "2.2.0", 'input [height, width]')
    patch_size: list = key([16, 16], "2.2.0", 'patch [height, width]')
    num_channels: int = key(3, "2.2.0", 'input channels')
    layer_norm_epsilon: float = key(1.0e-5, "2.2.0", "layer norms' epsilon")
    nonlinearity: str = key("gelu", "2.2.0", 'FFN activation')
    pooler_nonlinearity: Optional[str] = key(None, "2.2.0", 'pooler activation; None: nonlinearity')
    dropout_rate: float = key(0.1, "2.2.0", 'attention-output and FFN dropout')
    attention_dropout_rate: float = key(0.0, "2.2.0", 'attention-probability dropout')
    embedding_dropout_rate: float = key(0.0, "2.2.0", 'dropout after the embeddings')
    attention_module: str = key("aiayn_attention", "2.2.0", 'aiayn_attention or multiquery_attention (see extra_attention_params)')
    extra_attention_params: dict = key({}, "2.2.0", 'num_kv_groups of multiquery_attention')
    attention_type: str = key("scaled_dot_product", "2.2.0", 'scaled_dot_product divides q by sqrt(head width)')
    attention_softmax_fp32: bool = key(True, "2.2.0", 'softmax in float32 under mixed precision')
    use_projection_bias_in_attention: bool = key(True, "2.2.0", 'q/k/v biases')
    use_ffn_bias_in_attention: bool = key(True, "2.2.0", 'attention output bias')
    use_ffn_bias: bool = key(True, "2.2.0", 'FFN and pooler biases')
    norm_first: bool = key(True, "2.2.0", 'pre-norm blocks (post-norm when false)')
    use_final_layer_norm: bool = key(True, "2.2.0", 'a layer norm after the last block')
    position_embedding_type: Optional[str] = key("learned", "2.2.0", "learned, or None (the vendor's fixed sin-cos is refused here)")
    interpolate_position_embedding: Optional[dict] = key(None, "2.4.0", "positions of smaller images (DINOv2's local crops) "
                                                         "by bicubic interpolation: antialias, interpolate_offset, "
                                                         "local_patch_dims")
    use_conv_patchified_embedding: bool = key(False, "2.2.0", 'a Conv2d patch projection; else a Linear over (row, column, channel)')
    prepend_cls_token: bool = key(True, "2.2.0", "a learned cls token first (its position row is the table's last)")
    use_post_embed_layer_norm: bool = key(False, "2.2.0", 'a layer norm after the embeddings')
    use_embed_proj_bias: bool = key(True, "2.2.0", "the patch projection's bias")
    use_encoder_pooler_layer: bool = key(False, "2.2.0", "a dense + activation pooler on the first token; else the first token's state")
    use_masked_patches: bool = key(False, "2.4.0", 'a mask_token replacing masked patches (DINOv2)')
    initializer_range: float = key(0.02, "2.2.0", 'std of the default truncated normal (cut at two std)')
    default_initializer: Initializer = key(None, "2.2.0", "None: truncated normal of initializer_range (classifier, fallback)")
    attention_initializer: Initializer = key(None, "2.2.0", 'None: default_initializer')
    ffn_initializer: Initializer = key(None, "2.2.0", 'None: default_initializer')
    pooler_initializer: Initializer = key(None, "2.2.0", 'None: default_initializer')
    projection_initializer: Initializer = key(None, "2.2.0", 'None: truncated normal of initializer_range')
    position_embedding_initializer: Initializer = key(None, "2.2.0", 'None: truncated normal of initializer_range')
    cls_token_initializer: Initializer = key(None, "2.3.1", 'None: truncated normal of initializer_range')
    image_layer_idx: Optional[int] = key(None, "2.3.0", 'the layer whose features a multimodal model takes (negative from the end)')
    layerscale_value: Optional[float] = key(None, "2.3.1", 'per-channel residual-branch scales starting at this value; None: none')
    stochastic_depth_drop_prob: float = key(0.0, "2.3.1", "residual-branch drop probability while training (last layer's, with linear)")
    stochastic_depth_drop_prob_schedule: str = key("linear", "2.3.1", 'linear (0 .. p over the layers) or constant')
    stochastic_depth_mode: str = key("batch", "2.3.1", 'batch (one draw per batch) or row (per sample)')

    def __post_init__(self) -> None:
        """Every check once, naming its key (ValueError: the registry words it as a params error)."""
        for name in ("image_size", "patch_size"):
            value = getattr(self, name)
            if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value)):
                raise ValueError(f"{name}: expected [height, width] of positive integers, got {value!r}")
        for i, (size, patch) in enumerate(zip(self.image_size, self.patch_size)):
            if size % patch:
                raise ValueError(f"patch_size: {self.patch_size} does not divide image_size {self.image_size} "
                                 f"({'height' if i == 0 else 'width'})")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads: {self.num_heads} does not divide hidden_size {self.hidden_size}")
        for name in ("dropout_rate", "attention_dropout_rate", "embedding_dropout_rate", "stochastic_depth_drop_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}: must be in [0, 1], got {getattr(self, name)}")
        for name in ("nonlinearity", "pooler_nonlinearity"):
            value = getattr(self, name)
            if value is not None and value.lower() not in ACTIVATIONS:
                raise ValueError(f"{name}: unknown {value!r}; expected one of {', '.join(ACTIVATIONS)}")
        choices = {"attention_module": ("aiayn_attention", "multiquery_attention"),
                   "attention_type": ("dot_product", "scaled_dot_product"),
                   "position_embedding_type": ("learned", None),
                   "stochastic_depth_drop_prob_schedule": ("linear", "constant"),
                   "stochastic_depth_mode": ("batch", "row")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                extra = " (the vendor's fixed sin-cos table is not built here)" if name == "position_embedding_type" \
                    else ""
                raise ValueError(f"{name}: {getattr(self, name)!r} is not one of "
                                 f"{', '.join(str(a) for a in allowed)}{extra}")
        if self.interpolate_position_embedding is not None:
            self.interpolate_position_embedding = _interpolation(self.interpolate_position_embedding,
                                                                 self.position_embedding_type)
        if self.image_layer_idx is not None:
            if not -self.num_hidden_layers <= self.image_layer_idx < self.num_hidden_layers:
                raise ValueError(f"image_layer_idx: {self.image_layer_idx} is not a layer of num_hidden_layers "
                                 f"{self.num_hidden_layers}")
            self.image_layer_idx %= self.num_hidden_layers
        if self.default_initializer is None:
            self.default_initializer = truncated_normal(self.initializer_range)
        for name in ("default_initializer", "attention_initializer", "ffn_initializer", "pooler_initializer",
                     "projection_initializer", "position_embedding_initializer", "cls_token_initializer"):
            value = getattr(self, name)
            # the embedding's three default to its own truncated normal, not default_initializer (the vendor's)
            fallback = truncated_normal(self.initializer_range) if name in _EMBEDDING_INITS else self.default_initializer
            setattr(self, name, initializer_spec(fallback if value is None else value, name))

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

    num_classes: int = key(2, "2.2.0", 'classes')
    attention_dropout_rate: float = key(0.1, "2.2.0", 'attention-probability dropout')
    use_bias_in_output: bool = key(True, "2.2.0", "the classifier's bias")
    use_dinov2_classifier: bool = key(False, "2.3.1", "classify the cls token with the patch tokens' mean")
    freeze: Optional[list] = key(None, "2.4.3", 'regular expressions; matching parameters are not trained')
    compute_eval_metrics: bool = key(True, "2.2.0", 'eval/accuracy_cls in eval')

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_classes < 1:
            raise ValueError(f"num_classes: must be >= 1, got {self.num_classes}")
        if self.use_dinov2_classifier and not self.prepend_cls_token:
            raise ValueError("use_dinov2_classifier: needs prepend_cls_token: true")
