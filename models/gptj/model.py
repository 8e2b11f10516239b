"""gptj's config and model function: the Model Zoo's GPT-J config (``models/common/parallel.py``) under
its own name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cs_run.models.common.lm import DecoderLMModel
from cs_run.models.common.parallel import ParallelDecoderConfig, build_parallel

__all__ = ["GPTJConfig", "build_model"]


@dataclass(kw_only=True)
class GPTJConfig(ParallelDecoderConfig):
    """GPT-J: parallel attention + FFN blocks with one tied norm, interleaved partial rotary."""


def build_model(**keys: Any) -> DecoderLMModel:
    """Model function of ``gptj``: the ``model:`` keys as a :class:`GPTJConfig`, built."""
    return build_parallel(GPTJConfig(**keys))
