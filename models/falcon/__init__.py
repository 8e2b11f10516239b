"""falcon: Falcon, the Model Zoo's GPT-J model under this name (parallel blocks, multi-query or
grouped-query attention, one norm (7B) or two (``use_untied_layer_norm``, 40B/180B))."""

from cs_run.models.common.family import PARALLEL_BUILDER, register_decoder_family

register_decoder_family("falcon", hf_converter="cs_run.models.falcon.hf",
                        model=("cs_run.models.falcon.model", "cs_run.models.falcon.model:FalconConfig", PARALLEL_BUILDER))
