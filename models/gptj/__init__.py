"""gptj: GPT-J (parallel attention + FFN blocks with one tied norm, interleaved partial rotary)."""

from cs_run.models.common.family import register_decoder_family

register_decoder_family("gptj", model_fn="cs_run.models.gptj.model:build_model", hf_converter="cs_run.models.gptj.hf")
