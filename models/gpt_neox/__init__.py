"""gpt-neox: GPT-NeoX, the Model Zoo's GPT-J model under this name (``use_untied_layer_norm: true``,
rotate-half partial rotary on the Hugging Face side, permuted by the adapter)."""

from cs_run.models.common.family import PARALLEL_BUILDER, register_decoder_family

register_decoder_family("gpt-neox", hf_converter="cs_run.models.gpt_neox.hf", hf_model_types=("gpt_neox",),
                        model=("cs_run.models.gpt_neox.model", "cs_run.models.gpt_neox.model:GPTNeoXConfig",
                               PARALLEL_BUILDER))
