"""How a decoder family registers itself: its name over the one configurable LM
(:func:`cs_run.models.common.lm.build_model`, whose defaults are the Model Zoo's for every family, as
the Model Zoo's family configs are GPT-2's config under another name), the LM data processors it reads
(registered by name in ``cs_run.data``), and its own Hugging Face adapter module when it has one."""

from __future__ import annotations

from typing import Optional

from cs_run.registry import register_model

__all__ = ["register_decoder_family", "LM_DATA_PROCESSORS"]

LM_DATA_PROCESSORS = ("GptHDF5DataProcessor", "GptHDF5MapDataProcessor")
"""The data processors every decoder family reads (the first is an input's default)."""


def register_decoder_family(name: str, hf_converter: Optional[str] = None,
                            model_fn: str = "cs_run.models.common.lm:build_model", hf_model_types: tuple = ()) -> None:
    """``hf_model_types``: the HF ``model_type`` values (other than ``name``) whose folders ``hf_converter``
    reads with ``checkpoint convert --from hf``."""
    register_model(name, model_fn, data_processors=LM_DATA_PROCESSORS,
                   defaults_fn="cs_run.models.common.lm:model_defaults", hf_converter=hf_converter,
                   input_keys=("vocab_size",), hf_model_types=hf_model_types)
