"""falcon's config and model function: the Model Zoo's GPT-J config (``models/common/parallel.py``) under
this name, as Release 2.10's ``falcon/model.py`` FalconModelConfig(GPTJModelConfig) is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cs_run.models.common.lm import DecoderLMModel
from cs_run.models.common.parallel import ParallelDecoderConfig, build_parallel

__all__ = ["FalconConfig", "build_model"]


@dataclass(kw_only=True)
class FalconConfig(ParallelDecoderConfig):
    """Falcon: parallel blocks, multi-query or grouped-query attention, one norm (7B) or two
    (``use_untied_layer_norm``, 40B/180B)."""


def build_model(**keys: Any) -> DecoderLMModel:
    """Model function of ``falcon``: the ``model:`` keys as a :class:`FalconConfig`, built."""
    return build_parallel(FalconConfig(**keys))
