"""How a decoder family registers its :class:`~cs_run.registry.ModelSpec`: its name, its config class and
builder (by default the Model Zoo's GPT-2 config, :class:`~cs_run.models.common.config.DecoderConfig`,
built by :func:`cs_run.models.common.lm.build`, as the Model Zoo's family configs are GPT-2's config under
another name), the LM data and its own Hugging Face adapter module when it has one."""

from __future__ import annotations

from typing import Optional

from cs_run.registry import register_model

__all__ = ["register_decoder_family", "LM_DATA_FN", "LM_DATA_PROCESSORS", "DECODER", "PARALLEL_BUILDER"]

LM_DATA_FN = "cs_run.examples.gpt2.data:build_dataloader"
LM_DATA_PROCESSORS = ("GptHDF5DataProcessor", "GptHDF5MapDataProcessor")
DECODER = ("cs_run.models.common.lm", "cs_run.models.common.config:DecoderConfig", "cs_run.models.common.lm:build")
"""(module of the model function ``build_model``, config class, builder) of the sequential-block families."""
PARALLEL_BUILDER = "cs_run.models.common.parallel:build_parallel"
"""The builder of the GPT-J-config families (gptj, gpt-neox, falcon)."""


def register_decoder_family(name: str, hf_converter: Optional[str] = None, hf_model_types: tuple = (),
                            model: tuple = DECODER) -> None:
    """``model``: (module with the ``build_model`` model function, ``module:Class`` config, ``module:function``
    builder); ``hf_model_types``: the HF ``model_type`` values (other than ``name``) whose folders
    ``hf_converter`` reads with ``checkpoint convert --from hf``."""
    module, config_class, builder = model
    register_model(name, f"{module}:build_model", LM_DATA_FN, data_processors=LM_DATA_PROCESSORS,
                   defaults_fn="cs_run.models.common.lm:model_defaults", hf_converter=hf_converter,
                   input_keys=("vocab_size",), hf_model_types=hf_model_types, config_class=config_class,
                   builder=builder)
