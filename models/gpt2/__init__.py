"""gpt2: the Model Zoo's GPT-2 (model.name ``gpt2``), the decoder every family here builds on."""

from cs_run.models.common.family import register_decoder_family

register_decoder_family("gpt2", hf_converter="cs_run.models.gpt2.hf")
