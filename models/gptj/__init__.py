"""gptj: GPT-J (parallel attention + FFN blocks with one tied norm, interleaved partial rotary)."""

from cs_run.models.common.family import PARALLEL_BUILDER, register_decoder_family

register_decoder_family("gptj", hf_converter="cs_run.models.gptj.hf",
                        model=("cs_run.models.gptj.model", "cs_run.models.gptj.model:GPTJConfig", PARALLEL_BUILDER))
