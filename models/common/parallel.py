"""The Model Zoo's GPT-J decoder (gptj/gptj_model.py GPTJSubModelConfig + gptj/model.py), which ``gptj``,
``gpt-neox`` and ``falcon`` are (each a subclass of :class:`ParallelDecoderConfig` under its own name, as
the vendor's FalconModelConfig is its GPTJModelConfig): parallel blocks (attention and FFN both read the
layer input, ``use_untied_layer_norm`` gives the FFN its own norm), rotary positions, its own defaults
(``use_ffn_bias: false``, dropout under the name ``residual_dropout_rate``) and initializer rules. The
blocks and the rest are the shared decoder LM's (:func:`cs_run.models.common.lm.build`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, Optional

from cs_run.models.common.config import BaseDecoderConfig, DecoderConfig, Initializer, key
from cs_run.models.common.initializers import scale_spec
from cs_run.models.common.lm import BlockLayout, DecoderLMModel, build

__all__ = ["ParallelDecoderConfig", "build_parallel"]


@dataclass(kw_only=True)
class ParallelDecoderConfig(BaseDecoderConfig):
    """The GPT-J config's keys: the shared decoder keys with GPT-J's defaults, and three of its own."""

    position_embedding_type: Optional[Literal["learned", "fixed", "relative", "rotary"]] = key(
        "rotary", "1.6.0", "learned, fixed (sinusoidal) or rotary")
    num_relative_attention_buckets: Optional[int] = key(None, "1.6.0", "T5-style relative buckets (refused)")
    dropout_rate: Optional[float] = key(None, "1.6.0", "residual and FFN dropout (or residual_dropout_rate); "
                                                       "neither: 0.1")
    residual_dropout_rate: Optional[float] = key(None, "1.7.0", "GPT-J's name of dropout_rate")
    use_ffn_bias: bool = key(False, "1.6.0", "FFN biases")
    use_untied_layer_norm: bool = key(False, "1.7.0", "a second norm for the FFN input (NeoX, Falcon 40B/180B)")
    attention_dropout_rate: Optional[float] = key(0.1, "1.6.0", "attention-probability dropout")
    attention_initializer: Initializer = key(None, "1.6.0", "GPT-J's name of initializer")
    scale_qk_dot_by_d: bool = key(False, "1.9.1", "scores / head width, not its root")
    pos_scaling_type: Literal["linear", "YaRN", "yarn", "longrope"] = key("linear", "2.3.1", "rotary scaling rule")

    def decoder_config(self) -> DecoderConfig:
        """The shared decoder's config of these keys: GPT-J's two names of one value resolved (both given and
        different is an error), the GPT-2 keys GPT-J lacks at their defaults.

        Raises:
            ValueError: naming the key.
        """
        if self.position_embedding_type == "alibi":
            raise ValueError("position_embedding_type: alibi is not supported by the Model Zoo's gptj")
        if self.residual_dropout_rate is not None and self.dropout_rate is not None and \
                self.residual_dropout_rate != self.dropout_rate:
            raise ValueError("residual_dropout_rate: dropout_rate names the same value; give one")
        if self.initializer is not None and self.attention_initializer is not None:
            raise ValueError("attention_initializer: initializer names the same value; give one")
        shared = {f.name: getattr(self, f.name) for f in fields(BaseDecoderConfig)}
        return DecoderConfig(**{
            **shared, "num_relative_attention_buckets": self.num_relative_attention_buckets or 32,
            "dropout_rate": next((v for v in (self.residual_dropout_rate, self.dropout_rate) if v is not None), 0.1),
            "initializer": self.initializer if self.initializer is not None else self.attention_initializer})


def build_parallel(config: ParallelDecoderConfig) -> DecoderLMModel:
    """The builder of ``gptj``, ``gpt-neox`` and ``falcon``. Raises ValueError naming the key."""
    layout = BlockLayout(parallel=True, ffn_norm=config.use_untied_layer_norm, initializer_rules=_gptj_initializers)
    return build(config.decoder_config(), layout)


def _gptj_initializers(specs: dict, default: dict, layers: int, width: Optional[float],
                       filter_mult: Optional[float]) -> tuple[dict, dict, dict, dict, dict]:
    """The default initializer specs by gptj_model.py's rules (lm's are gpt2_model.py's): every default is
    truncated normal(initializer_range), no depth scaling outside muP; ffn and ffn output default to the
    output initializer. muP scales only the defaults: the Model Zoo scales its default dicts in place and drops the scaled copies of
    initializers the params give (their values are used as written)."""
    depth = (2 * layers) ** -0.5 if layers else 1.0

    w = width ** -0.5 if width else 1.0
    out_given = specs["output_layer_initializer"]
    attn = specs["initializer"] or scale_spec(default, w)
    out = out_given or scale_spec(default, w, depth if width else 1.0)
    ffn = specs["ffn_initializer"] or out_given or scale_spec(default, w)
    ffn_out = specs["ffn_output_layer_initializer"] or out_given or \
        scale_spec(default, filter_mult ** -0.5 if filter_mult else 1.0, depth if filter_mult else 1.0)
    return specs["embedding_initializer"] or default, attn, out, ffn, ffn_out
