"""gpt-neox's config and model function: the Model Zoo's GPT-J config (``models/common/parallel.py``) under
this name (its files set ``use_untied_layer_norm: true``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cs_run.models.common.lm import DecoderLMModel
from cs_run.models.common.parallel import ParallelDecoderConfig, build_parallel

__all__ = ["GPTNeoXConfig", "build_model"]


@dataclass(kw_only=True)
class GPTNeoXConfig(ParallelDecoderConfig):
    """GPT-NeoX: parallel blocks with untied norms, rotate-half partial rotary on the Hugging Face side
    (permuted by the adapter)."""


def build_model(**keys: Any) -> DecoderLMModel:
    """Model function of ``gpt-neox``: the ``model:`` keys as a :class:`GPTNeoXConfig`, built."""
    return build_parallel(GPTNeoXConfig(**keys))
